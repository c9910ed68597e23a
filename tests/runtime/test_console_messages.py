"""What a new user reads at the console beyond flag errors: a config file's relative init_from read from
another directory, a refused resume, a finished run started again, predict on folders without images,
and export over an earlier export. Each says what happened and names the fix in one line."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.train import loop, setup as train_setup, state


def _error_lines(stderr: str) -> list[str]:
  return [line for line in stderr.splitlines() if line.startswith('error: ')]


def test_a_relative_init_from_read_from_another_directory_names_the_field_and_the_fix(tmp_path):
  # configs/demo_finetune.py sets init_from='workdirs/demo', relative to the repository.
  workdir = tmp_path / 'finetune'
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          f'--config={helpers.REPO}/configs/demo_finetune.py',
          f'--workdir={workdir}',
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-3000:]
  errors = _error_lines(run.stderr)
  assert errors == [
      f"error: config.init_from='workdirs/demo' does not exist: a relative path is taken from the "
      f"current directory, here '{tmp_path}', so it is '{tmp_path}/workdirs/demo'; pass the workdir "
      'of a vit_jax run by an absolute path, e.g. --config.init_from=/abs/path/to/it, or run from '
      'the directory it is relative to'
  ], run.stderr[-3000:]
  assert not workdir.exists()  # Refused before anything is written.


def test_a_refused_resume_does_not_ask_to_set_back_the_fields_that_may_change(
    trained_tiny_run, tmp_path
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config, _ = run_dir.load_run_info(workdir)
  config.model.mlp_activation = 'gelu'
  config.total_steps = 16
  config.checkpoint_every_steps = config.eval_every_steps = config.log_every_steps = 8
  with pytest.raises(state.ResumeError) as refusal:
    loop.train_and_evaluate(train_setup.prepare(config, workdir))
  message = str(refusal.value)
  assert message == (
      f"{workdir} holds a run of another model (model.mlp_activation 'gelu_tanh' -> "
      "'gelu'; changed fields: model.mlp_activation None -> 'gelu'): use "
      'another --workdir, or set these fields back'
  ), message
  # They are still changes of the config, which a resume that goes ahead logs.
  changed = [
      field for field, _, _ in run_dir.config_changes(run_dir.load_run_info(workdir)[0], config)
  ]
  assert changed == [
      'checkpoint_every_steps',
      'eval_every_steps',
      'log_every_steps',
      'model.mlp_activation',
      'total_steps',
  ]


def test_a_finished_run_started_again_says_it_only_evaluates(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config, _ = run_dir.load_run_info(workdir)
  same = {**helpers.TINY, 'data_dir': config.data_dir, 'lr.base': config.lr.base}
  run = helpers.run_main('configs/demo.py', workdir, same, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Run already at step 12 of 12: evaluating only;' in run.stderr, run.stderr[-3000:]
  assert 'Training 12 steps from step 12' not in run.stderr


def test_predict_on_folders_without_images_names_the_extensions(trained_tiny_run, tmp_path):
  from vit_jax.data.images import IMAGE_EXTENSIONS  # pylint: disable=g-import-not-at-top

  (tmp_path / 'empty').mkdir()
  (tmp_path / 'notes').mkdir()
  (tmp_path / 'notes' / 'readme.txt').write_text('not an image')
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.predict',
          f'--workdir={trained_tiny_run}',
          f'{tmp_path}/empty/',
          f'{tmp_path}/notes',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 1, run.stderr[-2000:]
  assert run.stdout == ''
  assert _error_lines(run.stderr) == [
      f'error: the inputs hold no image files (folders are searched for {"/".join(IMAGE_EXTENSIONS)} '
      f'files; inputs: {tmp_path}/empty/ {tmp_path}/notes): pass image files, or folders that hold '
      'them'
  ], run.stderr[-2000:]


def test_export_over_an_earlier_export_is_refused_unless_overwrite(
    trained_tiny_run, exported_tiny_run, tmp_path
):
  out = tmp_path / 'out'
  shutil.copytree(exported_tiny_run, out)
  before = helpers.files_of(str(out))
  export = [
      sys.executable,
      '-m',
      'vit_jax.tools.export',
      f'--workdir={trained_tiny_run}',
      f'--out={out}',
      '--step=8',
  ]
  refused = subprocess.run(export, cwd=helpers.REPO, capture_output=True, text=True, timeout=300)
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert refused.stderr.strip().splitlines() == [
      f"error: --out='{out}' already holds files an export writes (model.npz, model.jaxexport, "
      'config.json, timm/model.safetensors, timm/config.json): pass --overwrite to replace them, '
      'or another --out'
  ], refused.stderr[-2000:]
  assert helpers.files_of(str(out)) == before
  # A directory of the user's own timm or peft files: replaced or deleted without a word.
  for own in ('timm/config.json', 'peft/adapter_model.safetensors'):
    mine = tmp_path / 'mine'
    (mine / own).parent.mkdir(parents=True)
    (mine / own).write_text('mine')
    refused = subprocess.run(
        [*export[:-2], f'--out={mine}'], cwd=helpers.REPO, capture_output=True, text=True
    )
    assert refused.returncode == 2 and f'({own}): pass --overwrite' in refused.stderr, own
    assert (mine / own).read_text() == 'mine'
    shutil.rmtree(mine)
  replaced = subprocess.run(
      [*export, '--overwrite'], cwd=helpers.REPO, capture_output=True, text=True, timeout=300
  )
  assert replaced.returncode == 0, replaced.stderr[-2000:]
  assert f'exported step 8 (raw parameters) of {trained_tiny_run} to {out}' in replaced.stdout
  assert os.path.getsize(out / 'model.npz') > 0


def test_an_export_and_a_run_refuse_each_others_directories(
    trained_tiny_run, exported_tiny_run, tmp_path, data_dir
):
  """Each would overwrite the other's config.json: an export over a run's (--overwrite too), a run
  over an export's. Nothing is written."""
  from vit_jax.tools import export  # pylint: disable=g-import-not-at-top

  run, exported = tmp_path / 'run', tmp_path / 'exported'
  shutil.copytree(trained_tiny_run, run)
  shutil.copytree(exported_tiny_run, exported)
  before = helpers.files_of(str(run)), helpers.files_of(str(exported))
  with pytest.raises(ValueError, match=f"^--out='{run}' holds a run's workdir: export to another"):
    export.export(str(run), str(run), overwrite=True)
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  with pytest.raises(
      ValueError,
      match=f'^--workdir={exported} holds an export .*: train in another --workdir '
      rf'\(--config.init_from={exported}/model.npz fine-tunes from it\)$',
  ):
    train_setup.prepare(config, str(exported))
  assert (helpers.files_of(str(run)), helpers.files_of(str(exported))) == before


def test_a_run_starts_with_one_header_line_and_the_full_config_at_verbosity_1(tmp_path, data_dir):
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'total_steps': 1,
      'eval_every_steps': 1,
      'lr.warmup_steps': 0,
  }
  quiet = helpers.run_main('configs/demo.py', str(tmp_path / 'quiet'), overrides, timeout=300)
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  before_training = quiet.stderr.split('Training 1 steps from step 0:')[0].splitlines()
  n = jax.device_count()  # make test's 8; one GPU's 1.
  assert len(before_training) <= 1, before_training  # Only the header line's own prefix.
  header = next(line for line in quiet.stderr.splitlines() if 'Training 1 steps' in line)
  for part in (
      'ViT-testing_4, 0.0M parameters, float32, 8 px; digits: 1437 train / 360 eval',
      f'batch 16 on {n} device{"s" * (n > 1)} (mesh data={n})',
      f'workdir {tmp_path}/quiet',
  ):
    assert part in header, header
  assert len(quiet.stderr.splitlines()) < 20, quiet.stderr
  for noise in ('Config:', '[Hyperparameters]', 'Total: ', 'malloc:'):
    assert noise not in quiet.stderr
  verbose = helpers.run_main(
      'configs/demo.py', str(tmp_path / 'verbose'), overrides, ['--verbosity=1'], timeout=300
  )
  assert verbose.returncode == 0, verbose.stderr[-3000:]
  for detail in ('Config:', '[Hyperparameters]', 'Total: ', 'malloc:', 'variant: ViT-testing_4'):
    assert detail in verbose.stderr


def _one_class_folder(root) -> str:
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    (root / split / 'cat').mkdir(parents=True)
    for i in range(4):
      Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
          root / split / 'cat' / f'{i}.png'
      )
  return str(root)


def test_a_folder_of_one_class_is_refused_for_classification_and_kept_for_mpp(tmp_path):
  data_dir = _one_class_folder(tmp_path / 'data')
  overrides = {
      **helpers.TINY,
      'dataset': 'folder',
      'data_dir': data_dir,
      'batch_size': 8,
      'eval_batch_size': 8,
  }
  run = helpers.run_main('configs/demo.py', str(tmp_path / 'run'), overrides, timeout=300)
  assert run.returncode == 2 and _error_lines(run.stderr) == [
      f"error: {data_dir}/train/ has one class folder, 'cat': config.task='classification' needs 2 "
      'or more classes; add a folder of images for each class beside it'
  ], run.stderr[-3000:]
  assert not (tmp_path / 'run').exists()
  config = helpers.load_config('mpp_demo', overrides)
  assert train_setup.prepare(config, str(tmp_path / 'mpp')).info.num_classes == 1


def test_warmup_past_the_end_of_the_run_is_a_warning(tmp_path, data_dir, caplog):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 12, 'lr.warmup_steps': 20}
  )
  train_setup.prepare(config, str(tmp_path / 'run'))
  assert [r.getMessage() for r in caplog.records if r.levelname == 'WARNING'] == [
      "config.lr.warmup_steps=20 is not below the run's 12 steps: the learning rate never reaches "
      'config.lr.base=0.001; use fewer warmup steps (e.g. --config.lr.warmup_steps=1) or more steps'
  ]
