"""launch/tpu_pod.sh cannot run here (no TPU, no gcloud): its dry run prints the exact commands."""

import os
import subprocess
import tarfile

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
      'pack vit_jax.tgz',
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


def test_the_checkout_is_shipped_as_it_is_not_as_last_committed(tmp_path):
  """A changed file as changed, a new file, not an ignored or a deleted one: through the script, with
  `gcloud` a stand-in that keeps what it is given to copy."""
  checkout = tmp_path / 'checkout'
  (checkout / 'launch').mkdir(parents=True)
  (checkout / 'launch/tpu_pod.sh').write_text(
      open(os.path.join(helpers.REPO, 'launch/tpu_pod.sh')).read()
  )
  for name, text in [('configs/demo.py', 'committed'), ('gone.py', 'x'), ('.gitignore', 'big/\n')]:
    (checkout / name).parent.mkdir(exist_ok=True)
    (checkout / name).write_text(text)
  git = lambda *args: subprocess.run(['git', *args], cwd=checkout, check=True, capture_output=True)
  git('init', '-q')
  git('add', '.')
  git('-c', 'user.name=t', '-c', 'user.email=t@t', 'commit', '-qm', 'c')
  (checkout / 'configs/demo.py').write_text('changed')
  (checkout / 'configs/mine.py').write_text('new')
  (checkout / 'big').mkdir()
  (checkout / 'big/data.bin').write_text('ignored')
  (checkout / 'gone.py').unlink()
  stub = tmp_path / 'bin/gcloud'
  stub.parent.mkdir()
  # `describe` succeeds (the VM exists); `scp ARCHIVE ...` keeps the archive.
  stub.write_text(
      '#!/bin/bash\n' f'if [[ "$4" == scp ]]; then cp "$5" {tmp_path}/shipped.tgz; fi\n'
  )
  stub.chmod(0o755)
  subprocess.run(
      ['bash', 'launch/tpu_pod.sh', 'pod', 'zone', 'v4-8', '--', '--config=configs/mine.py'],
      cwd=checkout,
      env={**os.environ, 'PATH': f'{stub.parent}:/usr/bin:/bin'},
      check=True,
      capture_output=True,
      timeout=60,
  )
  with tarfile.open(tmp_path / 'shipped.tgz') as shipped:
    assert sorted(shipped.getnames()) == [
        '.gitignore',
        'configs/demo.py',
        'configs/mine.py',
        'launch/tpu_pod.sh',
    ]
    assert shipped.extractfile('configs/demo.py').read() == b'changed'
