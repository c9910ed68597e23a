"""Stopping a run when the cluster asks: SIGTERM (preemption, maintenance, a scheduler's time limit)
or SIGINT, at a step every host agrees on, so that all of them save that same step."""
import signal
import types
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

# The exit status of a run that stopped to be preempted: launch scripts requeue it (EX_TEMPFAIL).
REQUEUE_STATUS = 75


class Preempted(Exception):
  """The run saved the checkpoint of `step` and stopped; the same command resumes it."""

  def __init__(self, step: int):
    super().__init__(f'stopped on request at step {step} after saving its checkpoint: start the same '
                     'command again to resume')
    self.step = step


class PreemptionNotice:
  """`notice(step)` is True once the run was asked to stop, at the same step on every host.

  With several processes, JAX's coordination service catches SIGTERM on any host and picks the step
  (orbax's `reached_preemption`, i.e. multihost_utils.reached_preemption_sync_point). A single
  process catches SIGTERM and SIGINT itself; a second SIGINT interrupts at once.
  """

  def __init__(self, manager: ocp.CheckpointManager):
    self._manager = manager
    self._requested = False
    self._previous: dict[int, Any] = {}
    if jax.process_count() == 1:
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)

  def _handle(self, signum: int, frame: Optional[types.FrameType]) -> None:
    del frame
    if self._requested and signum == signal.SIGINT:
      raise KeyboardInterrupt
    self._requested = True

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      return self._manager.reached_preemption(step)
    return self._requested

  def close(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
