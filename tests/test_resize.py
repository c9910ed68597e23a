"""pp.antialias / pp_eval.antialias: downscaling as PIL's bilinear resize (timm's transforms) does.

The reference is PIL itself, on float images (mode 'F', no rounding), one channel at a time.
"""
import ml_collections
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax import predict
from vit_jax.data import preprocess


def _image(height: int = 37, width: int = 53) -> np.ndarray:
  """Fine detail (noise), where aliasing shows."""
  return np.random.RandomState(0).randint(0, 256, (height, width, 3)).astype(np.uint8)


def _pil_bilinear(image: np.ndarray, size: int) -> np.ndarray:
  channels = [np.asarray(Image.fromarray(image[..., c].astype(np.float32), mode='F').resize(
      (size, size), Image.Resampling.BILINEAR)) for c in range(3)]
  return np.stack(channels, axis=-1)


@pytest.mark.parametrize('size', [16, 24])
def test_antialiased_resize_is_pils(size):
  image = _image()
  reference = _pil_bilinear(image, size)
  ours = preprocess.resize(image, size, antialias=True).numpy()
  np.testing.assert_allclose(ours, reference, atol=0.05)
  # TensorFlow's default reads 2x2 pixels per output: far from PIL's on noise shrunk by 2-3x.
  assert np.abs(preprocess.resize(image, size).numpy() - reference).max() > 20


def test_train_and_eval_preprocessing_read_their_field():
  image, size = _image(), 16
  expected = _pil_bilinear(image, size) / 127.5 - 1
  config = helpers.load_config('demo', {'pp.crop': 'resize', 'pp.antialias': True,
                                        'pp_eval.antialias': True, 'image_size': size})
  seed = np.array([1, 2], np.int32)
  train = preprocess.train_preprocess(image, seed, pp=config.pp, image_size=size).numpy()
  evaluated = preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=size).numpy()
  np.testing.assert_allclose(train, expected, atol=1e-3)
  np.testing.assert_allclose(evaluated, expected, atol=1e-3)
  central = ml_collections.ConfigDict({**config.pp_eval, 'crop': 'central', 'crop_fraction': 1.0})
  square = _image(48, 48)  # The shorter side resized to the size, nothing cut.
  np.testing.assert_allclose(preprocess.eval_preprocess(square, pp_eval=central, image_size=size).numpy(),
                             _pil_bilinear(square, size) / 127.5 - 1, atol=1e-3)


def test_prediction_prepares_images_as_the_run_did():
  image = _image()
  antialiased = predict.model_input(image, 16, {'crop': 'resize', 'crop_fraction': 1.0, 'antialias': True})
  np.testing.assert_allclose(antialiased, _pil_bilinear(image, 16) / 127.5 - 1, atol=1e-3)
  # An export written before the field prepared images without antialiasing.
  old = predict.model_input(image, 16, {'crop': 'resize', 'crop_fraction': 0.875})
  np.testing.assert_array_equal(old, preprocess.resize(image, 16).numpy() / 127.5 - 1)
