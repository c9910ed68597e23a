"""The masked autoencoder (config.task='mae'): what the encoder sees, the model's tree, the loop's 'mae'
task and fine-tuning from it (its numbers against transformers' ViTMAE: test_mae_vs_torch.py)."""

import os

import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import PIL.Image
import pytest
from flax import traverse_util

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.models import VisionTransformer, freezing, mae as mae_model, mpp, variants
from vit_jax.tasks import mae
from vit_jax.tools import pictures
from vit_jax.train import loop, setup as train_setup


def _mae_and_classifier(**overrides):
  fields = mpp.backbone_fields(variants.get_model_config('ViT-testing_4', overrides))
  decoder = dict(
      decoder_hidden_size=16, decoder_num_layers=1, decoder_num_heads=2, decoder_mlp_dim=32
  )
  return (
      mae_model.MaskedAutoencoder(**fields, **decoder),
      VisionTransformer(num_classes=None, representation_size=None, **fields),
  )


def _images(n=4, size=16, seed=1):
  return jax.random.uniform(jax.random.key(seed), (n, size, size, 3), minval=-1, maxval=1)


def test_patch_pixels_orders_patches_by_rows_and_each_ones_pixels_row_column_channel():
  images = np.arange(2 * 4 * 6 * 3, dtype=np.float32).reshape(2, 4, 6, 3)
  patches = np.asarray(mae_model.patch_pixels(jnp.asarray(images), 2))
  assert patches.shape == (2, 6, 12)
  # Patch 4 is row 1, column 1: pixels (2..3, 2..3).
  np.testing.assert_array_equal(patches[1, 4], images[1, 2:4, 2:4].reshape(-1))


@pytest.mark.parametrize('overrides', [{}, {'classifier': 'gap'}, {'num_registers': 2}])
def test_the_encoder_never_sees_the_hidden_patches(overrides):
  """MAE's premise: the predictions are a function of the visible patches alone. Repainting every
  hidden patch changes no predicted pixel; repainting one visible patch changes them."""
  model, _ = _mae_and_classifier(**overrides)
  images = _images()
  params = model.init({'params': jax.random.key(0)}, images)['params']
  noise = jax.random.uniform(jax.random.key(2), (4, 16))
  apply = jax.jit(lambda x: model.apply({'params': params}, x, noise=noise))
  pixels, hidden = apply(images)
  np.testing.assert_array_equal(hidden.sum(axis=1), 16 - mae_model.visible_patches(16, 0.75))
  # The hidden patches are those of the largest noise.
  np.testing.assert_array_equal(hidden, noise >= jnp.sort(noise)[:, 4:5])
  as_pixels = mae_model.patch_pixels(images, 4)
  repainted = jnp.where(hidden[..., None] > 0, -as_pixels, as_pixels)
  to_images = (
      lambda p: p.reshape(4, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(4, 16, 16, 3)
  )
  np.testing.assert_array_equal(to_images(as_pixels), images)
  np.testing.assert_array_equal(apply(to_images(repainted))[0], pixels)
  visible = jnp.where(hidden[..., None] > 0, as_pixels, -as_pixels)
  assert not np.allclose(apply(to_images(visible))[0], pixels)


def test_without_noise_nothing_is_hidden_and_the_tree_is_the_classifiers_plus_the_decoder():
  model, classifier = _mae_and_classifier()
  images = _images(2)
  params = model.init({'params': jax.random.key(0)}, images)['params']
  chex.assert_trees_all_equal_shapes_and_dtypes(
      {k: v for k, v in params.items() if k != 'decoder'},
      jax.eval_shape(classifier.init, jax.random.key(0), images)['params'],
  )
  assert set(params['decoder']) == {'embed', 'mask_token', 'Transformer', 'pred'}
  pixels, hidden = model.apply({'params': params}, images)
  chex.assert_shape(pixels, (2, 16, 4 * 4 * 3))
  assert not hidden.any()


def test_pixels_image_is_patch_pixels_inverse():
  images = _images(2, 16)
  np.testing.assert_array_equal(
      mae_model.pixels_image(mae_model.patch_pixels(images, 4), (4, 4), 4), images
  )


@pytest.mark.parametrize('norm_pix_loss', [True, False])
def test_the_reconstruction_keeps_the_visible_patches_and_unstandardises_the_drawn_ones(
    norm_pix_loss,
):
  model, _ = _mae_and_classifier()
  images = _images(3)
  params = model.init({'params': jax.random.key(0)}, images)['params']
  drawn, hidden = mae.reconstruction(model, params, images, norm_pix_loss)
  drawn, hidden = mae_model.patch_pixels(drawn, 4), np.asarray(hidden) > 0
  original = np.asarray(mae_model.patch_pixels(images, 4))
  np.testing.assert_array_equal(np.asarray(drawn)[~hidden], original[~hidden])
  # The evaluation's patches: its eval step's mask for the same images.
  noise = mae._evaluation_noise(model, images)  # pylint: disable=protected-access
  pixels, eval_hidden = model.apply({'params': params}, images, noise=noise)
  np.testing.assert_array_equal(hidden, np.asarray(eval_hidden) > 0)
  pixels = np.asarray(pixels)
  if norm_pix_loss:
    scale = np.sqrt(original.var(-1, ddof=1, keepdims=True) + 1e-6)
    pixels = pixels * scale + original.mean(-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(drawn)[hidden], pixels[hidden], rtol=1e-5, atol=1e-5)


def test_norm_pix_loss_targets_are_each_patchs_standardised_pixels():
  images = _images(2)
  targets = np.asarray(mae.pixel_targets(images, 4, True))
  raw = np.asarray(mae_model.patch_pixels(images, 4))
  expected = (raw - raw.mean(-1, keepdims=True)) / np.sqrt(
      raw.var(-1, ddof=1, keepdims=True) + 1e-6
  )
  np.testing.assert_allclose(targets, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(mae.pixel_targets(images, 4, False), raw)


def test_mae_eval_scores_the_same_patches_at_any_eval_batch_size(tmp_path):
  metrics = {}
  for eval_batch_size in (8, 64):  # 360 test images: other rows, other padding.
    config = helpers.load_config(
        'mae_demo',
        {**helpers.TINY, 'data_dir': str(tmp_path / 'tfds'), 'eval_batch_size': eval_batch_size},
    )
    evaluator, model = helpers.evaluator(config, 'eval')
    metrics[eval_batch_size] = evaluator(helpers.random_params(model, config.image_size))
  assert set(metrics[8]) == {'loss'}
  assert metrics[8] == pytest.approx(metrics[64], rel=1e-5)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_mae_pretraining_resumes_then_finetunes(tmp_path):
  data_dir = str(tmp_path / 'tfds')
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'image_size': 16, 'total_steps': 8}
  workdir = str(tmp_path / 'mae')
  metrics = loop.train_and_evaluate(
      train_setup.prepare(helpers.load_config('mae_demo', overrides), workdir)
  )
  assert 0 < metrics['eval_loss'] < 5 and 'eval_top1' not in metrics
  params, _ = run_dir.load_params(workdir)
  assert params['decoder']['pred']['kernel'].shape == (32, 48)
  image = tmp_path / 'digit.png'
  PIL.Image.fromarray(np.uint8(np.arange(16 * 16 * 3).reshape(16, 16, 3) % 256)).save(image)
  drawn = pictures.draw_run(workdir, str(image), str(tmp_path / 'pictures'))
  assert os.path.basename(drawn[-1]) == 'mae_reconstruction.png' and os.path.getsize(drawn[-1])
  helpers.assert_resume_is_bit_exact(
      helpers.load_config('mae_demo', overrides), workdir, str(tmp_path / 'resumed')
  )

  # The fine-tune's model is the run's (variant, sizes; as it was pretrained, without the decoder).
  finetune = helpers.load_config(
      'demo',
      {
          **overrides,
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': workdir,
          'total_steps': 2,
      },
  )
  setup = train_setup.prepare(finetune, str(tmp_path / 'finetune'))
  assert 'decoder' not in setup.init_params
  np.testing.assert_array_equal(
      setup.init_params['embedding']['kernel'], params['embedding']['kernel']
  )
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_loss'])


@pytest.mark.parametrize(
    'overrides', [{'posemb': 'relative'}, {'posemb_where': 'every_layer'}, {'rope': True}]
)
def test_the_encoder_refuses_to_mask_what_cannot_say_where_a_patch_was(overrides):
  model, _ = _mae_and_classifier(**overrides)
  with pytest.raises(ValueError, match='masking patches needs position embeddings added at the'):
    model.init({'params': jax.random.key(0)}, _images(1), noise=jnp.zeros((1, 16)))


@pytest.mark.parametrize('field,size', [('mae.decoder_num_heads', 1), ('mae.decoder_mlp_dim', 63)])
@pytest.mark.devices(8)
def test_tensor_parallelism_refuses_a_decoder_it_cannot_split(tmp_path, data_dir, field, size):
  """The decoder's blocks split by heads and MLP units as the encoder's: one the axis does not divide
  would be kept whole on every device, so training and the planner refuse it."""
  from vit_jax.planning import meshes  # pylint: disable=g-import-not-at-top

  overrides = {'data_dir': data_dir, 'mesh': (('data', 4), ('tensor', 2)), field: size}
  config = helpers.load_config('mae_demo', overrides)
  message = f"tensor=2 does not divide the model's {field}={size}"
  with pytest.raises(ValueError, match=message):
    meshes.check(config, helpers.model_config(config), 8)
  with pytest.raises(ValueError, match=message):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not os.listdir(tmp_path)


@pytest.mark.parametrize('scan', [False, True])
@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_mae_training_on_fsdp_x_tensor_has_the_losses_of_one_device(tmp_path, data_dir, scan):
  """The masking noise drawn for the global batch, the encoder's gather and the decoder's unshuffle
  give every mesh one device's losses and parameters (the blocks scanned or not)."""
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'image_size': 16,
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'model.scan': scan,
  }
  setup = train_setup.prepare(helpers.load_config('mae_demo', overrides), str(tmp_path / 'mesh'))
  (losses, state), (reference, one_state) = helpers.train_on_mesh_and_one_device(
      setup, str(tmp_path / 'one')
  )
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
  # A key's bias adds the same to every logit of a query, which the softmax cancels: its gradient is
  # rounding noise, which Adam scales up to the step size. Those are compared on their scale.
  params, one_params = (
      traverse_util.flatten_dict(jax.device_get(s.params), sep='/') for s in (state, one_state)
  )
  for name, value in params.items():
    atol = 1e-4 if name.endswith('key/bias') else 1e-6
    np.testing.assert_allclose(value, one_params[name], rtol=1e-5, atol=atol, err_msg=name)


def test_low_rank_adapters_train_the_decoder_beside_them():
  """With adapters in the encoder and optim.trained unset, the decoder (new, the task's own) trains
  whole; the encoder's pretrained weights stay as loaded."""
  model, _ = _mae_and_classifier(lora_rank=2)
  params = model.init({'params': jax.random.key(0)}, _images(1))['params']
  optim = ml_collections.ConfigDict({'frozen': (), 'trained': None})
  trained = freezing.trained_regexes(optim, params)
  frozen = {
      path: freezing.is_frozen(optim, trained, path)
      for path in traverse_util.flatten_dict(params, sep='/')
  }
  assert not any(is_frozen for path, is_frozen in frozen.items() if path.startswith('decoder/'))
  assert frozen['embedding/kernel'] and frozen['Transformer/encoderblock_0/LayerNorm_0/scale']
  assert not all(frozen.values()) and sum(not f for f in frozen.values()) > len(params['decoder'])
