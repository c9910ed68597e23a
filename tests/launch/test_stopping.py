"""launch/stopping.py: a launcher's second signal kills its runs; a launcher killed outright
(SIGKILL) leaves none running: they get SIGTERM, a preemption, and save."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import helpers

pytestmark = pytest.mark.skipif(sys.platform != 'linux', reason="Linux's parent-death signal")

# A stand-in for a run: it writes its pid, then the signals it gets, and stops on SIGTERM after a
# save of `save_s` seconds (a hung run: one longer than the test).
_RUN = textwrap.dedent("""
    import os, signal, sys, time
    marker, save_s = sys.argv[1], float(sys.argv[2])
    got = []
    signal.signal(signal.SIGTERM, lambda *_: got.append('TERM'))
    open(marker, 'w').write(f'{os.getpid()}:')
    deadline = time.time() + 60
    while not got and time.time() < deadline:
      time.sleep(0.05)
    time.sleep(save_s)
    open(marker, 'a').write(','.join(got))
    sys.exit(75 if got else 0)
    """)

# Launchers, each running the stand-in once with arguments MARKER SAVE_S.
_LAUNCHERS = {
    'sweep': textwrap.dedent("""
        import sys
        import sweep
        status, signals = sweep.run_one([sys.executable, '-c', sys.argv[1], *sys.argv[2:]])
        print(status, signals)
        """),
    'local': textwrap.dedent("""
        import sys
        import local
        print(local.launch([], num_processes=1, devices_per_process=1, module='stand_in'))
        """),
}


def _launcher(kind: str, tmp_path, save_s: float) -> tuple[subprocess.Popen, str]:
  """Starts the launcher `kind` and waits until its run has started; (it, the run's marker)."""
  (tmp_path / 'stand_in.py').write_text(
      f'import sys\nsys.argv[1:] = {[str(tmp_path / "marker"), str(save_s)]!r}\n' + _RUN
  )
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join(
          [str(tmp_path), os.path.join(helpers.REPO, 'launch'), helpers.REPO]
      ),
  )
  proc = subprocess.Popen(
      [sys.executable, '-c', _LAUNCHERS[kind], _RUN, str(tmp_path / 'marker'), str(save_s)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  marker = tmp_path / 'marker'
  deadline = time.time() + 60
  while not (marker.exists() and marker.read_text()) and time.time() < deadline:
    time.sleep(0.05)
  assert marker.exists(), proc.communicate(timeout=30)
  return proc, str(marker)


def _wait_until_ended(pid: int, timeout: float = 30) -> bool:
  deadline = time.time() + timeout
  while helpers.running(pid) and time.time() < deadline:
    time.sleep(0.05)
  return not helpers.running(pid)


@pytest.mark.parametrize('kind', sorted(_LAUNCHERS))
def test_a_launcher_killed_outright_stops_its_run_as_a_preemption(kind, tmp_path):
  proc, marker = _launcher(kind, tmp_path, save_s=0.5)
  run = int(open(marker).read().split(':')[0])
  try:
    proc.kill()
    proc.wait()
    assert _wait_until_ended(run), 'the run goes on, orphaned'
    # It saved. SIGTERM once a thread of the launcher that ends (the kernel's rule): local.py's
    # console threads send more, which a run takes as the one stop.
    pid, got = open(marker).read().split(':')
    assert pid == str(run) and set(got.split(',')) == {'TERM'}, got
  finally:
    if helpers.running(run):
      os.kill(run, signal.SIGKILL)


@pytest.mark.parametrize('kind', sorted(_LAUNCHERS))
def test_a_second_signal_to_a_launcher_kills_a_hung_run(kind, tmp_path):
  proc, marker = _launcher(kind, tmp_path, save_s=120)
  run = int(open(marker).read().split(':')[0])
  try:
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert helpers.running(run)  # Saving (hung): the first signal waits for it.
    proc.send_signal(signal.SIGTERM)  # Not SIGINT: a test run in the background ignores it.
    out, err = proc.communicate(timeout=60)
    assert _wait_until_ended(run)
  finally:
    if helpers.running(run):
      os.kill(run, signal.SIGKILL)
  if kind == 'sweep':
    assert out.split() == ['-9', '2'], err
  else:
    assert out.split() == ['-9'], err
    assert err == 'error: killed the processes unsaved (a second signal to the launcher)\n'
