"""Orbax checkpoints of the train state in `workdir/checkpoints`: async, keep-N, atomic, resumable."""
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


def make_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=True,
      # A run killed mid-save leaves a temporary directory; it is never read, and removed at start.
      cleanup_tmp_directories=True)
  return ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), 'checkpoints'), options=options)


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
