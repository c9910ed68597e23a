"""Starting a command again on a workdir that holds a run, or the beginnings of one: what it resumes,
what it refuses (in one line, writing nothing), what it starts afresh."""

import json
import os
import shutil

import pytest

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.tools import export
from vit_jax.train import loop, setup as train_setup, state


def _config(workdir: str, **changes):
  config, _ = run_dir.load_run_info(workdir)
  config.total_steps = config.eval_every_steps = 14
  for field, value in changes.items():
    *parents, name = field.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[name] = value
  return config


def _refused(workdir: str, config, match: str) -> None:
  """The start is refused with a ResumeError matching `match`, and nothing in `workdir` changed."""
  before = helpers.files_of(workdir)
  with pytest.raises(state.ResumeError, match=match):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert helpers.files_of(workdir) == before


@pytest.mark.parametrize(
    'field, value',
    [
        ('model.mlp_activation', 'gelu'),
        ('model.posemb_where', 'shared_every_layer'),
        ('loss', 'sigmoid_xent'),  # predict and export read the first start's softmax_xent.
    ],
)
def test_a_model_of_the_same_shapes_but_another_function_is_refused(
    trained_tiny_run, tmp_path, field, value
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  _refused(
      workdir,
      _config(workdir, **{field: value}),
      rf"holds a run of another model \({field} .* -> '{value}'; changed fields: .*{field}",
  )


@pytest.mark.parametrize('field, value', [('grad_clip_norm', 0.0), ('optim.layer_decay', 0.75)])
def test_an_optimizer_whose_state_arrays_sit_elsewhere_is_refused(
    trained_tiny_run, tmp_path, field, value
):
  """Same shapes in another chain (no clipping: its empty state gone; layer decay's scaling around
  it): orbax could not restore it, and said that every checkpoint was unreadable."""
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  _refused(
      workdir,
      _config(workdir, **{field: value}),
      rf'^the checkpoint of step 12 .* does not fit the model and optimizer of this config '
      rf'\(changed fields: {field} .* -> {value}\): use another --workdir',
  )


def test_other_frozen_parameters_of_the_same_shapes_are_refused(tmp_path, data_dir):
  """The optimizer state of block 0 is not that of block 1: restored, it failed in the first step."""
  workdir = str(tmp_path / 'run')
  frozen = {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 4, 'eval_every_steps': 4}
  config = helpers.load_config('demo', {**frozen, 'optim.frozen': ('encoderblock_0/',)})
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  config = _config(workdir, **{'optim.frozen': ('encoderblock_1/',)})
  _refused(workdir, config, r'does not fit .*changed fields: optim.frozen')


@pytest.mark.parametrize('variant', ['checkpoint', None])
def test_a_fine_tune_resumes_without_the_checkpoint_it_started_from(
    trained_tiny_run, tmp_path, data_dir, caplog, variant
):
  """Its checkpoint holds the whole state, and its config.json the model a variant='checkpoint' run
  read from there: a requeue on a node without that file (or hub) resumes (it refused, and read and
  adapted every weight of the source on each start only to drop them)."""
  source = helpers.copy_of(trained_tiny_run, tmp_path / 'source')
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 4, 'init_from': source}
  if variant:
    overrides['variant'] = variant
    for field in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim', 'patch_size'):
      overrides[f'model.{field}'] = None  # The demo's: the checkpoint says them.
  config = helpers.load_config('demo', overrides)
  workdir = str(tmp_path / 'fine_tune')
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  shutil.rmtree(source)
  config = helpers.load_config('demo', {**overrides, 'total_steps': 6})
  caplog.set_level('INFO')
  assert loop.train_and_evaluate(train_setup.prepare(config, workdir))['eval_top1'] >= 0.0
  assert 'Initialising from' not in caplog.text and 'Resumed from' in caplog.text
  assert max(helpers.read_scalars(workdir)['train_loss']) == 6


def test_regularisation_and_the_attention_kernel_may_change(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config = _config(workdir, **{'model.dropout_rate': 0.1, 'model.drop_path_rate': 0.1})
  assert loop.train_and_evaluate(train_setup.prepare(config, workdir))['eval_top1'] >= 0.0


def test_a_run_stopped_before_its_first_save_starts_afresh_with_the_new_config(
    trained_tiny_run, tmp_path
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  shutil.rmtree(os.path.join(workdir, 'checkpoints'))
  config = _config(workdir, **{'model.hidden_size': 16})
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert json.load(open(os.path.join(workdir, 'config.json')))['model']['hidden_size'] == 16
  assert export.export(workdir, str(tmp_path / 'exported'))['step'] == 14  # The tools rebuild it.


def test_a_run_whose_config_is_lost_resumes_only_a_model_its_checkpoint_fits(
    trained_tiny_run, tmp_path
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config = _config(workdir)
  os.remove(os.path.join(workdir, 'config.json'))
  config.model.hidden_size = 16
  _refused(
      workdir,
      config,
      r'the checkpoint of step 12 .* does not fit the model '
      r'and optimizer of this config \(and .*config.json, the run.s config, is missing\)',
  )
  config.model.hidden_size = 32
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert json.load(open(os.path.join(workdir, 'config.json')))['model']['hidden_size'] == 32


def test_damaged_run_info_is_a_one_line_refusal(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config = _config(workdir)
  with open(os.path.join(workdir, 'config.json'), 'r+') as f:
    f.truncate(100)
  with pytest.raises(
      state.ResumeError, match=r'^the run info in .* cannot be read \(.*\): restore ' 'config.json'
  ):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))


def test_a_train_split_of_more_or_fewer_images_resumes_at_its_first_length(
    sorted_digits_folder, tmp_path, caplog
):
  """Images removed before a resume: num_epochs over the split as it is now made the run shorter and
  moved its schedule, silently; with the length kept, the other batches are said."""
  folder = str(tmp_path / 'digits')
  shutil.copytree(sorted_digits_folder, folder)
  workdir = str(tmp_path / 'run')
  overrides = {
      **helpers.TINY,
      'dataset': 'folder',
      'data_dir': folder,
      'total_steps': None,
      'num_epochs': 16 * 12 / 1437,  # 12 steps of the 1437 train images.
      'checkpoint_every_steps': 6,
  }
  stop_at_6 = train_setup.prepare(helpers.load_config('demo', overrides), workdir)
  assert stop_at_6.total_steps == 12
  loop.train_and_evaluate(stop_at_6)
  shutil.rmtree(os.path.join(workdir, 'checkpoints', '12'))  # As if stopped at step 6.
  for digit in '345':
    for name in sorted(os.listdir(os.path.join(folder, 'train', digit)))[:100]:
      os.remove(os.path.join(folder, 'train', digit, name))
  _refused(
      workdir,
      helpers.load_config('demo', overrides),
      r'started on a train split of 1437 examples, which has 1137 now: config\.num_epochs=.* makes '
      r'the run 10 steps, not 12, and moves its learning rate schedule: restore the data, or resume '
      r'with --config\.total_steps=12 --config\.num_epochs=None$',
  )
  config = helpers.load_config('demo', {**overrides, 'total_steps': 12, 'num_epochs': None})
  with caplog.at_level('WARNING'):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert 'which has 1137 now: its batches from here on are not those it would have read' in (
      caplog.text
  )
