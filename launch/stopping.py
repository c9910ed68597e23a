"""How the launchers (local.py, sweep.py) stop the runs they start.

A signal to the launcher (SIGINT: a terminal's Ctrl-C; SIGTERM) reaches its runs as SIGTERM, the
preemption signal a run saves on (and the one JAX's coordination service acts on); a second one
kills them unsaved, for a run that hangs. A launcher killed outright (SIGKILL, the OOM killer) runs
no handler: the kernel sends its runs SIGTERM then (Linux's parent-death signal), so they save and
end rather than run on, orphaned, holding the devices and the workdir.
"""

import os
import signal
import subprocess
import sys
import types

# Run by each child before its command: asks the kernel for SIGTERM at the launcher's death. The
# setting survives the exec. A launcher that died before it asked is the child's parent no more.
_PARENT_DEATH_SIGTERM = """
import ctypes, os, signal, sys
if sys.platform == 'linux':
  ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
  sys.exit(f'error: the launcher (pid {sys.argv[1]}) ended before {sys.argv[2:]} started')
os.execvp(sys.argv[2], sys.argv[2:])
"""


def ended_with_launcher(cmd: list[str]) -> list[str]:
  """`cmd`, run so that it gets SIGTERM if this process dies before it ends. Call it on the thread
  that starts `cmd`: the kernel ties the signal to the thread that forked."""
  return [sys.executable, '-c', _PARENT_DEATH_SIGTERM, str(os.getpid()), *cmd]


class Stopper:
  """A context in which SIGINT and SIGTERM to this process reach `processes` as SIGTERM, the
  second such signal as SIGKILL. An ignored signal (nohup's SIGINT, a job in the background) stays
  ignored, as by vit_jax.main. Its handlers only signal: a signal may come while the main thread
  holds any lock (a console's), so what to print is for after."""

  def __init__(self):
    self.processes: list[subprocess.Popen] = []
    self.signals = 0  # How many it got.
    self._previous = {}

  def __enter__(self) -> 'Stopper':
    # Before the first process starts: the launcher must not die of a signal and leave it running.
    self._previous = {
        signum: signal.signal(signum, self._forward)
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    return self

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)

  def add(self, process: subprocess.Popen) -> None:
    """Tracks `process`, started after the context was entered; it gets what the others got."""
    self.processes.append(process)
    if self.signals:  # While it started.
      process.send_signal(self._stop_signal)

  @property
  def killed(self) -> bool:
    """Whether a second signal killed the processes, unsaved."""
    return self.signals > 1

  @property
  def _stop_signal(self) -> int:
    return signal.SIGKILL if self.killed else signal.SIGTERM

  def _forward(self, signum: int, frame: types.FrameType | None) -> None:
    del signum, frame
    self.signals += 1
    for process in self.processes:
      process.send_signal(self._stop_signal)  # Nothing once it has ended.
