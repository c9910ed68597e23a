"""Masked patch prediction: targets, corruption, the loop's 'mpp' task and fine-tuning from it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax import checkpoint, train
from vit_jax.models import mpp


def test_colour_targets_quantise_mean_colour_to_3_bits_per_channel():
  images = -np.ones((1, 8, 8, 3), np.float32)
  images[0, :4, 4:] = [1.0, -1.0, -1.0]  # Top-right patch: pure red.
  images[0, 4:, 4:] = 1.0  # Bottom-right: white.
  images[0, 4:, :4, 1] = 0.0  # Bottom-left: green channel at the middle level (4 of 0..7).
  np.testing.assert_array_equal(mpp.colour_targets(jnp.asarray(images), 4, 3),
                                [[0, 7 * 64, 4 * 8, 511]])


def test_corruption_follows_the_bert_proportions():
  n, length = 64, 256
  x = jnp.broadcast_to(jnp.arange(length, dtype=jnp.float32)[None, :, None] + 1, (n, length, 1))
  out, corrupted = mpp.corrupt_patches(x, jnp.full((1, 1, 1), -7.0), jax.random.key(0), 0.5)
  out, corrupted, x = np.asarray(out[..., 0]), np.asarray(corrupted), np.asarray(x[..., 0])
  assert abs(corrupted.mean() - 0.5) < 0.01
  assert np.array_equal(out[~corrupted], x[~corrupted])  # Untouched outside the corrupted set.
  masked = (out == -7.0)[corrupted].mean()
  changed = ((out != x) & (out != -7.0))[corrupted].mean()  # Another patch's embedding.
  assert abs(masked - 0.8) < 0.02 and 0.08 < changed < 0.11


def test_mpp_pretraining_then_finetuning(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  pretrain = helpers.load_config('mpp_demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 6})
  workdir = str(tmp_path / 'mpp')
  metrics = train.train_and_evaluate(train.prepare(pretrain, workdir))
  # The colour-class accuracy over corrupted patches: above chance (1/512) already.
  assert 0.05 < metrics['eval_top1'] <= 1.0
  params, _ = checkpoint.load_params(workdir)
  assert params['mpp_head']['kernel'].shape == (32, 512) and params['mask_token'].shape == (1, 1, 32)

  finetune = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, 'init_from': workdir,
                                          'total_steps': 2})
  setup = train.prepare(finetune, str(tmp_path / 'finetune'))
  assert 'mpp_head' not in setup.init_params and 'mask_token' not in setup.init_params
  np.testing.assert_array_equal(setup.init_params['embedding']['kernel'], params['embedding']['kernel'])
  assert np.isfinite(train.train_and_evaluate(setup)['eval_loss'])


def test_mpp_has_no_pre_logits(tmp_path):
  config = helpers.load_config('mpp_demo', {**helpers.TINY, 'data_dir': str(tmp_path / 'tfds'),
                                            'model.representation_size': 16})
  with pytest.raises(ValueError, match='unset config.model.representation_size'):
    train.prepare(config, str(tmp_path / 'w'))
