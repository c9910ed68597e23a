"""Ending a run that stopped making progress (a hung collective, a stuck file system) so that its
scheduler restarts it, instead of it holding the machines in silence."""

import faulthandler
import os
import sys
import threading
import time

# The exit status of a run the watchdog ended (EX_SOFTWARE): launch/slurm.sbatch requeues it.
HUNG_STATUS = 70


class Watchdog:
  """`phase(what)` marks that the run has begun `what` (a train step, an evaluation, a save); when no
  other phase begins within `timeout_s` seconds, every thread's Python stack goes to stderr and the
  process exits with HUNG_STATUS. Each process of a run has its own, so a collective that one process
  never joins ends them all. `timeout_s` 0: off. A context manager: it stops watching on exit.

  Process 0 of a multi-process run hosts jax.distributed's coordination service, whose end makes every
  other process abort (SIGABRT, not HUNG_STATUS: the scheduler would not requeue). So it waits
  `min(timeout_s / 2, 60)` seconds after its stacks before it exits, time for the others' watchdogs,
  whose phases stalled within a few steps of its own, to end them first (and less than the service's
  100 s heartbeat limit, after which process 0 would itself abort for the peers that left)."""

  def __init__(self, timeout_s: float, process_index: int = 0, process_count: int = 1):
    self._timeout_s, self._process_index = timeout_s, process_index
    self._exit_delay_s = (
        min(timeout_s / 2, 60.0) if process_index == 0 and process_count > 1 else 0.0
    )
    self._current = (
        'start-up',
        time.monotonic(),
    )  # One tuple, so the watching thread reads a pair.
    self._closed = threading.Event()
    if timeout_s:
      threading.Thread(target=self._watch, name='watchdog', daemon=True).start()

  def phase(self, what: str) -> None:
    self._current = (what, time.monotonic())

  @property
  def current(self) -> str:
    """The phase the run is in."""
    return self._current[0]

  def __enter__(self) -> 'Watchdog':
    return self

  def __exit__(self, *exc_info) -> None:
    self._closed.set()

  def _watch(self) -> None:
    while not self._closed.wait(min(self._timeout_s / 10, 5.0)):
      what, since = self._current
      if time.monotonic() - since > self._timeout_s and not self._closed.is_set():
        self._end(what)

  def _end(self, what: str) -> None:
    sys.stderr.write(
        f'Watchdog: process {self._process_index} made no progress for {self._timeout_s:g} s in '
        f'{what} (config.hang_timeout_s): the stacks of its threads follow, then it exits with status '
        f'{HUNG_STATUS} for the scheduler to restart the run from its last checkpoint\n'
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    sys.stderr.flush()
    time.sleep(self._exit_delay_s)
    os._exit(HUNG_STATUS)  # pylint: disable=protected-access  # The main thread is the one stuck.
