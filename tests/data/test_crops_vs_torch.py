"""The crops against torchvision's and timm's samplers: the comparisons of test_crops.py with the
torch-based peers, which `make test-all` runs (they need the test extra)."""

import numpy as np
from PIL import Image
import pytest
from scipy import stats
import timm.data.transforms
import torch
from torchvision import transforms

from vit_jax.data import crops
from vit_jax.data import train_ops
from test_crops import _RATIO, _image, _inception_boxes, _pp


class _PythonRandom:
  """Python's `random` module as timm's transforms call it, drawing from a numpy Generator:
  random.uniform(a, b) and Generator.uniform(a, b) are both a + (b - a) * U[0, 1)."""

  def __init__(self, rng: np.random.Generator):
    self._rng = rng

  def uniform(self, low: float, high: float) -> float:
    return self._rng.uniform(low, high)

  def randint(self, low: int, high: int) -> int:  # Both ends included.
    return int(self._rng.integers(low, high + 1))


@pytest.mark.parametrize(
    'height,width,min_area',
    [
        (48, 64, 0.3),
        (40, 40, 0.08),
        (30, 90, 0.5),
        (375, 500, 0.05),
        (10, 200, 0.9),
        (200, 11, 0.9),
        (11, 200, 0.9),
    ],
)
def test_random_resized_box_is_timms_given_the_same_draws(monkeypatch, height, width, min_area):
  """timm's get_params, its arithmetic in float64 as ours, fed the same uniforms: the same box, the
  fallback included (the last three shapes fit no draw; 11 * 4 / 3 rounds up)."""
  image = Image.new('RGB', (width, height))
  for seed in range(300):
    monkeypatch.setattr(timm.data.transforms, 'random', _PythonRandom(np.random.default_rng(seed)))
    expected = timm.data.transforms.RandomResizedCropAndInterpolation.get_params(
        image, (min_area, 1.0), _RATIO
    )
    got = crops.random_resized_box((height, width, 3), np.random.default_rng(seed), min_area)
    assert got == expected, seed


@pytest.mark.parametrize('min_area,size', [(0.08, 24), (0.5, 64)])
def test_the_random_resized_crop_is_timms_to_the_bit(monkeypatch, min_area, size):
  """pp.crop='random_resized' with pp.antialias: timm's RandomResizedCropAndInterpolation (bilinear)
  on the decoded PIL image, fed the same uniforms: the crop, then PIL's 8-bit resize."""
  image = _image(75, 100)
  timm_crop = timm.data.transforms.RandomResizedCropAndInterpolation(
      size, scale=(min_area, 1.0), interpolation='bilinear'
  )
  pp = _pp(crop='random_resized', min_area=min_area, antialias=True)
  for seed in range(20):
    monkeypatch.setattr(timm.data.transforms, 'random', _PythonRandom(np.random.default_rng(seed)))
    expected = np.asarray(timm_crop(Image.fromarray(image)), np.float32)
    got = train_ops.CROPS['random_resized'].apply(image, np.random.default_rng(seed), pp, size)
    assert got.dtype == np.uint8  # As timm's PIL image; normalize makes it float32.
    np.testing.assert_array_equal(got, expected)


def _torchvision_boxes(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  torch.manual_seed(0)
  image = torch.zeros(3, height, width)
  return np.array(
      [transforms.RandomResizedCrop.get_params(image, (min_area, 1.0), _RATIO) for _ in range(n)]
  )


def _our_boxes(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  return np.array(
      [
          crops.random_resized_box((height, width, 3), np.random.default_rng([i, 7]), min_area)
          for i in range(n)
      ]
  )


@pytest.mark.parametrize('height,width,min_area', [(48, 64, 0.3), (40, 40, 0.08), (30, 90, 0.5)])
def test_boxes_are_distributed_as_torchvisions(height, width, min_area):
  n = 3000
  ours = _our_boxes(height, width, min_area, n)
  reference = _torchvision_boxes(height, width, min_area, n)
  assert ((ours[:, 2] >= 1) & (ours[:, 0] + ours[:, 2] <= height)).all()
  assert ((ours[:, 3] >= 1) & (ours[:, 1] + ours[:, 3] <= width)).all()
  for column, name in enumerate(('top', 'left', 'height', 'width')):
    p = stats.ks_2samp(ours[:, column], reference[:, column]).pvalue
    assert p > 1e-3, (name, p)
  area = ours[:, 2] * ours[:, 3]
  assert stats.ks_2samp(area, reference[:, 2] * reference[:, 3]).pvalue > 1e-3
  ratio = ours[:, 3] / ours[:, 2]  # Log-uniform: a uniform draw fails here.
  assert stats.ks_2samp(ratio, reference[:, 3] / reference[:, 2]).pvalue > 1e-3


@pytest.mark.parametrize('height,width', [(10, 200), (200, 10), (12, 100)])
def test_when_no_draw_fits_the_central_crop_is_torchvisions(height, width):
  """Areas of >= 90% of so narrow an image never fit at a ratio in [3/4, 4/3]: torchvision's
  fallback, the central crop clamped to that ratio, exactly."""
  expected = _torchvision_boxes(height, width, 0.9, 1)[0]
  for box in _our_boxes(height, width, 0.9, 20):
    np.testing.assert_array_equal(box, expected)


def test_the_inception_crop_is_another_sampler():
  """What the test of torchvision's distribution tells apart: TensorFlow's sampler (uniform ratio,
  then uniform height) is not torchvision's on the same image and range."""
  ours = _inception_boxes(48, 64, 0.3, 3000)
  reference = _torchvision_boxes(48, 64, 0.3, 3000)
  assert stats.ks_2samp(ours[:, 2], reference[:, 2]).pvalue < 1e-3
