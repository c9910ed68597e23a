"""What a run does on the console when it is signalled: Ctrl-C (SIGINT to the terminal's process
group) or SIGTERM, to one process, to a multi-process run, or to launch/local.py."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import helpers
from vit_jax.checkpoints import saved_state
from vit_jax.train import preemption

pytestmark = pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads processes from /proc')


@contextlib.contextmanager
def _children_inherit_sigint(disposition):
  """SIGINT at `disposition` in the processes started inside, set here around their start: a
  `preexec_fn` would set it in the child, forking this multithreaded process (JAX's threads), which
  can deadlock the child (Python 3.12 warns of it)."""
  previous = signal.signal(signal.SIGINT, disposition)
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, previous)


def _children(pid: int) -> list[int]:
  with open(f'/proc/{pid}/task/{pid}/children') as f:
    return [int(child) for child in f.read().split()]


def _launcher(workdir: str, data_dir: str, log) -> subprocess.Popen:
  """launch/local.py running a long run as two processes of 4 CPU devices, as its own process group
  (a terminal's job), its processes' output to the file `log` (a pipe would stay open as long as
  any of them runs)."""
  args = helpers.main_args('configs/demo.py', workdir, {**helpers.LONG, 'data_dir': data_dir})[3:]
  return subprocess.Popen(
      [
          sys.executable,
          os.path.join(helpers.REPO, 'launch', 'local.py'),
          '--num_processes=2',
          '--devices_per_process=4',
          '--',
          *args,
      ],
      cwd=helpers.REPO,
      stdout=log,
      stderr=log,
      start_new_session=True,
  )


def _stop_launched(workdir: str, data_dir: str, tmp_path, signal_it) -> tuple[int, str, list[int]]:
  """Starts the launcher, signals it with `signal_it(launcher)` once the step-4 checkpoint exists
  and waits for it. Returns its status, its processes' output and those of them that it left running
  (then killed)."""
  with open(tmp_path / 'log', 'w') as log:
    proc = _launcher(workdir, data_dir, log)
  children = []
  try:
    helpers.wait_for_checkpoint(workdir, [proc])
    children = _children(proc.pid)
    signal_it(proc)
    proc.wait(timeout=300)
  finally:
    if proc.poll() is None:  # The test failed: its processes go with it.
      children = children or _children(proc.pid)
      proc.kill()
      proc.wait()
    orphans = [child for child in children if helpers.running(child)]
    for child in orphans:
      os.kill(child, signal.SIGKILL)
  assert len(children) == 2
  return proc.returncode, (tmp_path / 'log').read_text(), orphans


def _assert_both_saved_the_same_step(workdir: str, output: str, messages: int = 1) -> None:
  """`messages`: how many of the processes' 'stopped on request' lines the output shows (the
  launcher shows process 0's, and another's only where it differs: a different step)."""
  steps = [
      int(step) for step in re.findall(r'stopped on request at step (\d+) after saving', output)
  ]
  assert len(steps) == messages and len(set(steps)) == 1 and steps[0] > 4, output[-3000:]
  assert saved_state.saved_steps(workdir)[-1] == steps[0]
  assert 'Traceback' not in output and 'KeyboardInterrupt' not in output, output[-3000:]


@pytest.mark.slow
def test_ctrl_c_to_the_processes_of_a_multi_process_run_saves_the_same_step_on_both(
    tmp_path, data_dir
):
  """JAX's coordination service acts on SIGTERM only: each process passes its Ctrl-C on to it."""
  workdir = str(tmp_path / 'run')
  args = helpers.main_args('configs/demo.py', workdir, {**helpers.LONG, 'data_dir': data_dir})
  procs = helpers.two_processes(args)
  try:
    helpers.wait_for_checkpoint(workdir, procs)
    for p in procs:  # As a terminal's Ctrl-C: every process of the run hears it.
      p.send_signal(signal.SIGINT)
    outputs = [p.communicate(timeout=300)[1] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [preemption.REQUEUE_STATUS] * 2, outputs[0][-3000:]
  _assert_both_saved_the_same_step(workdir, outputs[0] + outputs[1], messages=2)


@pytest.mark.slow
def test_ctrl_c_to_the_launcher_and_its_processes_saves_the_same_step_and_exits_75(
    tmp_path, data_dir
):
  """A terminal's Ctrl-C reaches the launcher and its processes: all of them end, no traceback, the
  step both processes agreed on is saved, and the launcher exits with their status."""
  workdir = str(tmp_path / 'run')
  status, output, orphans = _stop_launched(
      workdir, data_dir, tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGINT)
  )
  assert status == preemption.REQUEUE_STATUS and not orphans, output[-3000:]
  _assert_both_saved_the_same_step(workdir, output)


@pytest.mark.slow
def test_sigterm_to_the_launcher_alone_stops_its_processes_and_exits_with_their_status(
    tmp_path, data_dir
):
  """The launcher passes the signal on and waits: its processes save and end, none is orphaned."""
  workdir = str(tmp_path / 'run')
  status, output, orphans = _stop_launched(
      workdir, data_dir, tmp_path, lambda proc: proc.send_signal(signal.SIGTERM)
  )
  assert not orphans, output[-3000:]
  assert status == preemption.REQUEUE_STATUS, output[-3000:]
  _assert_both_saved_the_same_step(workdir, output)


@pytest.mark.slow
def test_sigkill_to_the_launcher_stops_its_processes_which_save(tmp_path, data_dir):
  """No handler runs in a launcher killed outright: the kernel's SIGTERM at its death
  (launch/stopping.py) stops its processes as a preemption, though their console is gone."""
  workdir = str(tmp_path / 'run')
  with open(tmp_path / 'log', 'w') as log:
    proc = _launcher(workdir, data_dir, log)
  children = []
  try:
    helpers.wait_for_checkpoint(workdir, [proc])
    children = _children(proc.pid)
    proc.kill()
    proc.wait()
    saved_before = saved_state.saved_steps(workdir)
    deadline = time.time() + 300
    while any(helpers.running(child) for child in children) and time.time() < deadline:
      time.sleep(0.2)
    orphans = [child for child in children if helpers.running(child)]
  finally:
    if proc.poll() is None:
      proc.kill()
    for child in children or _children(proc.pid):
      if helpers.running(child):
        os.kill(child, signal.SIGKILL)
  assert len(children) == 2 and not orphans  # Without the signal they would train on, orphaned.
  assert saved_state.saved_steps(workdir)[-1] > saved_before[-1]


def test_ctrl_c_before_the_first_step_is_one_line_and_status_130(tmp_path, data_dir):
  workdir = str(tmp_path / 'run')
  args = helpers.main_args('configs/demo.py', workdir, {**helpers.LONG, 'data_dir': data_dir})
  args.append('--verbosity=1')  # Its first line, the malloc's, is the mark of start-up.
  # As a terminal starts it: SIGINT at its default. A process inherits an ignored SIGINT (as
  # pytest-xdist's workers have it), and Python then leaves it ignored until the run's own handler.
  with _children_inherit_sigint(signal.SIG_DFL):
    proc = subprocess.Popen(
        args,
        cwd=helpers.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
  try:
    lines = []
    for line in proc.stderr:  # Its first line of its own, long before the first step.
      lines.append(line)
      if 'malloc:' in line:
        break
    os.killpg(proc.pid, signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
  finally:
    proc.kill()
  stderr = ''.join(lines) + stderr
  assert proc.returncode == 130, stderr[-3000:]
  assert 'Traceback' not in stderr and 'KeyboardInterrupt' not in stderr, stderr[-3000:]
  assert stderr.splitlines()[-1].startswith('error: interrupted'), stderr[-3000:]
  assert not saved_state.saved_steps(workdir)


# SIGINT to itself as soon as start-up is done, before the command's imports.
_INTERRUPTED_WHILE_STARTING = """
import os, signal, time
from vit_jax.runtime import startup
startup.prepare_process()
os.kill(os.getpid(), signal.SIGINT)
time.sleep(1)  # Ignored, the signal was handled by now: it is sent synchronously.
print('not interrupted')
"""


def test_sigterm_while_a_run_starts_is_one_line_and_status_75_for_a_requeue():
  """A preemption before the train steps take SIGTERM over (train/preemption.py): not the default
  death (143), which launch/slurm.sbatch would not requeue."""
  script = _INTERRUPTED_WHILE_STARTING.replace(
      'startup.prepare_process()', 'startup.prepare_process()\nstartup.requeue_on_sigterm()'
  ).replace('signal.SIGINT', 'signal.SIGTERM')
  run = subprocess.run(
      [sys.executable, '-c', script],
      cwd=helpers.REPO,
      env=dict(os.environ, VIT_JAX_ALLOCATOR='system'),
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert (run.returncode, run.stdout) == (75, ''), run.stderr
  assert run.stderr == (
      'error: terminated outside the train steps (SIGTERM): nothing new was saved; the same '
      'command resumes from the last checkpoint, if there is one\n'
  )


@pytest.mark.parametrize('inherited', [signal.SIG_DFL, signal.SIG_IGN])
def test_ctrl_c_while_a_command_imports_is_one_line_unless_sigint_is_ignored(inherited):
  with _children_inherit_sigint(inherited):
    proc = subprocess.Popen(
        [sys.executable, '-c', _INTERRUPTED_WHILE_STARTING],
        cwd=helpers.REPO,
        env=dict(os.environ, VIT_JAX_ALLOCATOR='system'),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
  try:
    stdout, stderr = proc.communicate(timeout=60)
  finally:
    proc.kill()
  run = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
  if inherited == signal.SIG_DFL:
    assert (run.returncode, run.stdout) == (130, ''), run.stderr
    assert run.stderr == 'error: interrupted while starting: nothing was done\n'
  else:  # nohup's, a background job's: the command runs on.
    assert (run.returncode, run.stdout, run.stderr) == (0, 'not interrupted\n', ''), run.stderr
