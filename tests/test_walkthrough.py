"""The README's walk-through as a new user types it: relative paths, from a clone's root."""
import os
import subprocess
import sys

from PIL import Image
import pytest

import helpers
from vit_jax import paths
from vit_jax.data import digits

SHORT = ['--config.total_steps=20', '--config.log_every_steps=10', '--config.eval_every_steps=20',
         '--config.checkpoint_every_steps=20', '--config.data_dir=tfds']


def run(cwd, module, *args):
  result = subprocess.run([sys.executable, '-m', f'vit_jax.{module}', *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, f'{module} {args}:\n{result.stderr[-3000:]}'
  return result.stdout


@pytest.mark.slow
def test_readme_walkthrough_with_relative_paths(tmp_path):
  """make demo (shortened), then predict, export, predict from the export, demo_finetune (whose
  init_from is 'workdirs/demo'), fewshot and the pictures tool, each given relative paths."""
  os.symlink(os.path.join(helpers.REPO, 'configs'), tmp_path / 'configs')
  images, _ = digits.split_arrays()['test']
  Image.fromarray(images[0]).save(tmp_path / 'digit.png')

  run(tmp_path, 'main', '--config=configs/demo.py', '--workdir=workdirs/demo', *SHORT)
  assert os.path.isdir(tmp_path / 'workdirs/demo/checkpoints/20/default')
  assert 'digit.png' in run(tmp_path, 'predict', '--workdir=workdirs/demo', 'digit.png')
  run(tmp_path, 'export', '--workdir=workdirs/demo', '--out=exported/demo')
  assert sorted(os.listdir(tmp_path / 'exported/demo')) == ['config.json', 'model.jaxexport',
                                                            'model.npz']
  from_export = run(tmp_path, 'predict', '--export=exported/demo', 'digit.png')
  assert from_export == run(tmp_path, 'predict', '--workdir=workdirs/demo', 'digit.png')
  run(tmp_path, 'main', '--config=configs/demo_finetune.py', '--workdir=workdirs/demo_finetune', *SHORT)
  assert os.path.isdir(tmp_path / 'workdirs/demo_finetune/checkpoints/20/default')
  accuracy = run(tmp_path, 'fewshot', '--workdir=workdirs/demo', '--shots=1', '--seeds=1')
  assert accuracy.splitlines()[-1].split()[0] == '1'
  run(tmp_path, 'inspect', '--workdir=workdirs/demo', '--image=digit.png', '--out=pictures')
  assert 'attention_rollout.png' in os.listdir(tmp_path / 'pictures')
  # Nothing was written anywhere else: everything lies under the directory the user typed from.
  assert sorted(os.listdir(tmp_path)) == ['configs', 'digit.png', 'exported', 'pictures', 'tfds',
                                          'workdirs']


def test_paths_resolve_locally_and_leave_urls_alone(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.absolute('workdirs/demo') == str(tmp_path / 'workdirs/demo')
  assert paths.absolute('/data/run') == '/data/run'
  assert paths.absolute('gs://bucket/run1') == 'gs://bucket/run1'
