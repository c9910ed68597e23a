"""Orbax checkpoints of the train state in `workdir/checkpoints`: async, keep-N, atomic, resumable.

Also finding a run's checkpoint and reading its parameters alone (for fine-tuning and export). The
original `.npz` layout and fitting parameters to a model are vit_jax/models/loading.py.
"""
import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from vit_jax import paths


def make_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=True,
      # A run killed mid-save leaves a temporary directory; it is never read, and removed at start.
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(os.path.join(paths.absolute(workdir), 'checkpoints'), options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any) -> None:
  manager.save(step, args=ocp.args.StandardSave(state))


def restore(manager: ocp.CheckpointManager, abstract_state: Any, step: Optional[int] = None) -> Any:
  """Restores `step` (default: latest) onto the shardings in `abstract_state`; None if there is none."""
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  return manager.restore(step, args=ocp.args.StandardRestore(abstract_state))


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      abstract_state, shardings)


def find_checkpoint(path: str, step: Optional[int] = None) -> tuple[str, int]:
  """The directory and step of an orbax train-state checkpoint.

  `path` is a step directory (`W/checkpoints/N`, when `step` is None) or a workdir `W`, whose
  checkpoint `step` (default: the latest) is taken. The directory returned is absolute (orbax does
  not read a relative one).
  """
  path = paths.absolute(path)
  name = epath.Path(path).name
  if step is None and name.isdigit() and (epath.Path(path) / 'default').is_dir():
    return path, int(name)
  root = os.path.join(path, 'checkpoints')
  if not epath.Path(root).is_dir():
    raise ValueError(f'{path!r} has no checkpoints/ directory: pass the workdir of a vit_jax run that '
                     'has saved a checkpoint')
  # Finished saves only: one in progress (or killed) lives in a temporary `<step>.orbax-...` directory.
  steps = sorted(int(d.name) for d in epath.Path(root).iterdir() if d.name.isdigit())
  if not steps:
    raise ValueError(f'{root!r} holds no checkpoint yet: train first, or wait for the first save')
  if step is None:
    step = steps[-1]
  elif step not in steps:
    raise ValueError(f'{root!r} has no checkpoint of step {step}: use one of {steps}')
  return os.path.join(root, str(step)), step


def restore_params(checkpoint_dir: str) -> tuple[dict[str, Any], str]:
  """The parameters of a train-state checkpoint as numpy arrays, and which ones they are.

  The Polyak average (`ema_params`) when the run kept one, else the raw `params`. Only that subtree
  is read, onto the host, so any number of devices can read a checkpoint that any mesh wrote.
  """
  checkpointer = ocp.PyTreeCheckpointer()
  tree = checkpointer.metadata(os.path.join(checkpoint_dir, 'default')).item_metadata.tree
  name = 'ema_params' if tree.get('ema_params') is not None else 'params'
  item = {name: tree[name]}
  restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), item)
  restored = checkpointer.restore(
      os.path.join(checkpoint_dir, 'default'),
      args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True))
  return restored[name], name
