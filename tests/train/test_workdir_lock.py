"""One run at a time in a workdir (vit_jax/train/workdir_lock.py)."""

import os
import signal
import socket
import subprocess
import sys

import pytest

import helpers
from vit_jax.runtime import workdir_files
from vit_jax.train import workdir_lock

_HOLD = (
    'import sys, time\n'
    'from vit_jax.train import workdir_lock\n'
    'with workdir_lock.held(sys.argv[1]):\n'
    "  print('held', flush=True)\n"
    '  time.sleep(600)\n'
)


def _holder(workdir) -> subprocess.Popen:
  """Another process that holds `workdir`'s lock until it is killed."""
  holder = subprocess.Popen(
      [sys.executable, '-c', _HOLD, str(workdir)],
      cwd=helpers.REPO,
      stdout=subprocess.PIPE,
      text=True,
  )
  assert holder.stdout.readline() == 'held\n'
  return holder


def test_a_held_workdir_is_refused_naming_the_holder_until_it_is_killed(tmp_path):
  holder = _holder(tmp_path)
  try:
    with pytest.raises(
        workdir_lock.InUse,
        match=rf'^--workdir={tmp_path} is in use by another run \(process {holder.pid} on '
        rf'{socket.gethostname()}, since .*\): wait for it to end or stop it, or pass another '
        '--workdir$',
    ):
      with workdir_lock.held(str(tmp_path)):
        pass
  finally:
    holder.send_signal(signal.SIGKILL)  # No clean-up: the kernel drops the lock.
    holder.wait()
  for _ in range(2):  # Taken again after it is let go, by the same process too.
    with workdir_lock.held(str(tmp_path)):
      assert open(tmp_path / workdir_files.LOCK).read().startswith(f'process {os.getpid()} on ')
  with workdir_lock.held('gs://no-such-bucket/run'):  # No locks on cloud storage: nothing to take.
    pass


def test_a_run_started_again_in_a_workdir_in_use_is_one_line_and_writes_nothing(
    trained_tiny_run, tmp_path, data_dir
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  holder = _holder(workdir)
  try:
    before = helpers.files_of(workdir)
    holder_line = open(os.path.join(workdir, workdir_files.LOCK)).read().strip()
    run = helpers.run_main(
        'configs/demo.py', workdir, {**helpers.TINY, 'data_dir': data_dir}, timeout=300
    )
    assert helpers.files_of(workdir) == before
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  assert run.returncode == 2, run.stderr[-3000:]
  assert run.stderr.strip().splitlines() == [  # The one line, as every refusal before a run.
      f'error: --workdir={workdir} is in use by another run '
      f'({holder_line}): wait for it to end or stop it, or pass '
      'another --workdir'
  ]
