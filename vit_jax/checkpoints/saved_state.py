"""What a run has saved, read without a train state: its checkpoint (a step directory, or a
workdir's latest or given step), the steps saved, a checkpoint's tree of shapes (metadata only) and
its parameters alone (for fine-tuning, export and the tools).

Writing and resuming the train state is vit_jax/checkpoints/checkpoint.py; the original `.npz`
layout is vit_jax/checkpoints/npz_files.py.
"""

import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.checkpoints import orbax_noise
from vit_jax.runtime import paths

# A workdir's directory of its best parameters by an evaluation metric (config.best_checkpoint).
BEST = 'best'
REPLACED = '.replaced'  # A best/<step> moved aside while a new best is saved.


def find_checkpoint(path: str, step: Optional[int | str] = None) -> tuple[str, int]:
  """The directory and step of an orbax train-state checkpoint.

  `path` is a step directory (`W/checkpoints/N` or `W/best/N`, when `step` is None) or a workdir
  `W`, whose checkpoint `step` is taken: a number (or its digits), 'best' (the run's best parameters,
  config.best_checkpoint) or None (the latest). The directory returned is absolute (orbax does not
  read a relative one).
  """
  path = paths.absolute(path)
  if step is None and is_step_dir(path):
    return path, int(epath.Path(path).name)
  if step == BEST:
    return _best(path)
  if isinstance(step, str):
    if not step.isdigit():
      raise ValueError(f'--step={step}: pass a checkpoint step (a number) or {BEST}')
    step = int(step)
  root = os.path.join(path, 'checkpoints')
  if not epath.Path(root).is_dir():
    raise ValueError(
        f'{path!r} has no checkpoints/ directory: pass the workdir of a vit_jax run that '
        'has saved a checkpoint'
    )
  steps = saved_steps(path)
  if not steps:
    raise ValueError(f'{root!r} holds no checkpoint yet: train first, or wait for the first save')
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(f'{root!r} has no checkpoint of step {step}: use one of {steps}')
  return os.path.join(root, str(step)), step


def is_step_dir(path: str) -> bool:
  """Whether `path` is a checkpoint's own directory (W/checkpoints/N, W/best/N) rather than a run's."""
  return epath.Path(path).name.isdigit() and (epath.Path(path) / 'default').is_dir()


def workdir_of(checkpoint_dir: str) -> str:
  """The run a checkpoint directory of `find_checkpoint` belongs to (W of W/checkpoints/N)."""
  return os.path.dirname(os.path.dirname(checkpoint_dir))


def _best(workdir: str) -> tuple[str, int]:
  """The directory and step of a workdir's best parameters: the latest step of its best/ directory
  (a run saves a step there only when it beats every earlier one; a killed run may leave the one it
  beat beside it)."""
  root = epath.Path(workdir) / BEST
  steps = steps_in(root)
  # A run killed while it saved a best at or before the step of the one it beat left that one here
  # (best_checkpoint.Keeper); its next start puts it back.
  replaced = sorted(root.glob(f'*{REPLACED}*')) if not steps and root.is_dir() else []
  if replaced:
    return str(replaced[-1]), int(replaced[-1].name.split('.')[0])
  if not steps:
    raise ValueError(
        f'{workdir!r} holds no best parameters ({root} is empty or missing): the run keeps them '
        'with --config.best_checkpoint.metric=METRIC (e.g. eval_top1), once it has evaluated'
    )
  return str(root / str(steps[-1])), steps[-1]


def steps_in(directory: str | epath.Path) -> list[int]:
  """The steps of the finished saves in a checkpoint directory (W/checkpoints, W/best), in order, as
  orbax decides it: a save in progress or killed lives in a temporary `<step>.orbax-...` directory on
  a local disk, and in its final `<step>` directory without a `commit_success.txt` on cloud storage
  (which cannot rename). A directory that does not exist has none."""
  root = epath.Path(directory)
  return sorted(ocp.utils.checkpoint_steps(root)) if root.is_dir() else []


def saved_steps(workdir: str) -> list[int]:
  """`steps_in` the train-state checkpoints of `workdir`."""
  return steps_in(epath.Path(workdir) / 'checkpoints')


def latest_saved_shapes(workdir: str) -> Optional[tuple[int, dict[str, Any]]]:
  """The step and state tree (`jax.ShapeDtypeStruct`s) of the latest checkpoint of `workdir` whose
  metadata reads (only metadata is read), as `restore` would choose it; None if there is none."""
  for step in reversed(saved_steps(workdir)):
    try:
      return step, saved_shapes(os.path.join(paths.absolute(workdir), 'checkpoints', str(step)))
    except Exception:  # pylint: disable=broad-except  # restore reports it and takes the one before.
      continue
  return None


def _metadata_tree(checkpoint_dir: str) -> dict[str, Any]:
  """The train state's tree of array metadata in a checkpoint; no array is read. Read by the handler
  of its `default` item: a checkpointer would also look there for the step's metadata (which is one
  level up), warn that it is missing, and return None for a tree that cannot be read."""
  orbax_noise.quiet_failed_reads()
  return ocp.PyTreeCheckpointHandler().metadata(epath.Path(checkpoint_dir) / 'default').tree


def saved_shapes(checkpoint_dir: str) -> dict[str, Any]:
  """The train state's tree in a checkpoint as `jax.ShapeDtypeStruct`s (only the metadata is read)."""
  tree = _metadata_tree(checkpoint_dir)
  return jax.tree.map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def restore_params(checkpoint_dir: str) -> tuple[dict[str, Any], str]:
  """The parameters of a train-state (or best) checkpoint as numpy arrays, and which ones they are.

  The Polyak average (`ema_params`) when the run kept one, with the raw `params` of the frozen
  parameters it leaves out (train/state.py), else the raw `params`. Only those arrays are read, onto
  the host, so any number of devices can read a checkpoint that any mesh wrote. One that cannot be
  read (damaged, cut short) is a one-line ValueError naming the others.
  """
  try:
    return _restore_params(checkpoint_dir)
  except Exception as e:  # pylint: disable=broad-except  # orbax's and tensorstore's, of any kind.
    root = epath.Path(checkpoint_dir).parent
    others = [s for s in steps_in(root) if str(s) != epath.Path(checkpoint_dir).name]
    reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    raise ValueError(
        f'checkpoint {checkpoint_dir} cannot be read ({reason}): read another of {root} '
        f'({others or "none"}: --step=N, or {root}/N), or restore it from a backup'
    ) from None


def _restore_params(checkpoint_dir: str) -> tuple[dict[str, Any], str]:
  tree = _metadata_tree(checkpoint_dir)
  if tree.get('ema_params') is None:
    return _restore(checkpoint_dir, {'params': tree['params']})['params'], 'params'
  # A best checkpoint (config.best_checkpoint) holds the whole average, no `params`.
  left_out = _left_out(tree['ema_params'], tree.get('params', {}))
  restored = _restore(
      checkpoint_dir,
      {'ema_params': tree['ema_params'], **({'params': left_out} if left_out else {})},
  )
  return _overlay(restored['ema_params'], restored.get('params')), 'ema_params'


def _restore(checkpoint_dir: str, item: dict[str, Any]) -> dict[str, Any]:
  """The arrays of `item` (a part of the checkpoint's metadata tree) as numpy arrays."""
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  return ocp.PyTreeCheckpointer().restore(
      os.path.join(checkpoint_dir, 'default'),
      args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True),
  )


def _left_out(average: Any, params: dict[str, Any]) -> dict[str, Any]:
  """The part of `params` (nested dicts) where `average` holds None (a frozen parameter's place)."""
  part = {}
  for key, value in params.items():
    kept = average.get(key) if isinstance(average, dict) else None
    if kept is None:
      part[key] = value
    elif isinstance(value, dict) and (sub := _left_out(kept, value)):
      part[key] = sub
  return part


def _overlay(average: Any, left_out: Any) -> Any:
  """`average` with its None places filled from `left_out` (`_left_out`'s part, restored)."""
  if not isinstance(average, dict):
    return left_out if average is None else average
  return {key: _overlay(value, (left_out or {}).get(key)) for key, value in average.items()}
