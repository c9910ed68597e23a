"""`cli.run`: the commands' exit, which skips the interpreter's teardown and keeps everything else."""

import subprocess
import sys

import pytest

import helpers

# A command as the tools are written: `main` under cli.run (or absl's app.run, to compare).
_COMMAND = """
import atexit, sys, threading, time
from absl import app
from vit_jax.runtime import cli


class Teardown:
  def __del__(self):
    print('torn down', flush=True)


KEPT_UNTIL_TEARDOWN = Teardown()


def main(argv):
  atexit.register(lambda: print('atexit ran', flush=True))
  threading.Thread(target=lambda: (time.sleep(0.5), print('thread finished', flush=True))).start()
  sys.stdout.write('buffered ')
  outcome = argv[1]
  if outcome == 'fail':
    cli.fail('one line')
  if outcome == 'message':
    sys.exit('a message')
  if outcome == 'status':
    sys.exit(42)
  if outcome == 'raise':
    raise RuntimeError('boom')
  if outcome == 'raise_with_a_waiting_thread':  # As orbax's thread waits for a save that never starts.
    cli.FAILED_EXIT_GRACE_S = 2.0  # Not the 10 s a run gives its threads: the test's time.
    threading.Thread(target=threading.Event().wait).start()
    raise RuntimeError('boom')


if __name__ == '__main__':
  (cli.run if sys.argv.pop(1) == 'cli' else app.run)(main, flags_parser=cli.flags_parser('x'))
"""


def _run(tmp_path, runner: str, outcome: str) -> subprocess.CompletedProcess:
  script = tmp_path / 'command.py'
  script.write_text(_COMMAND)
  return subprocess.run(
      [sys.executable, str(script), runner, outcome],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )


@pytest.mark.parametrize(
    'outcome,status,stderr',
    [
        ('ok', 0, ''),
        ('fail', 2, 'error: one line'),
        ('message', 1, 'a message'),
        ('status', 42, ''),
    ],
)
def test_a_command_exits_with_its_status_threads_atexit_and_output_but_no_teardown(
    tmp_path, outcome, status, stderr
):
  run = _run(tmp_path, 'cli', outcome)
  assert run.returncode == status, run.stderr
  assert stderr in run.stderr
  # The thread ran to its end and the atexit handler after it; the buffered line was not lost.
  assert run.stdout == 'buffered thread finished\natexit ran\n', run.stdout


def test_absl_alone_tears_the_interpreter_down(tmp_path):
  """What cli.run skips (the reason it exists): absl's exit destroys every module's objects."""
  run = _run(tmp_path, 'absl', 'ok')
  assert run.returncode == 0, run.stderr
  assert run.stdout == 'buffered thread finished\natexit ran\ntorn down\n', run.stdout


def test_an_unexpected_exception_leaves_with_its_traceback(tmp_path):
  run = _run(tmp_path, 'cli', 'raise')
  assert run.returncode == 1
  assert 'RuntimeError: boom' in run.stderr and 'Traceback' in run.stderr, run.stderr
  assert run.stdout == 'buffered thread finished\natexit ran\n', run.stdout


def test_an_unexpected_exception_does_not_wait_for_ever_on_a_thread_that_never_ends(tmp_path):
  # Through the interpreter's exit, this process would wait for the thread until the timeout kills it.
  run = _run(tmp_path, 'cli', 'raise_with_a_waiting_thread')
  assert run.returncode == 1
  assert 'RuntimeError: boom' in run.stderr and 'Traceback' in run.stderr, run.stderr


def test_a_ctrl_c_in_a_garbage_collector_callback_stops_the_run_where_it_takes_sigint(monkeypatch):
  """Python drops an exception raised in a gc callback, printing 'Exception ignored' and its
  traceback: a Ctrl-C that lands there is remembered instead, and stops the command, with its one
  line, where the run takes SIGINT over."""
  import gc  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  import threading  # pylint: disable=g-import-not-at-top

  from vit_jax.runtime import cli  # pylint: disable=g-import-not-at-top
  from vit_jax.train import preemption  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(cli, '_INTERRUPTED', threading.Event())
  dropped = []
  monkeypatch.setattr(sys, 'unraisablehook', dropped.append)

  def callback(phase, info):
    del info
    if phase == 'start':
      cli.interrupt(signal.SIGINT, sys._getframe())  # pylint: disable=protected-access

  gc.callbacks.append(callback)
  try:
    gc.collect()
  finally:
    gc.callbacks.remove(callback)
  assert not dropped  # Nothing raised there, so nothing printed and lost.
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  with pytest.raises(KeyboardInterrupt):
    preemption.PreemptionNotice(manager=None)
  assert {s: signal.getsignal(s) for s in handlers} == handlers  # Nothing taken over.
  with pytest.raises(KeyboardInterrupt):  # Anywhere else, at once, as Python's own handler.
    cli.interrupt(signal.SIGINT, sys._getframe())  # pylint: disable=protected-access
