"""Config files load from any working directory, their `from configs import ...` included, in every
command that takes --config (vit_jax.main, vit_jax.tools.plan) and in the sweep runner; and the paths in a
run's config stay valid from any working directory."""

import glob
import os
import subprocess
import sys

import pytest

import helpers
from vit_jax.runtime import config_files
from vit_jax.train import setup as train_setup

REPO = helpers.REPO
# Every shipped config that imports another: found, so that one added later is tested too.
SIBLING_IMPORTERS = sorted(
    path
    for path in glob.glob(os.path.join(REPO, 'configs', '**', '*.py'), recursive=True)
    if 'from configs' in open(path, encoding='utf-8').read()
)


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300
  )


def test_the_shipped_configs_that_import_their_siblings_are_found():
  names = {os.path.relpath(p, REPO) for p in SIBLING_IMPORTERS}
  assert {
      'configs/demo_finetune.py',
      'configs/mpp_demo.py',
      'configs/vit_b16_finetune.py',
      'configs/vit_l16_finetune.py',
  } <= names


@pytest.mark.parametrize('path', SIBLING_IMPORTERS, ids=lambda p: os.path.relpath(p, REPO))
def test_main_loads_a_config_importing_its_siblings_from_another_directory(path, tmp_path):
  # A stray positional argument is refused after the flags, the config among them, have been parsed.
  run = _run(
      ['-m', 'vit_jax.main', f'--config={path}', f'--workdir={tmp_path / "w"}', 'stray'],
      cwd=str(tmp_path),
  )
  assert (
      run.stderr.strip().splitlines()[-1].startswith("error: unexpected arguments ['stray']")
  ), run.stderr


def test_main_and_plan_take_a_relative_config_path_from_another_directory(tmp_path):
  relative = os.path.relpath(os.path.join(REPO, 'configs', 'demo_finetune.py'), tmp_path)
  run = _run(
      ['-m', 'vit_jax.main', f'--config={relative}', '--workdir=w', 'stray'], cwd=str(tmp_path)
  )
  assert "error: unexpected arguments ['stray']" in run.stderr, run.stderr
  run = _run(
      ['-m', 'vit_jax.tools.plan', f'--config={relative}', '--devices=1', '--chip=tpu-v4', 'stray'],
      cwd=str(tmp_path),
  )
  assert "error: unexpected arguments ['stray']" in run.stderr, run.stderr


def test_the_sweep_runner_finds_its_configs_from_another_directory(tmp_path):
  sweep = [os.path.join(REPO, 'launch', 'sweep.py'), f'--workdir={tmp_path / "root"}', '--print']
  run = _run([*sweep, f'--sweep={REPO}/configs/sweeps/demo_lr_steps.py'], cwd=str(tmp_path))
  assert run.returncode == 0, run.stderr
  assert f'--config={REPO}/configs/demo.py ' in run.stdout.splitlines()[0]
  # A config with an argument, named per run by the sweep ('config' key).
  run = _run([*sweep, f'--sweep={REPO}/configs/sweeps/vtab_lr.py'], cwd=str(tmp_path))
  assert run.returncode == 0, run.stderr
  assert f'--config={REPO}/configs/vtab.py:caltech101 ' in run.stdout


def test_the_import_root_is_above_the_outermost_package(tmp_path):
  (tmp_path / 'top' / 'inner').mkdir(parents=True)
  (tmp_path / 'top' / '__init__.py').write_text('')
  (tmp_path / 'top' / 'inner' / '__init__.py').write_text('')
  assert config_files.import_root(str(tmp_path / 'top' / 'inner' / 'c.py')) == str(tmp_path)
  assert config_files.import_root(str(tmp_path / 'loose.py')) == str(
      tmp_path
  )  # No package: its folder.
  assert config_files.config_path(['main', '--config', 'a/b.py:x', '--workdir=w']) == 'a/b.py'
  assert config_files.config_path(['main', '--config=a/b.py']) == 'a/b.py'
  assert config_files.config_path(['main', '--config.seed=1']) is None


def test_a_relative_data_dir_is_stored_absolute_for_the_tools_run_from_elsewhere(
    data_dir, trained_tiny_run, tmp_path, monkeypatch
):
  # The run's config.json is setup's config: fewshot, predict... read data_dir from it, from any directory.
  monkeypatch.chdir(os.path.dirname(data_dir))
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': os.path.basename(data_dir)})
  assert train_setup.prepare(config, str(tmp_path / 'w')).config.data_dir == data_dir
  # So is what a fine-tune starts from: soup compared two runs' config.init_from as text.
  monkeypatch.chdir(os.path.dirname(trained_tiny_run))
  config = helpers.load_config(
      'demo',
      {**helpers.TINY, 'data_dir': data_dir, 'init_from': os.path.basename(trained_tiny_run)},
  )
  assert train_setup.prepare(config, str(tmp_path / 'w2')).config.init_from == trained_tiny_run
  for kept in (
      None,
      'gs://bucket/tfds',
  ):  # Unset stays unset (tfds' default); a URL is no local path.
    config = helpers.load_config('demo', {'data_dir': kept})
    train_setup.absolute_paths(config)
    assert config.data_dir == kept
  # The shell leaves --config.data_dir=~/x as it is: it was <cwd>/~/x.
  monkeypatch.setenv('HOME', str(tmp_path))
  config = helpers.load_config('demo', {'data_dir': '~/tfds'})
  train_setup.absolute_paths(config)
  assert config.data_dir == str(tmp_path / 'tfds')
