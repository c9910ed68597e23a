"""config.variant='checkpoint' over a vit_jax run's workdir: the model of the run that trained the
parameters, its variant and the fields that fix their function, not how it was trained."""

import os

import numpy as np
import pytest

import helpers
from vit_jax import data, defaults
from vit_jax.checkpoints import checkpoint, run_dir, warm_start
from vit_jax.models import freezing, variants
from vit_jax.train import loop, setup as train_setup, state as train_state


def _run(tmp_path, variant: str, **model) -> str:
  """A run's directory as the loop leaves it, its config.json saying `variant` and `model`, with an
  (empty) checkpoint of step 4: all that the model's fields are read from."""
  workdir = tmp_path / 'run'
  os.makedirs(workdir / 'checkpoints' / '4' / 'default')
  config = defaults.get_config()
  config.variant = variant
  config.model.update(model)
  run_dir.write_run_info(
      str(workdir), config, data.DatasetInfo(num_classes=3, num_train=9, num_eval=3, class_names=())
  )
  return str(workdir)


def _filled(init_from: str, **overrides):
  config = defaults.get_config()
  config.variant = 'checkpoint'
  config.init_from = init_from
  for key, value in overrides.items():
    *parents, field = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[field] = value
  warm_start.fill_from_checkpoint(config)
  return config


@pytest.mark.parametrize(
    'variant, model',
    [
        ('ViT-testing_4', {'hidden_size': 48, 'qk_norm': True, 'num_registers': 2}),
        ('Axial-ViT-testing_4', {}),  # Its axial blocks are the name's alone.
        ('R50+ViT-testing_16', {'resnet_layers': (1, 1, 1)}),
        ('BiT-R50x1', {'resnet_width_factor': 0.5, 'resnet_layers': (1, 2, 1, 1)}),
        # A run that was itself fine-tuned from a timm or transformers checkpoint.
        (
            'checkpoint',
            dict(
                patch_size=4, hidden_size=48, num_layers=2, mlp_dim=64, num_heads=2, layer_scale=0.1
            ),
        ),
    ],
)
def test_a_workdir_gives_its_variant_and_the_model_its_parameters_compute(tmp_path, variant, model):
  config = _filled(_run(tmp_path, variant, **model))
  assert config.variant == variant
  trained = variants.get_model_config(variant, model)
  ours = variants.get_model_config(config.variant, config.model.to_dict())
  assert {k: v for k, v in ours.items() if k != 'class_token'} == {
      k: v for k, v in trained.items() if k != 'class_token'
  }


def test_a_step_directory_reads_as_its_workdir(tmp_path):
  run = _run(tmp_path, 'ViT-testing_4', hidden_size=48)
  config = _filled(os.path.join(run, 'checkpoints', '4'))
  assert (config.variant, config.model.hidden_size) == ('ViT-testing_4', 48)


def test_how_the_run_trained_is_the_fine_tunes_own_choice(tmp_path):
  """Regularisation, kernels, scanning and adapters are not the parameters' function: the fine-tune's
  own (unset: the variant's defaults), as its config says."""
  run = _run(
      tmp_path,
      'ViT-testing_4',
      dropout_rate=0.3,
      drop_path_rate=0.2,
      head_dropout_rate=0.1,
      scan=True,
      remat='nothing_saveable',
      lora_rank=4,
  )
  config = _filled(run, **{'model.drop_path_rate': 0.05})
  assert config.model.drop_path_rate == 0.05
  for field in ('dropout_rate', 'head_dropout_rate', 'scan', 'remat', 'lora_rank', 'lora_alpha'):
    assert config.model[field] is None, field


def test_a_field_the_run_contradicts_is_a_one_line_error(tmp_path):
  run = _run(tmp_path, 'ViT-testing_4', hidden_size=48)
  with pytest.raises(
      ValueError,
      match=r'^config.model.hidden_size=64 contradicts config.init_from, whose hidden_size is 48: '
      r"drop that setting \(config.variant='checkpoint' takes it from the checkpoint\), or load",
  ):
    _filled(run, **{'model.hidden_size': 64})


def test_a_new_head_may_pool_a_class_token_run_otherwise(tmp_path):
  """MAE's and BEiT's fine-tuning: the patches' mean of a class-token backbone, normalised after."""
  run = _run(tmp_path, 'ViT-testing_4')  # classifier 'token': a class token, by its pooling.
  gap = {'model.classifier': 'gap', 'model.fc_norm': True}
  config = _filled(run, **gap)
  assert (config.model.classifier, config.model.class_token, config.model.fc_norm) == (
      'gap',
      True,
      True,
  )
  with pytest.raises(ValueError, match='set --config.keep_head=False for a new head that pools'):
    _filled(run, keep_head=True, **gap)


def test_a_directory_that_is_no_run_names_what_init_from_takes(tmp_path):
  with pytest.raises(
      ValueError,
      match=r"^config.variant='checkpoint' builds the model of .* or the "
      r'workdir of a vit_jax run, not .*: set --config.init_from, or name a variant',
  ):
    _filled(str(tmp_path))
  (tmp_path / 'config.json').write_text('{}')  # A Hugging Face model's directory without weights.
  with pytest.raises(
      ValueError, match=r'has no checkpoints/ directory: pass the workdir of a vit_jax run that'
  ):
    _filled(str(tmp_path))


def test_finetuning_a_workdir_starts_from_its_parameters_in_its_model(
    tmp_path, data_dir, trained_tiny_run
):
  """The tiny run's sizes unset in the fine-tune's config: its model is the run's, and its parameters
  all but the head are the run's."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': trained_tiny_run,
          'data_dir': data_dir,
          'total_steps': 2,
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'finetune'))
  stored, _ = run_dir.load_run_info(trained_tiny_run)
  assert setup.config.variant == stored.variant
  assert setup.model_config['hidden_size'] == stored.model.hidden_size == 32
  trained = helpers.flat_params(run_dir.load_params(trained_tiny_run)[0])
  started = helpers.flat_params(setup.init_params)
  assert set(started) == set(trained)
  for name, value in trained.items():
    if not name.startswith('head/'):  # A new head, as keep_head=False says.
      np.testing.assert_array_equal(started[name], value, err_msg=name)


@pytest.mark.parametrize(
    'task,frozen,fresh',
    [
        # keep_head=False: a new zero head, which would never train.
        ('demo', '^head/', 'head/bias'),
        # A learned decoder position embedding the checkpoint has none of (configs/mae_continue.py's
        # frozen posembs over an encoder alone): random, and it would stay so.
        ('mae_demo', 'posembed_input/', 'decoder/Transformer/posembed_input/pos_embedding'),
    ],
)
def test_freezing_what_starts_afresh_is_a_one_line_error(
    tmp_path, data_dir, trained_tiny_run, task, frozen, fresh
):
  overrides = {
      **helpers.TINY,
      **helpers.UNSET_SIZES,
      'data_dir': data_dir,
      'total_steps': 2,
      'variant': 'checkpoint',
      'init_from': trained_tiny_run,
      'optim.frozen': (frozen,),
  }
  if task == 'mae_demo':
    overrides['mae.decoder_posemb'] = 'learn'
  config = helpers.load_config(task, overrides)
  with pytest.raises(ValueError, match=f'^{fresh} starts afresh .* freeze it at that start') as e:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(e.value)
  assert ('decoder_posemb=sincos2d_mae' in str(e.value)) == (task == 'mae_demo')


def test_a_new_map_head_trains_beside_low_rank_adapters(tmp_path, data_dir, trained_tiny_run):
  """Adapters freeze what they adapt; a MAP head the checkpoint has none of starts random, so it
  trains, as the head does (it stayed random and frozen)."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          **helpers.UNSET_SIZES,
          'data_dir': data_dir,
          'total_steps': 2,
          'variant': 'checkpoint',
          'init_from': trained_tiny_run,
          'model.classifier': 'map',
          'model.lora_rank': 2,
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert setup.config.optim.trained == (*freezing.TRAINED_WITH_ADAPTERS, '^MAPHead_0/')
  started = helpers.flat_params(setup.init_params)
  loop.train_and_evaluate(setup)
  trained = helpers.flat_params(run_dir.load_params(str(tmp_path / 'run'))[0])
  kernel = 'MAPHead_0/MlpBlock_0/Dense_0/kernel'
  assert not np.array_equal(trained[kernel], started[kernel])


@pytest.mark.parametrize('task', ['mae_demo', pytest.param('mpp_demo', marks=pytest.mark.slow)])
def test_a_self_supervised_run_from_a_classifier_draws_its_own_layers_as_from_scratch(
    tmp_path, data_dir, trained_tiny_run, task
):
  """Continuing self-supervised pretraining from a checkpoint without the task's layers (a classifier,
  timm's encoder-only MAE weights): the encoder is the checkpoint's, MAE's decoder (MPP's head and
  mask token) what a run from scratch with the same seed starts from."""
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 2}
  config = helpers.load_config(
      task,
      {**overrides, **helpers.UNSET_SIZES, 'variant': 'checkpoint', 'init_from': trained_tiny_run},
  )
  setup = train_setup.prepare(config, str(tmp_path / 'continued'))
  scratch = train_setup.prepare(helpers.load_config(task, overrides), str(tmp_path / 'scratch'))
  state, _, _ = train_state.create_state(scratch, checkpoint.make_manager(scratch.workdir, keep=1))
  drawn, started = helpers.flat_params(state.params), helpers.flat_params(setup.init_params)
  trained = helpers.flat_params(run_dir.load_params(trained_tiny_run)[0])
  own = ('decoder/',) if task == 'mae_demo' else ('mpp_head/', 'mask_token')
  assert set(started) == set(drawn) and any(name.startswith(own) for name in started)
  for name, value in started.items():
    expected = drawn[name] if name.startswith(own) else trained[name]
    np.testing.assert_array_equal(value, expected, err_msg=name)
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_loss'])
