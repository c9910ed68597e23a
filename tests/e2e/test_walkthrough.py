"""The README's walk-through as a new user types it: relative paths, from a clone's root."""

import os
import subprocess
import sys
import time

from PIL import Image
import pytest

import helpers
from vit_jax.runtime import paths
from vit_jax.data import digits

SHORT = [
    '--config.total_steps=20',
    '--config.log_every_steps=10',
    '--config.eval_every_steps=20',
    '--config.checkpoint_every_steps=20',
    '--config.data_dir=tfds',
]


def run(cwd, module, *args):
  """vit_jax.<module> as the README has it, on one CPU device: a new user's laptop, not the tests' 8."""
  result = subprocess.run(
      [sys.executable, '-m', f'vit_jax.{module}', *args],
      cwd=cwd,
      env=helpers.on_devices(1),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert result.returncode == 0, f'{module} {args}:\n{result.stderr[-3000:]}'
  return result.stdout


@pytest.mark.slow
def test_readme_walkthrough_with_relative_paths(tmp_path):
  """make demo (shortened), then predict, export, predict from the export, demo_finetune (whose
  init_from is 'workdirs/demo'), fewshot, confusion, the pictures tool, the report and the planner,
  each given relative paths."""
  os.symlink(os.path.join(helpers.REPO, 'configs'), tmp_path / 'configs')
  images, _ = digits.split_arrays()['test']
  Image.fromarray(images[0]).save(tmp_path / 'digit.png')

  run(tmp_path, 'main', '--config=configs/demo.py', '--workdir=workdirs/demo', *SHORT)
  assert os.path.isdir(tmp_path / 'workdirs/demo/checkpoints/20/default')
  assert 'digit.png' in run(tmp_path, 'tools.predict', '--workdir=workdirs/demo', 'digit.png')
  run(tmp_path, 'tools.export', '--workdir=workdirs/demo', '--out=exported/demo')
  assert sorted(os.listdir(tmp_path / 'exported/demo')) == [
      'config.json',
      'model.jaxexport',
      'model.npz',
      'timm',
  ]
  from_export = run(tmp_path, 'tools.predict', '--export=exported/demo', 'digit.png')
  assert from_export == run(tmp_path, 'tools.predict', '--workdir=workdirs/demo', 'digit.png')
  run(
      tmp_path,
      'main',
      '--config=configs/demo_finetune.py',
      '--workdir=workdirs/demo_finetune',
      *SHORT,
  )
  assert os.path.isdir(tmp_path / 'workdirs/demo_finetune/checkpoints/20/default')
  accuracy = run(
      tmp_path, 'tools.fewshot', '--workdir=workdirs/demo', '--shots=1', '--seeds=1', '--knn=10,20'
  )
  assert 'weighted k-NN accuracy (temperature 0.07):' in accuracy, accuracy
  rows = [line.split()[0] for line in accuracy.splitlines()]
  assert rows[-6:] == ['shots', '1', 'weighted', 'k', '10', '20'], accuracy
  per_class = run(tmp_path, 'tools.confusion', '--workdir=workdirs/demo', '--top=5')
  assert "per-class results of step 20 of workdirs/demo on split 'test':" in per_class
  run(tmp_path, 'tools.pictures', '--workdir=workdirs/demo', '--image=digit.png', '--out=pictures')
  assert 'attention_rollout.png' in os.listdir(tmp_path / 'pictures')
  run(tmp_path, 'tools.report', 'workdirs', '--out=reports/demo')
  assert sorted(os.listdir(tmp_path / 'reports/demo')) == ['report.html', 'report.png']
  assert 'demo_finetune' in (tmp_path / 'reports/demo/report.html').read_text()
  assert 'ViT-Ti_4' in run(
      tmp_path, 'tools.plan', '--config=configs/demo.py', '--devices=1', '--chip=tpu-v4'
  )
  # Nothing was written anywhere else: everything lies under the directory the user typed from.
  assert sorted(os.listdir(tmp_path)) == [
      'configs',
      'digit.png',
      'exported',
      'pictures',
      'reports',
      'workdirs',
  ]


def test_paths_resolve_locally_and_leave_urls_alone(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.absolute('workdirs/demo') == str(tmp_path / 'workdirs/demo')
  assert paths.absolute('/data/run') == '/data/run'
  assert paths.absolute('gs://bucket/run1') == 'gs://bucket/run1'


def _main_in(cwd, *args):
  return subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', *args],
      cwd=cwd,
      capture_output=True,
      text=True,
      timeout=300,
  )


@pytest.mark.parametrize('target', ['workdir', 'init_from'])
def test_an_unreachable_bucket_is_one_line_and_writes_nothing_locally(tmp_path, target):
  """No network here (nor credentials in CI): the bucket cannot answer. The run stops in one line
  naming the path, within the timeout, and nothing appears under the working directory."""
  cwd = tmp_path / 'cwd'
  cwd.mkdir()
  url = 'gs://vit-jax-no-such-bucket-for-tests/run1'
  args = [
      f'--config={helpers.REPO}/configs/demo.py',
      '--config.storage_timeout_s=20',
      f'--config.data_dir={tmp_path / "tfds"}',
  ]
  if target == 'workdir':
    args.append(f'--workdir={url}')
  else:
    args += [f'--workdir={tmp_path / "w"}', f'--config.init_from={url}/ViT-B_16.npz']
  run = _main_in(cwd, *args)
  assert run.returncode != 0
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert url in errors[0] and 'credentials' in errors[0], errors[0]
  assert os.listdir(cwd) == []
  assert not os.path.exists(tmp_path / 'w')


def test_a_file_system_that_does_not_answer_times_out(monkeypatch, tmp_path):
  def hang(*_, **__):
    time.sleep(60)

  local_path = type(paths.epath.Path(str(tmp_path)))
  monkeypatch.setattr(local_path, 'mkdir', hang)
  monkeypatch.setattr(local_path, 'exists', hang)
  start = time.perf_counter()
  with pytest.raises(
      ValueError, match=r"--workdir='.*' did not answer within 0.5 s: .*storage_timeout_s"
  ):
    paths.check_writable(str(tmp_path / 'w'), timeout_s=0.5)
  with pytest.raises(ValueError, match=r"config.init_from '.*' did not answer within 0.5 s"):
    paths.check_reachable(str(tmp_path / 'x.npz'), timeout_s=0.5, what='config.init_from')
  assert time.perf_counter() - start < 5
