"""launch/local.py's exit: the first process to fail stops the others and gives its status, whichever
process it is."""

import subprocess
import sys
import textwrap
import time

import pytest

import local

# A stand-in for vit_jax.main: each process sleeps its own time, then exits with its own status.
_PROCESS = textwrap.dedent("""
    import sys, time
    process = int(next(a for a in sys.argv if a.startswith('--process_id=')).split('=')[1])
    seconds, status = {plan}[process]
    time.sleep(seconds)
    sys.exit(status)
    """)


@pytest.mark.parametrize(
    'plan, want',
    [
        ([(60, 0), (0, 5)], 5),  # Process 1 fails at once; process 0 would work for a minute.
        ([(3, 3), (0, 5)], 5),  # Both fail: the first to.
        ([(0, 3), (2, 5)], 3),
        ([(0, 75), (1, 75)], 75),  # Both stopped to be requeued.
        ([(0, 0), (1, 75)], 75),
    ],
)
def test_the_first_failure_stops_the_others_and_is_the_status(plan, want, tmp_path, monkeypatch):
  (tmp_path / 'stand_in.py').write_text(_PROCESS.format(plan=plan))
  monkeypatch.setenv('PYTHONPATH', str(tmp_path))
  start = time.time()
  code = local.launch([], num_processes=2, devices_per_process=1, module='stand_in', timeout=120)
  assert code == want
  assert time.time() - start < 30  # Not the minute of process 0.


@pytest.mark.parametrize('flag', ['--num_processes=0', '--devices_per_process=0'])
def test_no_processes_or_devices_is_one_line(flag):
  """0 processes ran nothing and exited 0, as if the run had trained."""
  run = subprocess.run(
      [sys.executable, local.__file__, flag, '--', '--config=configs/demo.py'],
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert run.returncode == 2 and run.stderr == f'error: {flag} must be at least 1\n', run.stderr
