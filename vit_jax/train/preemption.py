"""Stopping a run when the cluster asks: SIGTERM (preemption, maintenance, a scheduler's time limit)
or SIGINT, at a step every host agrees on, so that all of them save that same step."""

import os
import signal
import types
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp

from vit_jax.runtime import cli

# The exit status of a run that stopped to be preempted: launch scripts requeue it (EX_TEMPFAIL).
REQUEUE_STATUS = 75


class Preempted(Exception):
  """The run saved the checkpoint of `step` and stopped; the same command resumes it."""

  def __init__(self, step: int):
    super().__init__(
        f'stopped on request at step {step} after saving its checkpoint: start the same '
        'command again to resume'
    )
    self.step = step


class PreemptionNotice:
  """`notice(step)` is True once the run was asked to stop, at the same step on every host.

  With several processes, JAX's coordination service catches SIGTERM on any host and picks the step
  (orbax's `reached_preemption`, i.e. multihost_utils.reached_preemption_sync_point). It does not
  catch SIGINT (a terminal's Ctrl-C, to every process of the job), so each process passes its SIGINT
  on to that service as a SIGTERM to itself. A single process catches SIGTERM and SIGINT itself.
  Either way a second SIGINT interrupts at once (KeyboardInterrupt), unsaved.
  """

  def __init__(self, manager: ocp.CheckpointManager):
    self._manager = manager
    self._requested = False
    self._interrupted = False
    self._previous: dict[int, Any] = {}
    cli.raise_if_interrupted()  # A Ctrl-C before now is the command's, even one Python lost.
    if jax.process_count() == 1:
      for signum in (signal.SIGTERM, signal.SIGINT):
        self._previous[signum] = signal.signal(signum, self._handle)
    else:  # SIGTERM stays with the handler jax.distributed.initialize() installed.
      self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._sigint_as_sigterm)

  def _handle(self, signum: int, frame: Optional[types.FrameType]) -> None:
    del frame
    if signum == signal.SIGINT:
      self._count_sigint()
    self._requested = True

  def _sigint_as_sigterm(self, signum: int, frame: Optional[types.FrameType]) -> None:
    del signum, frame
    self._count_sigint()
    os.kill(os.getpid(), signal.SIGTERM)

  def _count_sigint(self) -> None:
    # Only a second SIGINT interrupts: a SIGTERM besides a Ctrl-C (launch/local.py passes both on as
    # SIGTERM, and the terminal's SIGINT reaches its processes too) must still save.
    if self._interrupted:
      raise KeyboardInterrupt
    self._interrupted = True

  def __call__(self, step: int) -> bool:
    if jax.process_count() > 1:
      return self._manager.reached_preemption(step)
    return self._requested

  def close(self) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
