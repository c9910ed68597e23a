"""From a config and a workdir to a validated run: every field is checked here, before the workdir is
touched or anything is compiled, and a bad one is a one-line ValueError that names the fix."""

import dataclasses
import fractions
import functools
import math
from types import ModuleType
from typing import Any, Optional, Sequence

from absl import logging
import flax.linen as nn
import jax
import ml_collections
import optax
from jax.sharding import Mesh

from vit_jax import data, evaluators, sharding, tasks
from vit_jax.checkpoints import run_dir, saved_state, warm_start
from vit_jax.data import preprocess
from vit_jax.runtime import hf_hub
from vit_jax.runtime import paths
from vit_jax.train import best_checkpoint, field_checks, flexi, optim, param_groups, wandb_writer
from vit_jax.checkpoints import adapting
from vit_jax.checkpoints import teacher as teacher_lib
from vit_jax.models import fp8, variants

# Parts of a checkpoint that config.init_from's loading keeps instead of replacing or dropping them.
_KEPT_FROM_INIT = ('keep_head', 'keep_pre_logits')


@dataclasses.dataclass(frozen=True)
class Setup:
  """A validated run: everything the state, the step and the loop read."""

  config: ml_collections.ConfigDict
  workdir: str  # Absolute (or a URL such as gs://...).
  info: data.DatasetInfo
  task: ModuleType  # A value of tasks.TASKS.
  model: nn.Module
  mesh: Mesh
  total_steps: int
  evaluators: tuple[evaluators.Evaluator, ...]
  model_config: dict[str, Any]  # The variant's fields with config.model's overrides: resolved once.
  tx: optax.GradientTransformation  # The run's optimizer over total_steps, built once.
  schedule: optax.Schedule  # Its learning rate by step.
  # From config.init_from, fitted to the model (numpy); None: from scratch, or resumed.
  init_params: Any = None
  teacher: Optional[teacher_lib.Teacher] = None  # config.distill's; None: no distillation.
  best: Optional[best_checkpoint.Best] = None  # config.best_checkpoint's; None: none kept.


def total_steps(config: ml_collections.ConfigDict, info: data.DatasetInfo) -> int:
  if config.total_steps is not None and config.num_epochs is not None:
    raise ValueError(
        f'config.total_steps={config.total_steps} and config.num_epochs='
        f'{config.num_epochs} are both set, and a run takes exactly one: clear one, e.g. '
        '--config.num_epochs=None (or --config.total_steps=None)'
    )
  if config.total_steps is None and config.num_epochs is None:
    raise ValueError(
        'Set exactly one of config.total_steps and config.num_epochs, '
        'e.g. --config.total_steps=1000'
    )
  if config.num_epochs is not None and not math.isfinite(config.num_epochs):
    raise ValueError(
        f'config.num_epochs={config.num_epochs} must be a finite number of passes over '
        'the train split, e.g. --config.num_epochs=90'
    )
  if config.total_steps is not None:
    steps = config.total_steps
  else:  # The decimal given: 0.56 epochs of 1400 at batch 16 is 49 steps, not float's 49.000...01.
    steps = math.ceil(
        fractions.Fraction(repr(config.num_epochs)) * info.num_train / config.batch_size
    )
  if steps < 0:
    raise ValueError(f'The run has {steps} steps: raise config.total_steps or config.num_epochs')
  if steps == 0 and not config.init_from:
    raise ValueError(
        'The run has 0 steps, which evaluates the parameters of config.init_from without '
        'training, and config.init_from is unset: set --config.init_from=PATH (a checkpoint, a '
        'workdir, hf-hub:NAME) or raise config.total_steps or config.num_epochs'
    )
  return steps


def absolute_paths(
    config: ml_collections.ConfigDict, fields: Sequence[str] = ('data_dir',)
) -> None:
  """Makes relative paths of the dotted `fields` of `config` absolute (a URL, a hub name and unset
  stay as they are), in place: the run's config.json is read by tools (fewshot, predict, soup's
  "fine-tuned from the same parameters"...) run later from other directories."""
  for field in fields:
    *parents, name = field.split('.')
    node = functools.reduce(lambda node, parent: node[parent], parents, config)
    if node[name] and not hf_hub.is_hub(node[name]):
      node[name] = paths.absolute(node[name])


def _too_few_classes(config: ml_collections.ConfigDict, info: data.DatasetInfo, needed: int) -> str:
  where = (
      f'{config.data_dir}/{config.train_split}/ has one class folder, {info.class_names[0]!r}'
      if config.dataset == 'folder'
      else f'config.label_feature={config.label_feature!r} of {config.dataset!r} has '
      f'{info.num_classes} class'
  )
  fix = (
      'add a folder of images for each class beside it'
      if config.dataset == 'folder'
      else 'train on a label feature with more classes'
  )
  return f'{where}: config.task={config.task!r} needs {needed} or more classes; {fix}'


def check_fields(config: ml_collections.ConfigDict) -> None:
  """The config's fields, each on its own (names, types, ranges): what a run and the planner refuse
  before reading anything."""
  field_checks.check_field_names(config)  # First: the other checks read the fields.
  tasks.get(config.task)
  for each_task in tasks.TASKS.values():  # A typo in another task's fields is still a typo.
    each_task.check(config)
  field_checks.check_numbers(config)
  evaluators.check_values(config)
  preprocess.check_run(config)


def resolve_model(
    config: ml_collections.ConfigDict, resumed: Optional[ml_collections.ConfigDict] = None
) -> dict[str, Any]:
  """The variant's fields with config.model's overrides (filled from a variant='checkpoint' file,
  or from `resumed`, the config of the run this start resumes), checked against the images and
  FlexiViT's patch sizes."""
  if not warm_start.fill_from_resumed_run(config, resumed):
    warm_start.fill_from_checkpoint(config)
    warm_start.fill_mae_targets(config)
  model_config = variants.get_model_config(config.variant, config.model.to_dict())
  family = variants.FAMILIES[variants.family(config.variant)]
  stride = family.input_stride(model_config)
  if config.image_size % stride:
    raise ValueError(
        f'config.image_size={config.image_size} is not divisible by the patch size {stride} (in '
        f'input pixels) of {config.variant}: use a multiple of {stride}, e.g. '
        f'--config.image_size={max(stride, config.image_size // stride * stride)}'
    )
  variants.check_tokens(config.image_size, stride, '--config.image_size')
  flexi.check(config, model_config)
  return model_config


def prepare(config: ml_collections.ConfigDict, workdir: str) -> Setup:
  """Checks the config, data and workdir; raises ValueError with a one-line fix on bad input."""
  check_fields(config)
  absolute_paths(config)
  task = tasks.get(config.task)
  wandb_writer.check(config)  # Before a variant='checkpoint' file is read: it may be downloaded.
  # A resume restores the whole state from its own checkpoint: what it started from (config.init_from,
  # a variant='checkpoint' file) may be gone (a requeue on another node, a hub out of reach) and is not
  # read again; its first start's config says what it was.
  resuming = bool(saved_state.saved_steps(workdir))
  resumed = run_dir.resumed_config(workdir) if resuming else None
  model_config = resolve_model(config, resumed)
  family = variants.FAMILIES[variants.family(config.variant)]
  mesh = sharding.make_mesh(config.mesh)
  sharding.check_model_fits(
      mesh, config.variant, family.tensor_split(model_config) | task.tensor_split(config)
  )
  field_checks.check_batch('batch_size', config.batch_size, mesh, config.accum_steps)
  field_checks.check_batch('eval_batch_size', config.eval_batch_size, mesh)
  shards = data.num_data_shards(config, jax.process_count())
  # Resolved once and stored with the run: its batches depend on it (a resume on other hosts says so).
  config.data_shards = shards
  if config.batch_size % shards:
    # The batch passed check_batch: the multiple that passes both.
    multiple = math.lcm(
        shards, sharding.num_batch_shards(mesh) * config.accum_steps, jax.process_count()
    )
    raise ValueError(
        f'config.batch_size={config.batch_size} does not split into '
        f'config.data_shards={shards} equal parts: use a multiple of {multiple}, e.g. '
        f'--config.batch_size={max(multiple, config.batch_size // multiple * multiple)}'
    )
  info = data.get_info(config)
  if info.num_train < shards:  # A data shard without examples would stop the run at its first step.
    raise ValueError(
        f'config.train_split={config.train_split!r} has {info.num_train} examples, fewer '
        f'than the {shards} data shards (config.data_shards, else one a process): use a '
        'larger --config.train_split or fewer data shards'
    )
  if info.num_classes < task.MIN_CLASSES:
    raise ValueError(_too_few_classes(config, info, task.MIN_CLASSES))
  if info.multi_label and config.loss not in tasks.classification.SIGMOID_LOSSES:
    raise ValueError(
        f'config.label_feature={config.label_feature!r} of dataset {config.dataset!r} is a set '
        f'of classes an image, which config.loss={config.loss!r} cannot score: train on it with '
        '--config.loss=sigmoid_xent (or asl, the asymmetric loss)'
    )
  if info.multi_label and config.distill.teacher:  # Its losses take one class an image.
    raise ValueError(
        f'config.distill.teacher distils one class an image, but config.label_feature='
        f'{config.label_feature!r} is a set of classes an image: unset --config.distill.teacher'
    )
  steps = total_steps(config, info)
  tx, schedule = optim.make_optimizer(config, steps, model_config)
  if steps == 0 and not config.keep_head:
    logging.warning(
        'config.total_steps=0 evaluates config.init_from as it is, with a new head (zeros) for '
        "this dataset's classes: the task's metrics (eval_top1...) are chance; few-shot and k-NN "
        '(--config.fewshot.every_steps=1, --config.knn.every_steps=1) measure its features; '
        '--config.keep_head=True evaluates its own head'
    )
  elif 0 < steps <= config.lr.warmup_steps:
    logging.warning(
        "config.lr.warmup_steps=%d is not below the run's %d steps: the learning rate "
        'never reaches config.lr.base=%g; use fewer warmup steps (e.g. '
        '--config.lr.warmup_steps=%d) or more steps',
        config.lr.warmup_steps,
        steps,
        config.lr.base,
        steps // 10,
    )
  if model_config.get('matmul') == 'fp8' and not fp8.runs_natively(jax.devices()[0]):
    logging.warning(
        "model.matmul='fp8' is emulated on %s: the operands are rounded to FP8, their products "
        'computed in config.dtype=%s, with no speed-up (FP8 tensor cores: NVIDIA GPUs of compute '
        'capability 8.9 and up); --config.model.matmul=default computes them unrounded',
        jax.devices()[0].device_kind,
        config.dtype,
    )
  model = task.make_model(config, model_config, info.num_classes)
  if param_groups.names_parameters(config.optim):  # Tracing the model's init costs start-up time.
    param_groups.check_param_groups(
        config.optim, model_config, adapting.param_shapes(*adapting.kept_model(config, model))
    )
  teacher_lib.pin_step(config, resumed)
  # The teacher, read once (below) for the step and for a teacher evaluator.
  load_teacher = (
      functools.cache(lambda: teacher_lib.load_teacher(config, info.num_classes, info.class_names))
      if config.distill.teacher
      else None
  )
  built = evaluators.make_evaluators(
      evaluators.Context(config, info, task, model, mesh, model_config, load_teacher)
  )
  best = best_checkpoint.resolve(
      config, evaluators.logged_metrics(built, config.polyak_decay is not None), steps
  )
  # Without a checkpoint there is nothing to keep: the flag would do nothing.
  for name in _KEPT_FROM_INIT:
    if config[name] and not config.init_from:
      raise ValueError(
          f'config.{name}=True keeps part of the config.init_from checkpoint, which is unset: '
          f'set --config.init_from=PATH or --config.{name}=False'
      )
  init_params = (
      warm_start.load_init_params(
          config, *adapting.kept_model(config, model), class_names=info.class_names
      )
      if config.init_from and not resuming
      else None
  )
  teacher = load_teacher() if load_teacher else None
  workdir = paths.absolute(workdir)
  paths.check_writable(workdir, config.storage_timeout_s)
  run_dir.check_trainable(workdir)  # Once storage has answered in time.
  # Last of the checks: a Parquet split's copy of the rows this process reads can take hours.
  data.prepare(config, jax.process_index(), jax.process_count(), train=steps > 0)
  # Once read: an error about them names them as given (a relative path, from where).
  absolute_paths(config, ('init_from', 'distill.teacher'))
  return Setup(
      config,
      workdir,
      info,
      task,
      model,
      mesh,
      steps,
      tuple(built),
      model_config,
      tx,
      schedule,
      init_params,
      teacher,
      best,
  )
