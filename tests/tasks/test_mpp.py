"""Masked patch prediction: targets, corruption, the model (pure and hybrid), the loop's 'mpp' task and
fine-tuning from it."""

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import traverse_util

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.models import VisionTransformer, freezing, mpp, variants
from vit_jax.train import loop, setup as train_setup


def test_colour_targets_quantise_mean_colour_to_3_bits_per_channel():
  images = -np.ones((1, 8, 8, 3), np.float32)
  images[0, :4, 4:] = [1.0, -1.0, -1.0]  # Top-right patch: pure red.
  images[0, 4:, 4:] = 1.0  # Bottom-right: white.
  images[0, 4:, :4, 1] = 0.0  # Bottom-left: green channel at the middle level (4 of 0..7).
  np.testing.assert_array_equal(
      mpp.colour_targets(jnp.asarray(images), 4, 3), [[0, 7 * 64, 4 * 8, 511]]
  )


@pytest.mark.parametrize('length', [4, 256])  # 4: a patch's own embedding would be 1 in 4 "others".
@pytest.mark.parametrize('per_example_keys', [False, True])
def test_corruption_follows_the_bert_proportions(per_example_keys, length):
  n = 16384 // length
  x = jnp.broadcast_to(jnp.arange(length, dtype=jnp.float32)[None, :, None] + 1, (n, length, 1))
  key = jax.random.split(jax.random.key(0), n) if per_example_keys else jax.random.key(0)
  out, corrupted = mpp.corrupt_patches(x, jnp.full((1, 1, 1), -7.0), key, 0.5)
  out, corrupted, x = np.asarray(out[..., 0]), np.asarray(corrupted), np.asarray(x[..., 0])
  assert abs(corrupted.mean() - 0.5) < 0.01
  assert np.array_equal(out[~corrupted], x[~corrupted])  # Untouched outside the corrupted set.
  masked = (out == -7.0)[corrupted].mean()
  changed = ((out != x) & (out != -7.0))[corrupted].mean()  # Another patch's embedding.
  assert abs(masked - 0.8) < 0.02 and 0.09 < changed < 0.11


def test_an_examples_own_key_gives_it_its_own_pattern_in_any_row():
  x = jax.random.normal(jax.random.key(1), (8, 16, 4))
  keys = jax.random.split(jax.random.key(0), 8)
  token = jnp.full((1, 1, 4), -7.0)
  out, corrupted = mpp.corrupt_patches(x, token, keys, 0.5)
  order = np.array([5, 2, 7, 0, 1, 3, 6, 4])
  out_reordered, corrupted_reordered = mpp.corrupt_patches(x[order], token, keys[order], 0.5)
  np.testing.assert_array_equal(corrupted_reordered, corrupted[order])
  np.testing.assert_array_equal(out_reordered, out[order])
  alone, _ = mpp.corrupt_patches(x[3:4], token, keys[3:4], 0.5)
  np.testing.assert_array_equal(alone[0], out[3])


def test_mpp_eval_scores_the_same_patterns_at_any_eval_batch_size(tmp_path):
  metrics = {}
  for eval_batch_size in (8, 64):  # 360 test images: other rows, other padding.
    config = helpers.load_config(
        'mpp_demo',
        {
            **helpers.TINY,
            'data_dir': str(tmp_path / 'tfds'),
            'eval_batch_size': eval_batch_size,
        },
    )
    evaluator, model = helpers.evaluator(config, 'eval')
    metrics[eval_batch_size] = evaluator(helpers.random_params(model, config.image_size))
  assert metrics[8] == pytest.approx(metrics[64], rel=1e-5)


def _mpp_and_classifier(variant, **overrides):
  config = mpp.backbone_fields(variants.get_model_config(variant, overrides))
  return (
      mpp.MaskedPatchPredictor(**config),
      VisionTransformer(num_classes=None, representation_size=None, **config),
  )


@pytest.mark.parametrize(
    'variant,overrides,image_size,tokens',
    [
        ('ViT-testing_4', {}, 16, 16),
        ('ViT-testing_4', {'classifier': 'gap'}, 16, 16),
        # The hybrid: an 8x ResNet stem, 1x1 patches of its feature map: a token per 8x8 input pixels.
        ('R50+ViT-testing_8', {'resnet_layers': (1, 1), 'resnet_width_factor': 0.5}, 16, 4),
    ],
)
@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_mpp_model_is_the_vit_plus_mask_token_and_head(variant, overrides, image_size, tokens):
  model, classifier = _mpp_and_classifier(variant, **overrides)
  images = jax.random.uniform(
      jax.random.key(1), (2, image_size, image_size, 3), minval=-1, maxval=1
  )
  # Jitted: run op by op, the init of even a tiny hybrid takes half a minute on CPU.
  params = jax.jit(model.init)({'params': jax.random.key(0), 'mpp': jax.random.key(1)}, images)[
      'params'
  ]
  # The classifier's tree, names and shapes, plus the two MPP parameters: fine-tuning starts from it.
  vit_params = {k: v for k, v in params.items() if k not in ('mask_token', 'mpp_head')}
  chex.assert_trees_all_equal_shapes_and_dtypes(
      vit_params, jax.eval_shape(classifier.init, jax.random.key(0), images)['params']
  )
  chex.assert_shape(params['mask_token'], (1, 1, 32))
  logits, corrupted = jax.jit(
      lambda p, x: model.apply({'params': p}, x, rngs={'mpp': jax.random.key(2)})
  )(params, images)
  chex.assert_shape(logits, (2, tokens, 512))
  chex.assert_shape(corrupted, (2, tokens))
  chex.assert_tree_all_finite(logits)
  targets = mpp.colour_targets(images, model.input_stride, model.num_bits)
  chex.assert_shape(targets, (2, tokens))  # One colour class per token.
  assert (image_size // model.input_stride) ** 2 == tokens


def test_hybrid_mpp_targets_are_the_colours_of_the_input_regions_its_tokens_cover():
  model, _ = _mpp_and_classifier('R50+ViT-testing_8', resnet_layers=(1, 1))
  assert model.input_stride == 8 and model.patch_size == 1
  images = -np.ones((1, 16, 16, 3), np.float32)
  images[0, :8, 8:] = 1.0  # Top-right token's 8x8 region: white.
  np.testing.assert_array_equal(
      mpp.colour_targets(jnp.asarray(images), model.input_stride, 3), [[0, 511, 0, 0]]
  )


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_mpp_pretraining_then_finetuning(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  pretrain = helpers.load_config(
      'mpp_demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 6}
  )
  workdir = str(tmp_path / 'mpp')
  metrics = loop.train_and_evaluate(train_setup.prepare(pretrain, workdir))
  # The colour-class accuracy over corrupted patches: above chance (1/512) already.
  assert 0.05 < metrics['eval_top1'] <= 1.0
  params, _ = run_dir.load_params(workdir)
  assert params['mpp_head']['kernel'].shape == (32, 512) and params['mask_token'].shape == (
      1,
      1,
      32,
  )

  finetune = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'init_from': workdir, 'total_steps': 2}
  )
  setup = train_setup.prepare(finetune, str(tmp_path / 'finetune'))
  assert 'mpp_head' not in setup.init_params and 'mask_token' not in setup.init_params
  np.testing.assert_array_equal(
      setup.init_params['embedding']['kernel'], params['embedding']['kernel']
  )
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_loss'])


def test_low_rank_adapters_train_the_mpp_head_and_mask_token_beside_them():
  model, _ = _mpp_and_classifier('ViT-testing_4', lora_rank=2)
  images = jnp.zeros((1, 16, 16, 3))
  params = model.init({'params': jax.random.key(0), 'mpp': jax.random.key(1)}, images)['params']
  optim = ml_collections.ConfigDict({'frozen': (), 'trained': None})
  trained = freezing.trained_regexes(optim, params)
  frozen = {
      path: freezing.is_frozen(optim, trained, path)
      for path in traverse_util.flatten_dict(params, sep='/')
  }
  assert not frozen['mpp_head/kernel'] and not frozen['mask_token']
  assert frozen['embedding/kernel']
