"""The cluster path on a real scheduler: launch/slurm.sbatch and launch/sweep.py --slurm through a
single-node SLURM (tests/slurm_cluster.py), against the local multi-process launcher.

Needs Debian's `slurm-wlm` and `munge` packages (`.ci/run` installs them); skipped without them.
"""

import os
import re
import sys
import time

import jax
import numpy as np
import pytest

import helpers
import slurm_cluster
from vit_jax.checkpoints import run_dir, saved_state
import local

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group('slurm'),  # One cluster: its tests run in one worker.
    pytest.mark.skipif(
        bool(slurm_cluster.missing_programs()),
        reason=f'SLURM is not installed ({", ".join(slurm_cluster.missing_programs())} '
        'missing): apt-get install slurm-wlm munge',
    ),
]

# Two tasks of two CPU devices each; long enough to be preempted after its first checkpoint.
RUN = {
    **helpers.TINY,
    'total_steps': 160,
    'checkpoint_every_steps': 20,
    'log_every_steps': 20,
    'eval_every_steps': 160,
}
JOB = ['--nodes=1', '--ntasks-per-node=2', '--gpus-per-node=0', '--cpus-per-task=1']
DEVICES_PER_TASK = 2


@pytest.fixture(scope='module')
def cluster(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('slurm'))
  env = {
      'JAX_PLATFORMS': 'cpu',
      'XLA_FLAGS': f'--xla_force_host_platform_device_count={DEVICES_PER_TASK}',
  }
  running = slurm_cluster.Cluster(root, env=env)
  try:
    running.start()
  except (
      RuntimeError
  ) as e:  # The daemons need what some machines lack (a resolvable host name, ports).
    running.stop()
    pytest.skip(f'the SLURM test cluster did not start: {str(e)[:2000]}')
  yield running
  running.stop()


@pytest.fixture(scope='module')
def reference(tmp_path_factory, data_dir):
  """The same run, uninterrupted, through the local launcher: 2 processes of 2 devices."""
  workdir = str(tmp_path_factory.mktemp('local') / 'run')
  args = helpers.main_args('configs/demo.py', workdir, {**RUN, 'data_dir': data_dir})[3:]
  assert local.launch(args, num_processes=2, devices_per_process=DEVICES_PER_TASK, timeout=600) == 0
  return workdir


def _sbatch(cluster, options: list[str], script_args: list[str], output: str) -> str:
  run = cluster.run(
      'sbatch',
      '--parsable',
      *options,
      f'--output={output}',
      '--open-mode=append',
      'launch/slurm.sbatch',
      *script_args,
      cwd=helpers.REPO,
  )
  return run.stdout.strip().split(';')[0]


def _wait(cluster, job: str, until, timeout: float = 600) -> dict[str, str]:
  """`scontrol show job` of `job` as a dict, once `until(fields)` holds."""
  deadline = time.time() + timeout
  while True:
    fields = dict(re.findall(r'(\w+)=(\S*)', cluster.run('scontrol', 'show', 'job', job).stdout))
    if until(fields):
      return fields
    if time.time() > deadline:
      raise AssertionError(f'job {job}: {fields}\n{cluster.logs()[-4000:]}')
    time.sleep(1)


def _main_args(workdir: str, data_dir: str) -> list[str]:
  return helpers.main_args('configs/demo.py', workdir, {**RUN, 'data_dir': data_dir})[3:]


def _final_params(workdir: str):
  directory, step = saved_state.find_checkpoint(workdir)
  return step, saved_state.restore_params(directory)[0]


def test_a_two_task_sbatch_job_trains_exactly_as_the_local_two_process_launcher(
    cluster, reference, data_dir, tmp_path
):
  workdir = str(tmp_path / 'run')
  job = _sbatch(cluster, JOB, _main_args(workdir, data_dir), str(tmp_path / 'job.out'))
  fields = _wait(cluster, job, lambda f: f.get('JobState') in ('COMPLETED', 'FAILED', 'CANCELLED'))
  output = open(tmp_path / 'job.out').read()
  assert fields['JobState'] == 'COMPLETED', output[-3000:]
  assert 'Final eval' in output and '4 devices' in output, output[-3000:]
  assert (
      helpers.read_scalars(workdir)['train_loss'] == helpers.read_scalars(reference)['train_loss']
  )


def test_a_job_preempted_with_sigterm_is_requeued_and_ends_bit_identical(
    cluster, reference, data_dir, tmp_path
):
  workdir = str(tmp_path / 'run')
  job = _sbatch(cluster, JOB, _main_args(workdir, data_dir), str(tmp_path / 'job.out'))
  _wait(cluster, job, lambda f: os.path.isdir(os.path.join(workdir, 'checkpoints', '20')))
  cluster.run('scancel', '--signal=TERM', job)  # To the job's tasks, as SLURM's preemption does.
  fields = _wait(
      cluster,
      job,
      lambda f: f.get('JobState') in ('COMPLETED', 'FAILED', 'CANCELLED')
      and f.get('Restarts') != '0',
  )
  output = open(tmp_path / 'job.out').read()
  assert fields['JobState'] == 'COMPLETED' and fields['Restarts'] == '1', output[-4000:]
  stopped = int(re.search(r'stopped on request at step (\d+)', output)[1])
  assert 20 <= stopped < 160 and f'from step {stopped}' in output, output[-4000:]
  (step, params), (expected_step, expected) = _final_params(workdir), _final_params(reference)
  assert step == expected_step == 160
  for ours, theirs in zip(jax.tree.leaves(params), jax.tree.leaves(expected), strict=True):
    np.testing.assert_array_equal(ours, theirs)
  # The logged train loss is the mean over the steps since the last log line: equal once a whole
  # window lies after the restart.
  ours, theirs = helpers.read_scalars(workdir), helpers.read_scalars(reference)
  after = [step for step in theirs['train_loss'] if step - RUN['log_every_steps'] >= stopped]
  assert len(after) >= 5 and [ours['train_loss'][s] for s in after] == [
      theirs['train_loss'][s] for s in after
  ]
  assert ours['eval_top1'] == theirs['eval_top1']


def test_a_sweep_runs_as_a_job_array(cluster, data_dir, tmp_path):
  """Submitted from the user's directory, outside the repository: the runs' relative paths (the
  workdir) are read there, as when the runs go one after another."""
  sweep_file = tmp_path / 'tiny_sweep.py'
  sweep_file.write_text(
      "CONFIG = 'configs/demo.py'\n\ndef get_sweep():\n" "  return [{'lr.base': [0.001, 0.003]}]\n"
  )
  tiny = {**helpers.TINY, 'data_dir': data_dir}
  root = tmp_path / 'sweep'
  run = cluster.run(
      sys.executable,
      os.path.join(helpers.REPO, 'launch/sweep.py'),
      '--sweep=tiny_sweep.py',
      '--workdir=sweep',
      '--slurm=--nodes=1 --ntasks-per-node=1 --gpus-per-node=0 --cpus-per-task=1',
      '--',
      *(f'--config.{k}={v}' for k, v in tiny.items()),
      cwd=tmp_path,
  )
  job = re.search(r'Submitted batch job (\d+)', run.stdout)[1]
  deadline = time.time() + 600
  while cluster.run('squeue', '-h', '-j', job).stdout.strip():
    assert time.time() < deadline, cluster.run('squeue', '-j', job).stdout
    time.sleep(1)
  outputs = sorted(root.glob('slurm-*.out'))
  assert [p.name for p in outputs] == [f'slurm-{job}_0.out', f'slurm-{job}_1.out']
  for lr, output in zip(('0.001', '0.003'), outputs):
    text = output.read_text()
    assert 'Final eval' in text, text[-3000:]
    config, _ = run_dir.load_run_info(str(root / f'lr.base={lr}'))
    assert config.lr.base == float(lr)
    assert (
        saved_state.find_checkpoint(str(root / f'lr.base={lr}'))[1] == helpers.TINY['total_steps']
    )
