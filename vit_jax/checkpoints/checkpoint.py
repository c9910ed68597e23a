"""Orbax checkpoints of the train state in `workdir/checkpoints`: async, keep-N, atomic, resumable.

Finding a run's checkpoint and reading what it holds without a train state (for fine-tuning and
export) is vit_jax/checkpoints/saved_state.py. The original `.npz` layout is
vit_jax/checkpoints/npz_files.py, fitting parameters to a model vit_jax/checkpoints/adapting.py.
"""

import logging as python_logging
import os
import re
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from vit_jax.checkpoints import orbax_noise, saved_state
from vit_jax.runtime import paths


def make_manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  if jax.process_count() == 1:
    _write_replicated_arrays_whole()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      create=True,
      enable_async_checkpointing=True,
      # A run killed mid-save leaves a temporary directory; it is never read, and removed at start.
      cleanup_tmp_directories=True,
  )
  return ocp.CheckpointManager(
      os.path.join(paths.absolute(workdir), 'checkpoints'), options=options
  )


_WHOLE_ARRAYS = ocp.type_handlers.ArrayHandler(use_replica_parallel=False)


class _NoOverrideWarning(python_logging.Filter):

  def filter(self, record: python_logging.LogRecord) -> bool:
    return not record.getMessage().startswith('Type handler registry type')


def _write_replicated_arrays_whole() -> None:
  """Orbax's replica-parallel saving (its default off GPU) has each replica of a replicated array
  write a slice of it, so that the hosts of a multi-host run share the writing. In one process every
  slice is written by the same host anyway, and cutting them costs a dispatched (and, the first time,
  compiled) slice per array and device: 2 s of the first save of a small model on 8 CPU devices, 0.4 s
  of every later one, measured. StandardSave takes no handler of its own, so this sets orbax's (without
  the warning orbax logs for an intended override)."""
  if ocp.type_handlers.get_type_handler(jax.Array) is _WHOLE_ARRAYS:
    return
  quiet = _NoOverrideWarning()
  logging.get_absl_logger().addFilter(quiet)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, _WHOLE_ARRAYS, override=True)
  finally:
    logging.get_absl_logger().removeFilter(quiet)


def save(
    manager: ocp.CheckpointManager, step: int, state: Any, metrics: Optional[dict] = None
) -> bool:
  """Starts the async save of `step` (with `metrics`, for a manager that keeps the best by them);
  False if orbax declined it (it skips a step at or before its latest)."""
  return manager.save(step, args=ocp.args.StandardSave(state), metrics=metrics)


class SaveError(RuntimeError):
  """A checkpoint could not be written (disk full, no permission): the run stops there."""


class Saver:
  """Async saves through `manager` that, when one fails, stop the run with one line naming the step
  and the directory. A save's error surfaces when the next save (or `wait`) waits for it, so the step
  in flight is remembered."""

  def __init__(self, manager: ocp.CheckpointManager):
    self._manager, self._in_flight, self._last, self._reported = manager, None, None, False
    self._quiet = orbax_noise.TracebacksAtDebug()
    logging.get_absl_logger().addFilter(self._quiet)

  def save(self, step: int, state: Any, metrics: Optional[dict] = None) -> None:
    self.wait()
    try:
      saved = save(self._manager, step, state, metrics)
    except Exception as e:  # pylint: disable=broad-except  # The file system's errors, of any kind.
      raise self._failed(step, e) from None
    if not saved:  # A run must never end believing a step is saved that is not.
      raise SaveError(
          f'orbax declined to save checkpoint {step} in {self._manager.directory}, which '
          f'holds steps {sorted(self._manager.all_steps())}: move those from {step} on out '
          'of it, then start the run again'
      )
    self._in_flight = self._last = step

  def wait(self) -> None:
    """Waits for the save in flight; raises SaveError if it failed."""
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._failed(self._in_flight, e) from None
    finally:
      self._in_flight = None

  def close(self) -> None:
    """Waits for the save in flight and releases the manager. Orbax's close raises a failed save's
    error again; once it has been reported in one line, that repeat is dropped."""
    try:
      self.wait()
    finally:
      try:
        self._manager.close()
      except Exception as e:  # pylint: disable=broad-except
        if not self._reported:
          raise self._failed(self._last, e) from None
      finally:
        logging.get_absl_logger().removeFilter(self._quiet)

  def _failed(self, step: int | None, error: Exception) -> SaveError:
    self._reported = True
    directory = str(self._manager.directory)
    intact = [s for s in saved_state.steps_in(directory) if _readable(directory, s)]
    return SaveError(
        f'Saving checkpoint {step} in {directory} failed ({_os_reason(error)}): free '
        f'space there or make it writable, then start the run again to resume from the '
        f'last intact checkpoint of {intact or "none"}'
    )


def _os_reason(error: Exception) -> str:
  """The operating system's reason in an error of Python (OSError) or of tensorstore (which names
  the errno in a long message), else the error's first line."""
  match = re.search(r"\[Errno (\d+)\]|os_error_code='(\d+)'", str(error))
  if match:
    code = int(match[1] or match[2])
    return f'{os.strerror(code)}, errno {code}'
  return _first_line(error)


def _readable(directory: str, step: int) -> bool:
  try:
    saved_state.saved_shapes(os.path.join(directory, str(step)))
    return True
  except Exception:  # pylint: disable=broad-except
    return False


def restore(manager: ocp.CheckpointManager, abstract_state: Any) -> Any:
  """The latest readable checkpoint, restored onto the shardings in `abstract_state`; None if there is
  none. One that cannot be read (a file lost or truncated by a storage fault) is reported in one line,
  moved aside (`_move_aside`) and the one before it is used; if none can be read, a ValueError names
  the directory and nothing is moved."""
  orbax_noise.quiet_failed_reads()
  steps = sorted(manager.all_steps(), reverse=True)
  unreadable = []  # (step, reason) of the checkpoints after the one restored.
  for step in steps:
    step_dir = os.path.join(str(manager.directory), str(step))
    try:
      # The tools (export, fine-tuning) read a checkpoint's metadata alone: it must read as well.
      saved_state.saved_shapes(step_dir)
      restored = manager.restore(step, args=ocp.args.StandardRestore(abstract_state))
    except Exception as e:  # pylint: disable=broad-except  # tensorstore and orbax raise many kinds.
      unreadable.append(
          (step, _reason(e).replace(step_dir + os.sep, ''))
      )  # Its files, named within.
      continue
    _set_aside(manager, unreadable, step)
    return restored
  if steps:
    raise ValueError(
        f'none of the checkpoints {sorted(steps)} in {manager.directory} can be read (the '
        f'latest: {unreadable[0][1]}): restore them from a backup, or move them away to '
        'start the run afresh'
    )
  return None


def _set_aside(
    manager: ocp.CheckpointManager, unreadable: list[tuple[int, str]], resumed: int
) -> None:
  """Moves the unreadable checkpoints after `resumed` out of orbax's view: it never saves a step at or
  before its latest one, so the retrained steps would never be written again and every start would
  fall back anew. Process 0 moves them; every process then lists the directory again."""
  if not unreadable:
    return
  if jax.process_index() == 0:
    for step, reason in unreadable:
      logging.warning(
          'Checkpoint %d in %s cannot be read (%s): %s; resuming from checkpoint %d',
          step,
          manager.directory,
          reason,
          _move_aside(manager.directory, step),
          resumed,
      )
  ocp.multihost.sync_global_processes('vit_jax_checkpoint_set_aside')  # The others see the moves.
  manager.reload()


def _move_aside(directory: epath.Path, step: int) -> str:
  """Renames checkpoint `step` to `<step>.unreadable` (or `-2`, `-3`... when taken) beside it, a name
  that orbax neither lists as a step nor removes as a temporary; nothing is deleted. Says what it did.
  """
  target, k = directory / f'{step}.unreadable', 1
  while target.exists():
    k += 1
    target = directory / f'{step}.unreadable-{k}'
  try:
    (directory / str(step)).rename(target)
  except Exception as e:  # pylint: disable=broad-except  # A file system's errors, of any kind.
    return (
        f'it could not be moved aside ({_first_line(e)}), so its step cannot be saved again: move '
        f'{directory / str(step)} away yourself'
    )
  return f'moved it to {target} so that its step is saved again'


def _reason(error: Exception) -> str:
  """Why a checkpoint cannot be read, in one line: the innermost error (orbax wraps tensorstore's in
  one that quotes a bound method), without tensorstore's spec and driver chain."""
  while error.__cause__ is not None:
    error = error.__cause__
  reason = re.split(r' \[(?:tensorstore_spec|source locations)=', _first_line(error, limit=None))[0]
  reason = re.sub(r'Error opening "\w+" driver: ', '', reason)
  return reason if len(reason) <= 300 else reason[:297] + '...'


def _first_line(error: Exception, limit: Optional[int] = 200) -> str:
  return (str(error).strip().splitlines() or [type(error).__name__])[0][:limit]


def abstract_with_shardings(abstract_state: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract_state, shardings
  )
