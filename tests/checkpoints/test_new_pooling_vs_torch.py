"""A new head's own pooling (config.keep_head=False): a downloaded backbone fine-tuned with another
pooling than its checkpoint's, as MAE and BEiT fine-tune a class-token backbone (the patches' mean, a
new LayerNorm after it) and as timm adapts a checkpoint to another `global_pool`. The reference is
timm itself: its model of the new pooling, loading the file timm saved for the old one (timm drops
the checkpoint's `norm` or `attn_pool` and starts `fc_norm` at scale 1 and bias 0).
"""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import timm
import torch
import transformers

import helpers
from torch_references import (
    TIMM_TINY,
    prepared_from_checkpoint,
    randomize,
    timm_input,
    timm_saved,
    torch_outputs,
)
from vit_jax.models import pooling
from vit_jax.tasks import classification
from vit_jax.train import setup

SIZE = 28
_TINY = {**TIMM_TINY, 'img_size': SIZE, 'patch_size': 7, 'mlp_ratio': 4.0, 'num_classes': 0}


def _saved(directory, architecture: str):
  """A random tiny timm `architecture` without a head, saved as the hub's directories are."""
  return timm_saved(directory, architecture, **_TINY)


def _timm_adapted(directory, architecture: str, **pooling):
  """timm's `architecture` with the arguments `pooling`, loading the checkpoint in `directory` as
  timm's pretrained loading adapts it."""
  return timm.create_model(
      architecture,
      pretrained=True,
      pretrained_cfg_overlay={'file': str(directory / 'model.safetensors')},
      **_TINY,
      **pooling,
  ).eval()


def _features(run: setup.Setup, inputs: np.ndarray) -> np.ndarray:
  """What the run's new zero head reads: its pooled, normalised features."""
  features = classification.features_model(run.config, run.model_config)
  params = {k: v for k, v in run.init_params.items() if k != 'head'}
  return np.asarray(features.apply({'params': params}, inputs))


def _images(n: int) -> np.ndarray:
  return np.random.RandomState(2).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


@pytest.mark.parametrize(
    'architecture,fields,timm_pooling',
    [
        # MAE's fine-tuning of a class-token backbone: the class token stays, unpooled.
        (
            'vit_base_patch16_224',
            {'model.classifier': 'gap', 'model.fc_norm': True},
            {'global_pool': 'avg'},
        ),
        # SigLIP's attention pooling dropped for the patches' mean, the encoder's norm kept.
        (
            'vit_base_patch16_siglip_224',
            {'model.classifier': 'gap'},
            {'global_pool': 'avg', 'fc_norm': False},
        ),
        # And normalised after the mean instead.
        (
            'vit_base_patch16_siglip_224',
            {'model.classifier': 'gap', 'model.fc_norm': True},
            {'global_pool': 'avg', 'fc_norm': True},
        ),
        # A MAP head over the register too (map_include_prefix): no field of the patches' mean.
        (
            'test_vit3',
            {'model.classifier': 'gap'},
            {'global_pool': 'avg', 'fc_norm': False, 'pool_include_prefix': False},
        ),
    ],
)
def test_a_new_head_pools_a_downloaded_backbone_as_timm_adapts_it(
    tmp_path, architecture, fields, timm_pooling
):
  _saved(tmp_path / 'downloaded', architecture)
  run = prepared_from_checkpoint(
      tmp_path / 'workdir', str(tmp_path / 'downloaded'), SIZE, keep_head=False, **fields
  )
  for name, value in fields.items():
    assert run.model_config[name.removeprefix('model.')] == value
  theirs = _timm_adapted(tmp_path / 'downloaded', architecture, **timm_pooling)
  inputs = _images(3)
  np.testing.assert_allclose(
      _features(run, inputs),
      torch_outputs(theirs, timm_input(theirs, inputs)).numpy(),
      atol=1e-4,
  )
  # The checkpoint's MAP head's fields are not the new pooling's.
  assert run.model_config['map_heads'] is None and not run.model_config['map_include_prefix']


def test_a_kept_head_keeps_the_checkpoints_pooling(tmp_path):
  _saved(tmp_path / 'downloaded', 'vit_base_patch16_224')
  with pytest.raises(
      ValueError,
      match=r"^config.model.classifier='gap' contradicts config.init_from, whose classifier is "
      r"'token': .*, set --config.keep_head=False for a new head that pools otherwise, or load "
      r'another checkpoint$',
  ):
    prepared_from_checkpoint(
        tmp_path / 'workdir',
        str(tmp_path / 'downloaded'),
        SIZE,
        keep_head=True,
        **{'model.classifier': 'gap'},
    )


@pytest.mark.parametrize('map_heads', [None, 1])
def test_a_new_map_head_is_drawn_as_a_model_from_scratch_draws_it(tmp_path, map_heads):
  """A class-token backbone fine-tuned with attention pooling (big_vision's 'map'): the MAP head,
  of the run's own heads, drawn from config.seed as the model's init draws it; the rest as loaded.
  """
  _saved(tmp_path / 'downloaded', 'vit_base_patch16_224')
  pooled = {
      'model.classifier': 'map',
      'model.class_token': True,
      'model.map_heads': map_heads,
      'seed': 3,
  }
  run = prepared_from_checkpoint(
      tmp_path / 'workdir', str(tmp_path / 'downloaded'), SIZE, keep_head=False, **pooled
  )
  model = run.model
  expected = pooling.map_head(model).init(jax.random.key(3), jnp.zeros((1, 1, 32)))['params']
  chex.assert_trees_all_close(run.init_params['MAPHead_0'], expected)
  kernel = run.init_params['MAPHead_0']['MultiHeadDotProductAttention_0']['query']['kernel']
  assert kernel.shape == (32, map_heads or 2, 32 // (map_heads or 2))
  token = prepared_from_checkpoint(
      tmp_path / 'token', str(tmp_path / 'downloaded'), SIZE, keep_head=False
  )
  shared = {k: v for k, v in token.init_params.items() if k not in ('head', 'MAPHead_0')}
  chex.assert_trees_all_equal(shared, {k: v for k, v in run.init_params.items() if k in shared})
  assert np.isfinite(_features(run, _images(2))).all()


@pytest.mark.parametrize('config_name', ['finetune_mae:cifar10', 'finetune_layer_decay:mae'])
def test_the_mae_configs_fine_tune_as_mae_does(tmp_path, config_name):
  """configs/finetune_mae.py and finetune_layer_decay.py:mae with a tiny random MAE-shaped
  checkpoint (timm's vit_*_patch16_224.mae: a class-token ViT without a head) and the digits."""
  _saved(tmp_path / 'downloaded', 'vit_base_patch16_224')
  config = helpers.load_config(
      config_name,
      {
          'init_from': str(tmp_path / 'downloaded'),
          'dataset': 'digits',
          'train_split': 'train',
          'eval_split': 'test',
          'evals': ml_collections.ConfigDict(),
          'image_size': SIZE,
          'batch_size': 16,
          'eval_batch_size': 16,
          'dtype': 'float32',
      },
  )
  run = setup.prepare(config, str(tmp_path / 'workdir'))
  fields = ('classifier', 'class_token', 'fc_norm', 'hidden_size', 'drop_path_rate')
  assert tuple(run.model_config[k] for k in fields) == ('gap', True, True, 32, 0.1)
  theirs = _timm_adapted(tmp_path / 'downloaded', 'vit_base_patch16_224', global_pool='avg')
  inputs = _images(2)
  np.testing.assert_allclose(
      _features(run, inputs), torch_outputs(theirs, timm_input(theirs, inputs)).numpy(), atol=1e-4
  )


def test_transformers_mae_fine_tunes_on_the_mean_of_its_encoders_patches(tmp_path):
  """transformers' ViTMAEForPreTraining (the hub's facebook/vit-mae-*) with MAE's pooling: its
  encoder's last hidden states before their final LayerNorm, the patches' mean, LayerNormed afresh.
  """
  mae = randomize(
      transformers.ViTMAEForPreTraining(
          transformers.ViTMAEConfig(
              image_size=SIZE,
              patch_size=7,
              hidden_size=32,
              num_hidden_layers=2,
              num_attention_heads=2,
              intermediate_size=64,
              mask_ratio=0.0,
              decoder_hidden_size=16,
              decoder_num_hidden_layers=1,
              decoder_num_attention_heads=2,
              decoder_intermediate_size=32,
          )
      )
  )
  mae.save_pretrained(tmp_path / 'downloaded')
  run = prepared_from_checkpoint(
      tmp_path / 'workdir',
      str(tmp_path / 'downloaded'),
      SIZE,
      keep_head=False,
      **{'model.classifier': 'gap', 'model.fc_norm': True},
  )
  inputs = _images(3)
  # Unmasked, the encoder still shuffles the patches (after their position embeddings): their mean
  # is the same.
  hidden = torch_outputs(mae.vit, inputs, output_hidden_states=True).hidden_states[-1]
  expected = torch.nn.functional.layer_norm(hidden[:, 1:].mean(1), (32,), eps=1e-12)
  np.testing.assert_allclose(_features(run, inputs), expected.numpy(), atol=1e-4)
