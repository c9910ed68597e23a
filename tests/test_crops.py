"""pp.crop='random_resized': torchvision's RandomResizedCrop sampler (timm's train crop), against
torchvision's own `get_params`."""
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import torch
from scipy import stats
from torchvision import transforms

from vit_jax.data import preprocess

_RATIO = (3 / 4, 4 / 3)


@tf.function
def _our_boxes(shape: tf.Tensor, seeds: tf.Tensor, min_area: float) -> tf.Tensor:
  """[n, 4] rows of (top, left, height, width), one per seed."""
  def box(seed):
    begin, size = preprocess.random_resized_box(shape, seed, min_area)
    return tf.concat([begin[:2], size[:2]], 0)
  return tf.map_fn(box, seeds, fn_output_signature=tf.int32)


def _torchvision_boxes(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  torch.manual_seed(0)
  image = torch.zeros(3, height, width)
  return np.array([transforms.RandomResizedCrop.get_params(image, (min_area, 1.0), _RATIO)
                   for _ in range(n)])


def _ours(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  seeds = tf.constant(np.stack([np.arange(n), np.full(n, 7)], axis=1), tf.int32)
  return _our_boxes(tf.constant([height, width, 3]), seeds, min_area).numpy()


@pytest.mark.parametrize('height,width,min_area', [(48, 64, 0.3), (40, 40, 0.08), (30, 90, 0.5)])
def test_boxes_are_distributed_as_torchvisions(height, width, min_area):
  n = 3000
  ours, reference = _ours(height, width, min_area, n), _torchvision_boxes(height, width, min_area, n)
  assert ((ours[:, 2] >= 1) & (ours[:, 0] + ours[:, 2] <= height)).all()
  assert ((ours[:, 3] >= 1) & (ours[:, 1] + ours[:, 3] <= width)).all()
  for column, name in enumerate(('top', 'left', 'height', 'width')):
    p = stats.ks_2samp(ours[:, column], reference[:, column]).pvalue
    assert p > 1e-3, (name, p)
  area = ours[:, 2] * ours[:, 3]
  assert stats.ks_2samp(area, reference[:, 2] * reference[:, 3]).pvalue > 1e-3
  ratio = ours[:, 3] / ours[:, 2]  # Log-uniform: a uniform draw fails here.
  assert stats.ks_2samp(ratio, reference[:, 3] / reference[:, 2]).pvalue > 1e-3


def test_the_inception_crop_is_another_sampler():
  """What the test above tells apart: TensorFlow's sampler (uniform ratio, then uniform height) is
  not torchvision's on the same image and range."""
  height, width, min_area, n = 48, 64, 0.3, 3000
  seeds = np.stack([np.arange(n), np.full(n, 7)], axis=1).astype(np.int32)
  image = tf.zeros([height, width, 3], tf.uint8)
  heights = [int(tf.shape(preprocess.inception_crop(image, tf.constant(s), min_area))[0])
             for s in seeds[:n]]
  reference = _torchvision_boxes(height, width, min_area, n)
  assert stats.ks_2samp(heights, reference[:, 2]).pvalue < 1e-3


@pytest.mark.parametrize('height,width', [(10, 200), (200, 10), (12, 100)])
def test_when_no_draw_fits_the_central_crop_is_torchvisions(height, width):
  """Areas of >= 90% of so narrow an image never fit at a ratio in [3/4, 4/3]: torchvision's
  fallback, the central crop clamped to that ratio, exactly."""
  expected = _torchvision_boxes(height, width, 0.9, 1)[0]
  for box in _ours(height, width, 0.9, 20):
    np.testing.assert_array_equal(box, expected)


def test_the_train_crop_reads_min_area_and_checks_it():
  pp = ml_collections.ConfigDict(dict(crop='random_resized', min_area=0.0, pad=0, flip=False))
  with pytest.raises(ValueError, match=r'^config.pp.min_area=0.0 must be in \(0, 1\]'):
    preprocess.check_pp(pp)
  image = np.random.RandomState(0).randint(0, 256, (40, 40, 3)).astype(np.uint8)
  seed = tf.constant([3, 4])
  whole = preprocess.random_resized_crop(image, seed, 1.0).numpy()
  np.testing.assert_array_equal(whole, image)  # A square image's whole area is the only box.
  assert preprocess.random_resized_crop(image, seed, 0.1).shape[0] < 40
