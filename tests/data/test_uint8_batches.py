"""uint8 batches: the pipeline hands 8-bit pixels to the step where its ops keep them, and the step
normalises them on the device to what the host's normalize makes, to the bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax import data, sharding
from vit_jax.data import on_device
from vit_jax.data import images as data_images
from vit_jax.data import preprocess
from vit_jax.train import setup as train_setup


def test_the_device_normalises_every_level_to_the_hosts_bits():
  levels = np.repeat(np.arange(256, dtype=np.uint8).reshape(8, 4, 8, 1), 3, axis=-1)
  mesh = sharding.make_mesh((('data', -1),))
  batch = jax.device_put(levels, sharding.batch_sharding(mesh))
  got = np.asarray(jax.jit(on_device.model_input)(batch))
  assert got.dtype == np.float32
  np.testing.assert_array_equal(got, data_images.normalize(levels))
  np.testing.assert_array_equal(got, preprocess.model_input(levels))
  normalised = data_images.normalize(levels)
  np.testing.assert_array_equal(jax.jit(on_device.model_input)(normalised), normalised)


@pytest.mark.parametrize(
    'pp,dtype',
    [
        ({}, np.uint8),
        ({'randaug_layers': 2}, np.uint8),
        ({'crop': 'random', 'pad': 2}, np.uint8),
        ({'antialias': False}, np.float32),  # TensorFlow's resize interpolates between levels.
        ({'three_augment': True}, np.float32),
        ({'color_jitter': 0.4}, np.float32),
        ({'erase_prob': 0.25}, np.float32),  # Erases normalised images.
    ],
    ids=str,
)
def test_train_batches_are_uint8_where_every_op_keeps_8_bit_pixels(data_dir, pp, dtype):
  config = helpers.data_config(data_dir, image_size=12, pp={'crop': 'inception', **pp})
  assert preprocess.train_dtype(config.pp) == dtype
  batch = next(data.train_iterator(config, local_batch_size=16))
  assert batch['image'].dtype == dtype and batch['image'].shape == (16, 12, 12, 3)


@pytest.mark.parametrize('antialias,dtype', [(True, np.uint8), (False, np.float32)])
def test_eval_batches_and_their_padding_are_of_eval_dtype(data_dir, antialias, dtype):
  config = helpers.data_config(data_dir, image_size=12)
  config.pp_eval.antialias = antialias
  batches = list(data.eval_iterator(config, 'test', local_batch_size=100))  # 360: 40 padding rows.
  assert all(b['image'].dtype == dtype for b in batches) and not batches[-1]['mask'].all()


def test_a_uint8_batch_trains_as_its_normalised_float32_batch(tmp_path, data_dir):
  """The same losses and parameters, bit for bit, with mixing on: it mixes the normalised images."""
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'mix.mixup_alpha': 0.8}
  )
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (3, 16, 8, 8, 3), dtype=np.uint8)
  labels = rng.integers(0, 10, (3, 16)).astype(np.int32)
  runs = {}
  for dtype, as_batch in [('uint8', lambda x: x), ('float32', data_images.normalize)]:
    setup = train_setup.prepare(config, str(tmp_path / dtype))
    runs[dtype] = helpers.train_losses(
        setup, [{'image': as_batch(x), 'label': y} for x, y in zip(images, labels)]
    )
  np.testing.assert_array_equal(runs['uint8'][0], runs['float32'][0])
  jax.tree.map(
      np.testing.assert_array_equal,
      jax.device_get(runs['uint8'][1].params),
      jax.device_get(runs['float32'][1].params),
  )
  assert jnp.isfinite(runs['uint8'][0]).all()
