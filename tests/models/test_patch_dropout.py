"""Patch dropout (`model.patch_dropout`, vit_jax/models/patch_dropout.py): what the blocks see at train
time, evaluation untouched, the draw, the planner's count, and a run that trains with it. Its logits
against timm's `patch_drop_rate` are in tests/checkpoints/test_state_dicts_vs_torch.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax.models import VisionTransformer, patch_dropout, variants
from vit_jax.planning import chips
from vit_jax.train import loop, setup as train_setup

# 16 px images of 4 px patches: 16 patches, 8 of them kept at 0.5. No other dropout, so that train
# mode differs from evaluation by the patches alone.
_FIELDS = {'patch_dropout': 0.5, 'dropout_rate': 0.0, 'drop_path_rate': 0.0}


def _model(classifier: str, **fields) -> VisionTransformer:
  config = variants.get_model_config(
      'ViT-testing_4', {**_FIELDS, 'classifier': classifier, **fields}
  )
  return VisionTransformer(num_classes=5, **config)


def _params(model):
  return model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params']


def _random_head(params):
  """The zero-initialised head drawn at random, so that the logits depend on the features."""
  head = dict(params['head'])
  head['kernel'] = jax.random.normal(jax.random.key(1), head['kernel'].shape)
  return {**params, 'head': head}


@pytest.mark.parametrize('classifier', ['token', 'gap', 'map'])
def test_the_dropped_patches_change_nothing_and_the_kept_ones_do(classifier):
  """With the noise given, the logits do not depend on the pixels of the 8 patches of the largest
  noise, and do on each of the 8 others."""
  model = _model(classifier)
  params = _random_head(_params(model))
  images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
  noise = jax.random.normal(jax.random.key(3), (2, 16))
  dropped = np.argsort(np.asarray(noise), axis=1)[:, 8:]

  def logits(images):
    return model.apply({'params': params}, images, train=True, patch_noise=noise)

  base = logits(images)
  for patch in range(16):
    row, column = divmod(patch, 4)
    changed = images.at[:, 4 * row : 4 * row + 4, 4 * column : 4 * column + 4].add(1.0)
    moved = np.abs(np.asarray(logits(changed) - base)).max(axis=1)
    for image in range(2):
      if patch in dropped[image]:
        assert moved[image] == 0, (image, patch)
      else:
        assert moved[image] > 1e-4, (image, patch)


def test_evaluation_sees_every_patch():
  model = _model('token')
  params = _random_head(_params(model))
  without = _model('token', patch_dropout=0.0)
  images = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
  np.testing.assert_array_equal(
      model.apply({'params': params}, images), without.apply({'params': params}, images)
  )
  trained = model.apply({'params': params}, images, train=True, rngs={'dropout': jax.random.key(4)})
  assert not np.allclose(trained, without.apply({'params': params}, images), atol=1e-4)


def test_the_draw_is_the_dropout_streams():
  model = _model('gap')
  params = _random_head(_params(model))
  images = jnp.ones((1, 16, 16, 3)) * jnp.linspace(-1, 1, 16)[:, None, None]

  def logits(seed):
    return model.apply(
        {'params': params}, images, train=True, rngs={'dropout': jax.random.key(seed)}
    )

  np.testing.assert_array_equal(logits(0), logits(0))
  assert len({tuple(np.asarray(logits(seed)).round(6)[0]) for seed in range(6)}) > 1


@pytest.mark.parametrize(
    'num_patches, rate, expected', [(196, 0.5, 98), (16, 0.3, 11), (4, 0.9, 1)]
)
def test_the_kept_count_is_timms(num_patches, rate, expected):
  assert patch_dropout.kept(num_patches, rate) == expected  # max(1, int(L * (1 - rate)))
  assert patch_dropout.kept_patches(jnp.zeros((3, num_patches)), rate).shape == (3, expected)


def test_the_planner_counts_the_kept_patches_in_the_train_step_alone():
  """ViT-B/16 at 224 px, half its patches dropped: the train step's blocks see 1 + 98 tokens, an
  evaluation's 1 + 196."""
  model = variants.get_model_config('ViT-B_16', {'patch_dropout': 0.5})
  full = variants.get_model_config('ViT-B_16')
  assert chips.vit_tokens(model, 224, train=True) == 99
  assert chips.vit_tokens(model, 224) == chips.vit_tokens(full, 224) == 197
  assert chips.vit_flops(model, 224) == chips.vit_flops(full, 224)
  ratio = chips.train_flops(model, 224, 1000, None) / chips.train_flops(full, 224, 1000, None)
  assert 0.45 < ratio < 0.55  # The patch embedding and the head are a little of it.


def test_a_run_trains_and_evaluates_with_patch_dropout(tmp_path, data_dir):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'model.patch_dropout': 0.5}
  )
  loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  scalars = helpers.read_scalars(str(tmp_path))
  assert np.isfinite(scalars['train_loss'][12]) and 0 <= scalars['eval_top1'][12] <= 1
