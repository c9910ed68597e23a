"""The training loop: one jitted train step over a device mesh, periodic eval, checkpoints, metrics.

Everything a run depends on is a function of (config, step): the batch of step s is batch s of the data
stream, the dropout key of step s is fold_in(seed, s). A run killed after a checkpoint and started again
therefore continues exactly as if it had never stopped.
"""
import dataclasses
import functools
import json
import math
import time
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from clu import metric_writers, parameter_overview, periodic_actions
from etils import epath
from jax.sharding import Mesh

from configs import common
from configs import models as model_variants
from vit_jax import checkpoint, data, fewshot, optim, paths, sharding
from vit_jax.models import VisionTransformer, vit
from vit_jax.models.mpp import MaskedPatchPredictor, colour_targets

LOSSES = ('softmax_xent', 'sigmoid_xent')
TASKS = ('classification', 'mpp')
DTYPES = ('float32', 'bfloat16', 'float16')


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  ema_params: Any  # Polyak (exponential moving) average of params; None when config.polyak_decay is.


@dataclasses.dataclass(frozen=True)
class Setup:
  """A validated run: everything checked before anything is compiled."""
  config: ml_collections.ConfigDict
  workdir: str
  info: data.DatasetInfo
  model: nn.Module
  mesh: Mesh
  total_steps: int
  init_params: Any = None  # From config.init_from, fitted to the model (numpy); None: from scratch.


def _total_steps(config: ml_collections.ConfigDict, info: data.DatasetInfo) -> int:
  if (config.total_steps is None) == (config.num_epochs is None):
    raise ValueError('Set exactly one of config.total_steps and config.num_epochs, '
                     'e.g. --config.total_steps=1000')
  if config.total_steps is not None:
    steps = config.total_steps
  else:
    steps = math.ceil(config.num_epochs * info.num_train / config.batch_size)
  if steps < 1:
    raise ValueError(f'The run has {steps} steps: raise config.total_steps or config.num_epochs')
  return steps


def _check_batch(name: str, batch_size: int, mesh: Mesh, accum_steps: int = 1) -> None:
  shards = sharding.num_batch_shards(mesh)
  multiple = math.lcm(shards * accum_steps, jax.process_count())
  if batch_size < 1 or batch_size % multiple:
    suggestion = max(multiple, batch_size // multiple * multiple)
    accum = f' x accum_steps={accum_steps}' if accum_steps > 1 else ''
    raise ValueError(
        f'config.{name}={batch_size} is not divisible by the {shards} devices on the batch axes '
        f'{sharding.batch_axes(mesh)}{accum} (and {jax.process_count()} processes): use a multiple '
        f'of {multiple}, e.g. --config.{name}={suggestion}')


def make_model(config: ml_collections.ConfigDict, num_classes: int | None) -> nn.Module:
  """The model a config describes: the ViT classifier (`num_classes=None`: pre-logits features instead
  of logits), or for `config.task='mpp'` the masked-patch-prediction model."""
  kwargs = model_variants.get_model_config(config.variant, config.model.to_dict())
  if config.task == 'mpp':
    if kwargs.pop('representation_size') is not None:
      raise ValueError('config.task=mpp predicts colours from patch tokens and has no pre-logits '
                       'layer: unset config.model.representation_size')
    if kwargs.pop('resnet_layers') is not None:
      raise ValueError('config.task=mpp predicts the colours of image patches and needs a pure ViT, '
                       'not a hybrid: use a ViT-<size>_<patch> variant')
    kwargs.pop('resnet_width_factor')
    return MaskedPatchPredictor(mask_rate=config.mpp.mask_rate, num_bits=config.mpp.num_bits,
                                dtype=jnp.dtype(config.dtype), **kwargs)
  return VisionTransformer(num_classes=num_classes, dtype=jnp.dtype(config.dtype), **kwargs)


def prepare(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Checks the config, data and workdir; raises ValueError with a one-line fix on bad input."""
  if config.task not in TASKS:
    raise ValueError(f'Unknown config.task {config.task!r}: use one of {", ".join(TASKS)}')
  if config.loss not in LOSSES:
    raise ValueError(f'Unknown config.loss {config.loss!r}: use one of {", ".join(LOSSES)}')
  if config.dtype not in DTYPES:
    raise ValueError(f'Unknown config.dtype {config.dtype!r}: use one of {", ".join(DTYPES)}')
  model_kwargs = model_variants.get_model_config(config.variant, config.model.to_dict())
  stride = model_variants.input_stride(model_kwargs)
  if config.image_size % stride:
    raise ValueError(
        f'config.image_size={config.image_size} is not divisible by the patch size {stride} (in '
        f'input pixels) of {config.variant}: use a multiple of {stride}, e.g. '
        f'--config.image_size={max(stride, config.image_size // stride * stride)}')
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_model_fits(mesh, num_heads=model_kwargs['num_heads'], mlp_dim=model_kwargs['mlp_dim'])
  if config.accum_steps < 1:
    raise ValueError(f'config.accum_steps={config.accum_steps} must be at least 1')
  _check_batch('batch_size', config.batch_size, mesh, config.accum_steps)
  _check_batch('eval_batch_size', config.eval_batch_size, mesh)
  shards = data.num_data_shards(config, jax.process_count())
  if config.batch_size % shards:
    raise ValueError(f'config.batch_size={config.batch_size} does not split into '
                     f'config.data_shards={shards} equal parts: use a multiple of {shards}')
  info = data.get_info(config)
  total_steps = _total_steps(config, info)
  optim.make_optimizer(config, total_steps)  # Validates the optimizer and schedule names.
  if config.polyak_decay is not None and not 0.0 <= config.polyak_decay < 1.0:
    raise ValueError(f'config.polyak_decay={config.polyak_decay} must be in [0, 1), e.g. 0.9999 '
                     '(or unset to turn Polyak averaging off)')
  _check_fewshot(config.fewshot, info)
  model = make_model(config, info.num_classes)
  if not config.storage_timeout_s > 0:
    raise ValueError(f'config.storage_timeout_s={config.storage_timeout_s} must be a positive number '
                     'of seconds, e.g. 60')
  init_params = _load_init_params(config, model) if config.init_from else None
  workdir = paths.absolute(workdir)
  paths.check_writable(workdir, config.storage_timeout_s)
  return Setup(config, workdir, info, model, mesh, total_steps, init_params)


def _check_fewshot(fewshot_config: ml_collections.ConfigDict, info: data.DatasetInfo) -> None:
  if fewshot_config.every_steps is None:
    return
  if fewshot_config.every_steps < 1 or fewshot_config.seeds < 1 or fewshot_config.l2_reg <= 0:
    raise ValueError('config.fewshot needs every_steps >= 1, seeds >= 1 and l2_reg > 0 (or unset '
                     'every_steps to turn few-shot evaluation off)')
  if not fewshot_config.shots or min(fewshot_config.shots) < 1:
    raise ValueError(f'config.fewshot.shots={fewshot_config.shots} must be positive numbers of '
                     'images per class, e.g. (1, 5, 10, 25)')
  # Only a necessary condition (per-class counts would mean reading the split): a class with fewer
  # images than the shots stops the run at its first few-shot evaluation.
  if max(fewshot_config.shots) * info.num_classes > info.num_train:
    raise ValueError(f'config.fewshot.shots={fewshot_config.shots}: {max(fewshot_config.shots)} shots '
                     f'of {info.num_classes} classes need more than the {info.num_train} train images')


def _load_init_params(config: ml_collections.ConfigDict, model: nn.Module) -> Any:
  """The parameters of `config.init_from`, with head and position embeddings fitted to `model`."""
  init_from = paths.absolute(config.init_from)
  paths.check_reachable(init_from, config.storage_timeout_s, 'config.init_from')
  loaded, source = checkpoint.load_params(init_from)
  shapes = jax.eval_shape(model.init, jax.random.key(0),
                          jnp.zeros((1, config.image_size, config.image_size, 3)))['params']
  params, notes = checkpoint.adapt_params(
      loaded, shapes, keep_head=config.keep_head, keep_pre_logits=config.keep_pre_logits,
      posemb_method=config.posemb_interpolation)
  logging.info('Initialising from %s: %s', config.init_from, '; '.join([source, *notes]))
  return params


def compute_loss(logits: jax.Array, labels: jax.Array, *, loss: str,
                 label_smoothing: float = 0.0) -> jax.Array:
  """Mean loss over the batch of float32 `logits` [b, classes] against integer `labels` [b]."""
  targets = jax.nn.one_hot(labels, logits.shape[-1])
  if label_smoothing:
    targets = optax.smooth_labels(targets, label_smoothing)
  if loss == 'softmax_xent':
    return optax.softmax_cross_entropy(logits, targets).mean()
  return optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1).mean()


def classification_loss(params: Any, images: jax.Array, labels: jax.Array, key: jax.Array, *,
                        model: nn.Module, loss: str, label_smoothing: float) -> jax.Array:
  logits = model.apply({'params': params}, images, train=True, rngs={'dropout': key})
  return compute_loss(logits, labels, loss=loss, label_smoothing=label_smoothing)


def mpp_loss(params: Any, images: jax.Array, labels: jax.Array, key: jax.Array, *,
             model: nn.Module) -> jax.Array:
  """Cross-entropy of the colour classes of the corrupted patches (labels are not used)."""
  del labels
  dropout_key, mpp_key = jax.random.split(key)
  logits, corrupted = model.apply({'params': params}, images, train=True,
                                  rngs={'dropout': dropout_key, 'mpp': mpp_key})
  targets = colour_targets(images, model.patch_size, model.num_bits)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return jnp.sum(xent * corrupted) / jnp.maximum(jnp.sum(corrupted), 1)


def make_loss_fn(config: ml_collections.ConfigDict, model: nn.Module) -> Callable:
  """loss(params, images, labels, key) -> scalar for the config's task."""
  if config.task == 'mpp':
    return functools.partial(mpp_loss, model=model)
  return functools.partial(classification_loss, model=model, loss=config.loss,
                           label_smoothing=config.label_smoothing)


def train_step(state: TrainState, batch: dict[str, jax.Array], *, loss_fn: Callable,
               tx: optax.GradientTransformation, schedule: optax.Schedule,
               dropout_key: jax.Array, accum_steps: int = 1, micro_batch_sharding: Any = None,
               polyak_decay: float | None = None) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimizer update on a global batch, optionally as `accum_steps` accumulated micro-batches.

  `loss_fn(params, images, labels, key)` is the task's loss (`make_loss_fn`).
  """
  step_key = jax.random.fold_in(dropout_key, state.step)
  grad_fn = jax.value_and_grad(loss_fn)
  if accum_steps == 1:
    loss, grads = grad_fn(state.params, batch['image'], batch['label'], step_key)
  else:
    # Micro-batch i takes rows i, i + k, i + 2k, ...: every device holds a slice of every micro-batch.
    def split(x):
      x = x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]).swapaxes(0, 1)
      return jax.lax.with_sharding_constraint(x, micro_batch_sharding)

    def accumulate(totals, inputs):
      i, images, labels = inputs
      loss, grads = grad_fn(state.params, images, labels, jax.random.fold_in(step_key, i))
      return jax.tree.map(jnp.add, totals, (loss, grads)), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, state.params))
    totals, _ = jax.lax.scan(accumulate, zeros, (jnp.arange(accum_steps), split(batch['image']),
                                                 split(batch['label'])))
    loss, grads = jax.tree.map(lambda x: x / accum_steps, totals)

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema_params = state.ema_params
  if polyak_decay is not None:
    ema_params = optax.incremental_update(params, ema_params, step_size=1.0 - polyak_decay)
  metrics = {'train_loss': loss, 'grad_norm': optax.global_norm(grads),
             'learning_rate': schedule(state.step)}
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                       ema_params=ema_params), metrics


def eval_step(params: Any, batch: dict[str, jax.Array], *,
              model: nn.Module) -> dict[str, jax.Array]:
  """Sums over the real (unmasked) examples of a batch: correct top-1 / top-5, loss, count."""
  logits = model.apply({'params': params}, batch['image'], train=False)
  mask = batch['mask'].astype(jnp.float32)
  labels = batch['label']
  top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {
      'correct': jnp.sum((top5[:, 0] == labels) * mask),
      'correct_top5': jnp.sum(jnp.any(top5 == labels[:, None], axis=-1) * mask),
      'loss_sum': jnp.sum(loss * mask),
      'count': jnp.sum(mask),
  }


def mpp_eval_step(params: Any, batch: dict[str, jax.Array], *,
                  model: nn.Module) -> dict[str, jax.Array]:
  """The same sums over the corrupted patches of real examples: colour-class accuracy and loss."""
  # One fixed corruption pattern, so every evaluation of a run scores the same task.
  logits, corrupted = model.apply({'params': params}, batch['image'], train=False,
                                  rngs={'mpp': jax.random.key(0)})
  targets = colour_targets(batch['image'], model.patch_size, model.num_bits)
  weight = corrupted * batch['mask'][:, None].astype(jnp.float32)
  top5 = jax.lax.top_k(logits, 5)[1]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
  return {
      'correct': jnp.sum((top5[..., 0] == targets) * weight),
      'correct_top5': jnp.sum(jnp.any(top5 == targets[..., None], axis=-1) * weight),
      'loss_sum': jnp.sum(loss * weight),
      'count': jnp.sum(weight),
  }


def evaluate_state(state: TrainState, setup: Setup, eval_fn: Callable) -> dict[str, float]:
  """Eval metrics of the parameters and, with Polyak averaging on, of their average (eval_polyak_*)."""
  metrics = evaluate(state.params, setup, eval_fn)
  if state.ema_params is not None:
    averaged = evaluate(state.ema_params, setup, eval_fn)
    metrics.update({k.replace('eval_', 'eval_polyak_'): v for k, v in averaged.items()})
  return metrics


def evaluate(params: Any, setup: Setup, eval_fn: Callable) -> dict[str, float]:
  """Top-1, top-5 and loss over the whole eval split."""
  local_batch = setup.config.eval_batch_size // jax.process_count()
  totals = None
  for batch in data.eval_iterator(setup.config, local_batch_size=local_batch,
                                  process_index=jax.process_index(),
                                  process_count=jax.process_count()):
    sums = eval_fn(params, sharding.global_batch(batch, setup.mesh))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  totals = jax.device_get(totals)
  count = max(float(totals['count']), 1.0)
  return {'eval_top1': float(totals['correct']) / count,
          'eval_top5': float(totals['correct_top5']) / count,
          'eval_loss': float(totals['loss_sum']) / count}


def _init_state(key: jax.Array, *, model: nn.Module, tx: optax.GradientTransformation,
                image_size: int, polyak: bool) -> TrainState:
  # Initialised as a loop of blocks even when scanned (a scan splits the key its own way): the fast
  # paths change the speed of a run, never its results.
  params = model.clone(scan=False).init({'params': key, 'mpp': key},
                                        jnp.zeros((1, image_size, image_size, 3)), train=False)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    ema_params=params if polyak else None)


def training_layout(tree: Any, model: nn.Module) -> Any:
  """`tree` (a train state or parameters) as the train step keeps it.

  A scanned model trains on its encoder blocks stacked on a layer axis (`vit.stack_blocks`): stacking
  inside the step would put one slice per layer and array into its gradient, and compile slower than
  no scan at all. Checkpoints keep the per-block layout of the original ViT (`vit.unstack_blocks`).
  """
  return vit.stack_blocks(tree, model.num_layers) if model.scan else tree


def create_state(setup: Setup, tx: optax.GradientTransformation,
                 manager: Any) -> tuple[TrainState, Any, Callable[[TrainState], TrainState]]:
  """The train state on the mesh: restored from the latest checkpoint if any, else initialised there.

  Returns the state in its training layout, the shardings of that layout, and the function that brings
  such a state back to the layout checkpoints store.
  """
  init = functools.partial(_init_state, model=setup.model, tx=tx, image_size=setup.config.image_size,
                           polyak=setup.config.polyak_decay is not None)
  to_training = functools.partial(training_layout, model=setup.model)
  key = jax.random.key(setup.config.seed)
  abstract = jax.eval_shape(init, key)
  shardings = sharding.state_shardings(abstract, setup.mesh)
  train_shardings = sharding.state_shardings(jax.eval_shape(to_training, abstract), setup.mesh)
  to_checkpoint = (jax.jit(vit.unstack_blocks, out_shardings=shardings) if setup.model.scan else
                   lambda state: state)
  restored = checkpoint.restore(manager, checkpoint.abstract_with_shardings(abstract, shardings))
  if restored is not None:
    logging.info('Resumed from %s at step %d', manager.directory, int(restored.step))
    return jax.jit(to_training, out_shardings=train_shardings)(restored), train_shardings, to_checkpoint
  state = jax.jit(lambda key: to_training(init(key)), out_shardings=train_shardings)(key)
  if setup.init_params is not None:
    def place_init_params():  # Separate buffers for each use: the train step donates both trees.
      params = jax.device_put(setup.init_params, shardings.params)
      return jax.jit(to_training, out_shardings=train_shardings.params)(params)

    state = state.replace(params=place_init_params(),
                          ema_params=None if state.ema_params is None else place_init_params())
  return state, train_shardings, to_checkpoint


def _mean_metrics(history: list[dict[str, jax.Array]]) -> dict[str, float]:
  history = jax.device_get(history)
  return {k: float(np.mean([metrics[k] for metrics in history])) for k in history[0]}


def write_run_info(setup: Setup) -> None:
  """The config and dataset facts that export and inference need to rebuild the model."""
  if jax.process_index() == 0:
    workdir = epath.Path(setup.workdir)
    (workdir / 'config.json').write_text(setup.config.to_json_best_effort(indent=2))
    (workdir / 'dataset_info.json').write_text(json.dumps(dataclasses.asdict(setup.info), indent=2))


def load_run_info(workdir: str) -> tuple[ml_collections.ConfigDict, data.DatasetInfo]:
  """What `write_run_info` wrote: the run's config and dataset info."""
  files = {name: epath.Path(workdir) / name for name in ('config.json', 'dataset_info.json')}
  for path in files.values():
    if not path.exists():
      raise ValueError(f'{path} is missing: is {workdir!r} the --workdir of a vit_jax run?')
  config = common.get_config()  # Today's defaults under it: runs saved before a field existed load.
  config.update(json.loads(files['config.json'].read_text()))
  info = json.loads(files['dataset_info.json'].read_text())
  return config, data.DatasetInfo(**{**info, 'class_names': tuple(info['class_names'])})


def train_and_evaluate(setup: Setup) -> dict[str, float]:
  """Runs (or resumes) training to `setup.total_steps`; returns the final eval metrics."""
  config, mesh = setup.config, setup.mesh
  write_run_info(setup)
  writer = metric_writers.create_default_writer(setup.workdir, just_logging=jax.process_index() > 0)
  writer.write_hparams({k: str(v) for k, v in config.items()})
  tx, schedule = optim.make_optimizer(config, setup.total_steps)
  manager = checkpoint.make_manager(setup.workdir, config.keep_checkpoints)
  state, state_shardings, to_checkpoint = create_state(setup, tx, manager)
  start_step = int(state.step)
  if start_step == 0:
    parameter_overview.log_parameter_overview(state.params)

  step_fn = jax.jit(
      functools.partial(train_step, loss_fn=make_loss_fn(config, setup.model), tx=tx,
                        schedule=schedule,
                        dropout_key=jax.random.fold_in(jax.random.key(config.seed), 1),
                        accum_steps=config.accum_steps,
                        micro_batch_sharding=sharding.micro_batch_sharding(mesh),
                        polyak_decay=config.polyak_decay),
      in_shardings=(state_shardings, sharding.batch_sharding(mesh)),
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0)
  eval_fn = jax.jit(functools.partial(mpp_eval_step if config.task == 'mpp' else eval_step,
                                      model=setup.model))
  fewshot_fn = None
  if config.fewshot.every_steps:
    backbone = config.copy_and_resolve_references()
    backbone.task = 'classification'  # Pre-logits features of the ViT, also of an MPP run.
    fewshot_fn = fewshot.Evaluator(
        config, make_model(backbone, None), mesh, shots=config.fewshot.shots,
        seeds=config.fewshot.seeds, l2_reg=config.fewshot.l2_reg,
        train_split=config.fewshot.train_split, eval_split=config.fewshot.eval_split)

  train_iter = data.train_iterator(
      config, local_batch_size=config.batch_size // jax.process_count(), start_step=start_step,
      process_index=jax.process_index(), process_count=jax.process_count())
  report_progress = periodic_actions.ReportProgress(
      num_train_steps=setup.total_steps, writer=writer, every_steps=config.log_every_steps,
      every_secs=None)
  logging.info('Training %d steps from step %d: %d train / %d eval examples, %d classes, %d devices',
               setup.total_steps, start_step, setup.info.num_train, setup.info.num_eval,
               setup.info.num_classes, jax.device_count())

  eval_metrics: dict[str, float] = {}
  history, window_start = [], time.time()
  for step in range(start_step + 1, setup.total_steps + 1):
    with jax.profiler.StepTraceAnnotation('train', step_num=step):
      batch = sharding.global_batch(next(train_iter), mesh)
      state, metrics = step_fn(state, batch)
    history.append(metrics)
    report_progress(step)
    last = step == setup.total_steps
    if step % config.log_every_steps == 0 or last:
      summary = _mean_metrics(history)
      elapsed = time.time() - window_start
      summary['images_per_sec'] = len(history) * config.batch_size / elapsed
      writer.write_scalars(step, summary)
      history, window_start = [], time.time()
    if step % config.eval_every_steps == 0 or last:
      with report_progress.timed('eval'):
        eval_metrics = evaluate_state(state, setup, eval_fn)
      writer.write_scalars(step, eval_metrics)
    if fewshot_fn is not None and (step % config.fewshot.every_steps == 0 or last):
      with report_progress.timed('fewshot'):
        writer.write_scalars(step, fewshot_fn(state.params))
    if step % config.checkpoint_every_steps == 0 or last:
      with report_progress.timed('checkpoint'):
        checkpoint.save(manager, step, to_checkpoint(state))
  if not eval_metrics:  # Resumed at the end: report the final model all the same.
    eval_metrics = evaluate_state(state, setup, eval_fn)
    writer.write_scalars(int(state.step), eval_metrics)
  manager.wait_until_finished()
  manager.close()
  writer.flush()
  return eval_metrics
