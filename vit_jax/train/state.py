"""The train state on the mesh: initialised there, or restored from the latest checkpoint.

A scanned model trains on its encoder blocks stacked on a layer axis (`scan_layout.stack_blocks`): stacking
inside the step would put one slice per layer and array into its gradient, and compile slower than no
scan at all. Checkpoints keep the per-block layout of the original ViT (`scan_layout.unstack_blocks`).
"""

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import logging
from etils import epath

from vit_jax import sharding
from vit_jax.checkpoints import adapting, checkpoint, label_order, run_dir, saved_state
from vit_jax.models import inits, scan_layout, variants
from vit_jax.train import param_groups
from vit_jax.train import setup as train_setup
from vit_jax.train.setup import Setup


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # The Polyak (exponential moving) average of the params that train, None when config.polyak_decay
  # is: a frozen one is its own average, so `param_groups.trained_part` keeps none of them twice (a
  # low-rank adaptation of ViT-g would otherwise hold 1B floats more for 3M that move);
  # `param_groups.with_trained(ema_params, params)` is the model it averages.
  ema_params: Any


def init_state(
    key: jax.Array,
    *,
    model: nn.Module,
    tx: optax.GradientTransformation,
    image_size: int,
    polyak: bool,
    frozen_labels: Callable[[Any], Any] | None = None,
) -> TrainState:
  """A fresh state in the checkpoint layout (per-block parameters); `frozen_labels`
  (`param_groups.labeller`) of the parameters, for the Polyak average of those that train."""
  params = inits.fresh_params(model, image_size, key)
  return TrainState(
      step=jnp.zeros((), jnp.int32),
      params=params,
      opt_state=tx.init(params),
      ema_params=param_groups.trained_part(params, frozen_labels) if polyak else None,
  )


class ResumeError(ValueError):
  """The workdir holds a run that this config cannot continue."""


def _is_empty(node: Any) -> bool:
  """A node without arrays: None, or an empty named tuple (optax's EmptyState, a frozen parameter's
  MaskedNode), which a checkpoint stores as None."""
  return node is None or (isinstance(node, tuple) and not node)


def _key(entry: Any) -> Any:
  """A path entry as a checkpoint stores its container: a named tuple's field as a dict key."""
  return getattr(entry, 'key', getattr(entry, 'name', getattr(entry, 'idx', entry)))


def _layout(tree: Any) -> dict[tuple[Any, ...], Any]:
  """What a checkpoint's tree must match to be restored into `tree`: the shape at every path, and
  where it has no arrays. Paths, not only shapes: another optimizer chain (gradient clipping added)
  or other frozen parameters of the same shapes put the state's arrays elsewhere."""
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_empty)[0]
  return {
      tuple(map(_key, path)): None if _is_empty(leaf) else tuple(leaf.shape)
      for path, leaf in leaves
  }


def _init_fn(setup: Setup) -> Callable[[jax.Array], TrainState]:
  """key -> the run's fresh state (`init_state` with the setup's model, optimizer and options)."""
  model, image_size = adapting.kept_model(setup.config, setup.model)
  return functools.partial(
      init_state,
      model=model,
      tx=setup.tx,
      image_size=image_size,
      polyak=setup.config.polyak_decay is not None,
      frozen_labels=param_groups.labeller(setup.config.optim, setup.model_config),
  )


def _train_split_changed(setup: Setup, old_info: Any) -> None:
  """A resume whose train split has more or fewer examples than at the run's first start (images
  added or removed): its batches differ from here on, which is said; its length and schedule must
  not, which config.num_epochs would change (ResumeError)."""
  said = (
      f'{setup.workdir} started on a train split of {old_info.num_train} examples, which has '
      f'{setup.info.num_train} now'
  )
  if setup.config.num_epochs is not None:
    first = train_setup.total_steps(setup.config, old_info)
    if first != setup.total_steps:
      raise ResumeError(
          f'{said}: config.num_epochs={setup.config.num_epochs} makes the run '
          f'{setup.total_steps} steps, not {first}, and moves its learning rate schedule: '
          f'restore the data, or resume with --config.total_steps={first} '
          '--config.num_epochs=None'
      )
  logging.warning('%s: its batches from here on are not those it would have read', said)


def _check_fits(setup: Setup, described: str) -> None:
  """The latest checkpoint whose metadata reads must have this config's state shapes."""
  latest = saved_state.latest_saved_shapes(setup.workdir)
  if latest is None:  # None reads: restoring says so, naming the directory.
    return
  step, saved = latest
  wanted = jax.eval_shape(_init_fn(setup), jax.random.key(0))
  saved_layout = [_layout(saved[name]) for name in ('params', 'opt_state', 'ema_params')]
  fits = lambda ema_params: saved_layout == [
      _layout(wanted.params),
      _layout(wanted.opt_state),
      _layout(ema_params),
  ]
  # A run saved before the Polyak average left out the frozen parameters holds an average of every
  # one: restoring it takes those that train.
  if not fits(wanted.ema_params) and not (wanted.ema_params is not None and fits(wanted.params)):
    raise ResumeError(
        f'the checkpoint of step {step} in {setup.workdir} does not fit the model and '
        f'optimizer of this config ({described}): use another --workdir, or set these '
        'fields back'
    )


def check_resumable(setup: Setup) -> list[tuple[str, Any, Any]] | None:
  """A workdir that already holds a run must hold the same classes, the same model function and a
  checkpoint this config's state can be restored from; raises ResumeError naming the changed fields,
  before anything in the workdir is written.

  Returns the changed fields (`run_dir.config_changes`), whose changes the state takes (steps,
  cadences, mesh...) and which are logged; None where no checkpoint was saved yet (a new run, or one
  stopped before its first save): the run starts afresh, and its run info is this config's.
  """
  workdir = epath.Path(setup.workdir)
  has_config = (workdir / 'config.json').exists()
  if not saved_state.saved_steps(setup.workdir):
    if has_config:
      logging.info('%s holds no checkpoint yet: starting the run afresh with this config', workdir)
    return None
  if not has_config:  # Its config lost: the checkpoint's shapes are all there is to check.
    _check_fits(setup, f"and {workdir}/config.json, the run's config, is missing")
    return []
  try:
    old_config, old_info = run_dir.load_run_info(setup.workdir)
  except ValueError as e:  # Its run info damaged.
    raise ResumeError(str(e)) from None
  changes = run_dir.config_changes(old_config, setup.config)
  describe = lambda changes: '; '.join(f'{field} {old!r} -> {new!r}' for field, old, new in changes)
  described = describe(run_dir.changes_to_set_back(changes)) or 'none'  # What a refusal names.
  if old_info.class_names != setup.info.class_names:
    raise ResumeError(
        f'{workdir} holds a run on the {old_info.num_classes} classes of other data '
        f"than this dataset's {setup.info.num_classes} "
        f'({label_order.class_changes(old_info.class_names, setup.info.class_names)}; changed fields: '
        f"{described}): use another --workdir, or the run's data"
    )
  if old_info.num_train != setup.info.num_train:
    _train_split_changed(setup, old_info)
  _check_fits(setup, f'changed fields: {described}')
  # Parameters of the same shapes may compute another function (another activation, position
  # embeddings elsewhere): the tools would rebuild the first start's model around them.
  model_changes = variants.function_changes(
      (old_config.variant, old_config.model.to_dict()),
      (setup.config.variant, setup.config.model.to_dict()),
  )
  if old_config.task != setup.config.task:
    model_changes.insert(0, ('task', old_config.task, setup.config.task))
  # How its logits become probabilities: the tools read it from the first start's config.
  if old_config.loss != setup.config.loss:
    model_changes.append(('loss', old_config.loss, setup.config.loss))
  if model_changes:
    raise ResumeError(
        f'{workdir} holds a run of another model ('
        + '; '.join(f'{field} {old!r} -> {new!r}' for field, old, new in model_changes)
        + f'; changed fields: {described}): use another --workdir, or set these fields '
        'back'
    )
  if changes:
    logging.info('Resuming %s with changed config fields: %s', workdir, describe(changes))
  for field, old, new in changes:
    if field == 'data_shards':
      logging.warning(
          '%s was trained on %d data shards and resumes on %d: its batches from here on are '
          'not those it would have read; --config.data_shards=%d reads them (on a number of '
          'processes that divides it)',
          workdir,
          old,
          new,
          old,
      )
  return changes


def training_layout(tree: Any, model: nn.Module) -> Any:
  """`tree` (a train state or parameters) as the train step keeps it: blocks stacked if scanned."""
  return scan_layout.stack_blocks(tree, model.num_layers) if scan_layout.scanned(model) else tree


def create_state(
    setup: Setup, manager: Any
) -> tuple[TrainState, Any, Callable[[TrainState], TrainState]]:
  """The train state on the mesh: restored from the latest checkpoint if any, else initialised there.

  Returns the state in its training layout, the shardings of that layout, and the function that brings
  such a state back to the layout checkpoints store.
  """
  init = _init_fn(setup)
  to_training = functools.partial(training_layout, model=setup.model)
  key = jax.random.key(setup.config.seed)
  abstract = jax.eval_shape(init, key)
  shardings = sharding.state_shardings(abstract, setup.mesh)
  train_shardings = sharding.state_shardings(jax.eval_shape(to_training, abstract), setup.mesh)
  to_checkpoint = (
      jax.jit(scan_layout.unstack_blocks, out_shardings=shardings)
      if scan_layout.scanned(setup.model)
      else lambda state: state
  )
  try:
    restored = checkpoint.restore(manager, checkpoint.abstract_with_shardings(abstract, shardings))
  except ValueError as e:  # Not one checkpoint readable.
    raise ResumeError(str(e)) from None
  if restored is not None:
    logging.info('Resumed from %s at step %d', manager.directory, int(restored.step))
    return (
        jax.jit(to_training, out_shardings=train_shardings)(restored),
        train_shardings,
        to_checkpoint,
    )
  state = jax.jit(lambda key: to_training(init(key)), out_shardings=train_shardings)(key)
  if setup.init_params is not None:

    def place_init_params():  # Separate buffers for each use: the train step donates both trees.
      params = jax.device_put(setup.init_params, shardings.params)
      return jax.jit(to_training, out_shardings=train_shardings.params)(params)

    frozen_labels = param_groups.labeller(setup.config.optim, setup.model_config)
    state = state.replace(
        params=place_init_params(),
        ema_params=(
            None
            if state.ema_params is None
            else param_groups.trained_part(place_init_params(), frozen_labels)
        ),
    )
  return state, train_shardings, to_checkpoint
