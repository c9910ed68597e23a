"""The commands where TensorFlow is not installed, as on the accelerator machines: each is run as a
user runs it, in a process where `import tensorflow` fails."""

import os
import re
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax.data import digits


def _command(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
  run = subprocess.run(
      [sys.executable, '-m', module, *args],
      cwd=helpers.REPO,
      env=helpers.without_tensorflow(),
      capture_output=True,
      text=True,
      timeout=timeout,
  )
  assert run.returncode == 0, (module, run.stderr[-3000:])
  return run


def test_tensorflow_is_hidden():
  run = subprocess.run(
      [sys.executable, '-c', 'import tensorflow'],
      env=helpers.without_tensorflow(),
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert run.returncode == 1 and "No module named 'tensorflow'" in run.stderr


@pytest.mark.slow
def test_the_demo_trains_and_its_model_exports_predicts_and_is_looked_into(tmp_path):
  """The demo (4 steps), then export, predict (from the workdir and from the export), pictures,
  few-shot, report and plan."""
  workdir, exported = str(tmp_path / 'demo'), str(tmp_path / 'exported')
  overrides = {
      'total_steps': 4,
      'log_every_steps': 2,
      'eval_every_steps': 4,
      'checkpoint_every_steps': 4,
  }
  run = subprocess.run(
      helpers.main_args('configs/demo.py', workdir, overrides),
      cwd=helpers.REPO,
      env=helpers.without_tensorflow(),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Final eval: ' in run.stderr
  _command('vit_jax.tools.export', f'--workdir={workdir}', f'--out={exported}')
  assert os.path.isfile(os.path.join(exported, 'model.npz'))

  images, labels = digits.split_arrays()['test']
  image = str(tmp_path / f'digit_{labels[0]}.png')
  Image.fromarray(np.kron(images[0], np.ones((4, 4, 1), np.uint8))).save(image)
  from_workdir = _command(
      'vit_jax.tools.predict', f'--workdir={workdir}', '--top_k=2', image
  ).stdout
  from_export = _command('vit_jax.tools.predict', f'--export={exported}', '--top_k=2', image).stdout
  assert from_workdir == from_export and from_workdir.splitlines()[0] == image
  assert len(from_workdir.splitlines()) == 3

  pictures = str(tmp_path / 'pictures')
  _command(
      'vit_jax.tools.pictures', f'--workdir={workdir}', f'--image={image}', f'--out={pictures}'
  )
  assert any(name.endswith('.png') for name in os.listdir(pictures))
  fewshot = _command('vit_jax.tools.fewshot', f'--workdir={workdir}', '--shots=1', '--seeds=1')
  assert re.search(r'^shots  accuracy\n    1  0\.\d{4}$', fewshot.stdout, re.M), fewshot.stdout
  _command('vit_jax.tools.report', workdir, f'--out={tmp_path / "report"}')
  assert os.path.isfile(tmp_path / 'report' / 'report.html')
  plan = _command(
      'vit_jax.tools.plan', '--config=configs/demo.py', '--devices=1', '--chip=h100-80gb'
  )
  assert plan.stdout
