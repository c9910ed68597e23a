"""The paper's fine-tuning recipe (Sec. 3.2, 4.1, Appendix B.1.1), shared by the vit_*_finetune configs.

SGD with momentum 0.9, batch 512, cosine decay after a short warmup, no weight decay, global-norm
clipping at 1, a zero-initialised linear head in place of the pretrained head and pre-logits layer,
position embeddings interpolated to the higher resolution. Steps and splits follow the original
vision_transformer fine-tuning configs.
"""

import ml_collections

from vit_jax import defaults

# dataset: (train split, eval split, total steps, resolution)
DATASETS = {
    'cifar10': ('train[:98%]', 'test', 10_000, 384),
    'cifar100': ('train[:98%]', 'test', 10_000, 384),
    'oxford_iiit_pet': ('train[:90%]', 'test', 500, 384),
    'oxford_flowers102': ('train[:90%]', 'test', 500, 384),
    'imagenet2012': ('train[:99%]', 'validation', 20_000, 384),
}


def get_config(
    variant: str, dataset: str, *, imagenet_resolution: int = 384
) -> ml_collections.ConfigDict:
  if dataset not in DATASETS:
    raise ValueError(
        f'Unknown fine-tuning dataset {dataset!r}: use one of {", ".join(DATASETS)} '
        "(the config file's argument, e.g. --config=FILE:cifar10)"
    )
  train_split, eval_split, total_steps, resolution = DATASETS[dataset]
  config = defaults.get_config()
  config.dataset = dataset
  config.train_split, config.eval_split = train_split, eval_split
  config.image_size = imagenet_resolution if dataset == 'imagenet2012' else resolution
  config.pp.crop = 'inception'
  config.pp.flip = True

  config.variant = variant
  # Set it to the pretrained checkpoint: an .npz in the original layout (ViT-B_16.npz) or a workdir.
  config.init_from = 'ViT-B_16.npz' if variant == 'ViT-B_16' else f'{variant}.npz'
  config.dtype = 'bfloat16'

  config.batch_size = 512
  config.eval_batch_size = 512
  config.total_steps = total_steps
  config.optim.name = 'sgd'
  config.optim.momentum = 0.9
  config.optim.weight_decay = 0.0
  config.lr.base = 0.03  # The paper swept {0.001, 0.003, 0.01, 0.03}; see configs/sweeps/.
  config.lr.warmup_steps = 500 if total_steps > 1000 else 50
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0
  if dataset == 'imagenet2012':
    config.polyak_decay = 0.9999  # Table 2's ImageNet numbers used Polyak averaging.

  config.log_every_steps = 50
  config.eval_every_steps = 1000 if total_steps > 1000 else 100
  config.checkpoint_every_steps = 1000 if total_steps > 1000 else 250
  return config
