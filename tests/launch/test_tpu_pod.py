"""launch/tpu_pod.sh cannot run here (no TPU, no gcloud): its dry run prints the exact commands."""

import os
import subprocess

import helpers


def test_the_dry_run_prints_every_gcloud_command_with_the_run_arguments_quoted():
  run = subprocess.run(
      [
          'bash',
          'launch/tpu_pod.sh',
          'my-pod',
          'us-central2-b',
          'v4-128',
          '--',
          '--config=configs/vit_l16_i21k.py',
          '--workdir=gs://b/run',
          '--config.init_from=gs://x y.npz',
      ],
      cwd=helpers.REPO,
      env={'DRY_RUN': '1', 'PATH': '/usr/bin:/bin'},
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert run.returncode == 0, run.stderr
  lines = run.stdout.splitlines()
  assert lines[:4] == [
      'gcloud compute tpus tpu-vm create my-pod --zone=us-central2-b --accelerator-type=v4-128 '
      '--version=tpu-ubuntu2204-base',
      'git archive --format=tar.gz -o vit_jax.tgz HEAD',
      'gcloud compute tpus tpu-vm scp vit_jax.tgz my-pod:vit_jax.tgz --zone=us-central2-b --worker=all',
      'rm -f vit_jax.tgz',
  ]
  assert lines[4].startswith(
      'gcloud compute tpus tpu-vm ssh my-pod --zone=us-central2-b --worker=all '
  )
  # What every worker runs, as bash reads the printed (quoted) line: the argument with a space intact.
  args = subprocess.run(
      ['bash', '-c', 'eval "set -- $1"; printf "%s\\0" "$@"', 'bash', lines[4]],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.split('\0')[:-1]
  assert args[:7] == [
      'gcloud',
      'compute',
      'tpus',
      'tpu-vm',
      'ssh',
      'my-pod',
      '--zone=us-central2-b',
  ]
  command = args[-1]
  assert command.startswith('--command=') and 'make install-tpu' in command
  assert (
      '.venv/bin/python -m vit_jax.main --distributed=on --config=configs/vit_l16_i21k.py '
      '--workdir=gs://b/run --config.init_from=gs://x\\ y.npz'
  ) in command
  assert not os.path.exists(os.path.join(helpers.REPO, 'vit_jax.tgz'))  # The dry run wrote nothing.


def test_without_the_separator_it_prints_its_usage_and_exits_2():
  run = subprocess.run(
      ['bash', 'launch/tpu_pod.sh', 'my-pod'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert run.returncode == 2 and 'launch/tpu_pod.sh NAME ZONE ACCELERATOR_TYPE --' in run.stdout
