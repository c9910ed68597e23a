"""Tasks: what a run trains the ViT to do. One module each, with the same functions:

  check(config)                      raises a one-line ValueError for a bad task config;
  make_model(config, model_config, num_classes)
                                     the model the task trains, from the variant's resolved fields
                                     (`variants.get_model_config`, resolved once per entry point);
  features_model(config, model_config)
                                     the backbone returning pre-logits features (few-shot, pictures);
  make_loss(config, model, teacher)  loss(params, images, labels, key[, teacher_params]) -> scalar,
                                     for the train step (teacher: config.distill's model, or None);
  mix(config, num_classes)           None, or (images, labels, key, step) -> (images, labels): the
                                     train step's transform of the global batch (Mixup, CutMix);
  tensor_split(config)               what tensor parallelism splits in the task's own layers beyond
                                     the variant's ({name: size}: sharding.check_model_fits);
  make_eval_step(config, model)      eval_step(params, batch) -> sums of correct, correct_top5,
                                     loss_sum and count over a batch;
  MIN_CLASSES                        the fewest classes of config.label_feature it trains on;
  METRICS                            the means its eval step's sums give (evaluators/split.py).

Adding a task is one module and one entry in TASKS.
"""

from types import ModuleType

from vit_jax.tasks import classification, mae, mpp

TASKS: dict[str, ModuleType] = {'classification': classification, 'mpp': mpp, 'mae': mae}


def get(name: str) -> ModuleType:
  if name not in TASKS:
    raise ValueError(f'Unknown config.task {name!r}: use one of {", ".join(TASKS)}')
  return TASKS[name]
