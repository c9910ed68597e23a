"""Resizing and the eval crops: pp.antialias / pp_eval.antialias downscale as PIL's bilinear resize
(timm's transforms) does, to the bit on uint8 images; without it as TensorFlow's bilinear resize
(the original code's), which the tests import as the reference.
"""

import ml_collections
import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax import defaults
from vit_jax.tools import classifiers
from vit_jax.data import crops
from vit_jax.data import preprocess
from vit_jax.data import resizing


def _image(height: int = 37, width: int = 53, seed: int = 0) -> np.ndarray:
  """Fine detail (noise), where aliasing shows."""
  return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def _pil_rgb(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """timm's resize of a uint8 image: PIL's bilinear filter on the 8-bit RGB image."""
  resized = Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR)
  return np.asarray(resized, np.float32)


def _pil_float(image: np.ndarray, size: int) -> np.ndarray:
  """PIL's bilinear filter on float images (mode 'F', no rounding), one channel at a time."""
  channels = [
      np.asarray(
          Image.fromarray(image[..., c].astype(np.float32)).resize(
              (size, size), Image.Resampling.BILINEAR
          )
      )
      for c in range(3)
  ]
  return np.stack(channels, axis=-1)


def _tensorflow(image: np.ndarray, height: int, width: int) -> np.ndarray:
  tf = helpers.tensorflow()

  return tf.image.resize(image, (height, width), method='bilinear', antialias=False).numpy()


_SHAPES = [
    (37, 53, 16),
    (37, 53, 24),
    (10, 13, 40),
    (1, 7, 5),
    (300, 200, 224),
    (5, 5, 1),
    (224, 224, 224),
]


@pytest.mark.parametrize('height,width,size', _SHAPES)
def test_antialiased_resize_of_uint8_is_pils_8_bit_resize(height, width, size):
  image = _image(height, width)
  got = resizing.resize(image, size, antialias=True)
  # uint8 still: the ops after it move a quarter of float32's bytes; normalize makes it float32.
  assert got.dtype == np.uint8 and got.shape == (size, size, 3) and got.flags.c_contiguous
  np.testing.assert_array_equal(got, _pil_rgb(image, size, size))
  # A crop (a strided view) resizes as the same pixels copied.
  view = _image(height + 4, width + 6)[1:-3, 2:-4]
  np.testing.assert_array_equal(
      resizing.resize(view, size, True), _pil_rgb(np.ascontiguousarray(view), size, size)
  )


@pytest.mark.parametrize('size', [16, 24])
def test_antialiased_resize_of_floats_is_pils_float_resize(size):
  image = _image().astype(np.float32) + 0.25
  np.testing.assert_array_equal(
      resizing.resize(image, size, antialias=True), _pil_float(image, size)
  )
  # In 8 bits PIL rounds after each of its 1-D passes: within a level of the float resize.
  uint8 = _image()
  np.testing.assert_allclose(resizing.resize(uint8, size, True), _pil_float(uint8, size), atol=1)


@pytest.mark.parametrize('height,width,size', _SHAPES)
@pytest.mark.parametrize('dtype', [np.uint8, np.float32])
def test_resize_without_antialiasing_is_tensorflows(height, width, size, dtype):
  image = (_image(height, width) * np.float32(0.7) + 3.3).astype(dtype)
  got = resizing.resize(image, size)
  assert got.dtype == np.float32 and got.shape == (size, size, 3) and got.flags.c_contiguous
  np.testing.assert_allclose(got, _tensorflow(image, size, size), atol=1e-4, rtol=0)


@pytest.mark.parametrize('size', [16, 24])
def test_antialiasing_is_what_tells_the_filters_apart(size):
  """TensorFlow's default reads 2x2 pixels per output: far from PIL's on noise shrunk by 2-3x."""
  image = _image()
  assert np.abs(resizing.resize(image, size) - resizing.resize(image, size, True)).max() > 20


def test_train_and_eval_preprocessing_read_their_field():
  image, size = _image(), 16
  expected = _pil_rgb(image, size, size) / np.float32(127.5) - 1
  config = helpers.load_config(
      'demo',
      {'pp.crop': 'resize', 'pp.antialias': True, 'pp_eval.antialias': True, 'image_size': size},
  )
  train = preprocess.model_input(
      preprocess.train_preprocess(image, (1, 2), pp=config.pp, image_size=size)
  )
  evaluated = preprocess.model_input(
      preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=size)
  )
  np.testing.assert_array_equal(train, expected)
  np.testing.assert_array_equal(evaluated, expected)
  config.pp_eval.antialias = False
  unaliased = preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=size)
  np.testing.assert_allclose(unaliased, _tensorflow(image, size, size) / 127.5 - 1, atol=1e-6)


def test_prediction_prepares_images_as_the_run_did():
  image = _image()
  antialiased = classifiers.model_input(
      image, 16, {'crop': 'resize', 'crop_fraction': 1.0, 'antialias': True}
  )
  np.testing.assert_array_equal(antialiased, _pil_rgb(image, 16, 16) / np.float32(127.5) - 1)
  # An export written before the field prepared images without antialiasing.
  old = classifiers.model_input(image, 16, {'crop': 'resize', 'crop_fraction': 0.875})
  np.testing.assert_allclose(old, _tensorflow(image, 16, 16) / 127.5 - 1, atol=1e-6)


# The central eval crop.


def _central(crop_fraction: float, antialias: bool) -> ml_collections.ConfigDict:
  pp_eval = defaults.get_config().pp_eval
  pp_eval.update(dict(crop='central', crop_fraction=crop_fraction, antialias=antialias))
  return pp_eval


@pytest.mark.parametrize('antialias', [False, True])
@pytest.mark.parametrize(
    'shape,rows,cols', [((256, 320), (16, 240), (48, 272)), ((320, 256), (48, 272), (16, 240))]
)
def test_central_crop_of_the_shorter_side_256_is_its_central_224(shape, rows, cols, antialias):
  image = _image(*shape)
  got = preprocess.eval_preprocess(image, pp_eval=_central(0.875, antialias), image_size=224)
  assert got.dtype == (np.uint8 if antialias else np.float32) and got.flags.c_contiguous
  got = preprocess.model_input(got)
  expected = image[rows[0] : rows[1], cols[0] : cols[1]].astype(np.float32) / np.float32(127.5) - 1
  np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize(
    'height,width,size,crop_fraction', [(375, 500, 224, 0.875), (20, 30, 16, 0.5)]
)
def test_central_crop_without_antialiasing_is_tensorflows_resize_then_the_central_square(
    height, width, size, crop_fraction
):
  image = _image(height, width)
  target = int(size / crop_fraction)
  scaled_h, scaled_w = (int(side * target / min(height, width)) for side in (height, width))
  top, left = round((scaled_h - size) / 2), round((scaled_w - size) / 2)
  expected = _tensorflow(image, scaled_h, scaled_w)[top : top + size, left : left + size]
  np.testing.assert_allclose(
      crops.central_crop(image, size, crop_fraction), expected, atol=1e-4, rtol=0
  )


def test_the_eval_crop_is_checked():
  with pytest.raises(ValueError, match=r"^Unknown config.pp_eval.crop 'middle'"):
    preprocess.check_pp_eval(ml_collections.ConfigDict(dict(crop='middle', crop_fraction=0.875)))
  with pytest.raises(ValueError, match=r'^config.pp_eval.crop_fraction=0.0 must be in \(0, 1\]'):
    preprocess.check_pp_eval(_central(0.0, True))
