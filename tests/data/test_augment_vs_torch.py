"""3-Augment, colour jitter and random erasing against torchvision and timm: the comparisons of
test_augment.py with the torch-based peers, which `make test-all` runs (they need the test extra).
"""

import collections
import itertools
import random

import numpy as np
from PIL import Image, ImageOps
import pytest
from scipy import optimize, stats
from timm.data import constants as timm_constants
import timm.data.random_erasing
import torch
import torchvision.transforms.functional as TF

from vit_jax.data import augment
from test_augment import assert_float32_like, boxes_of, over_seeds, random_image

torch.set_num_threads(1)  # Small ops: more threads only add overhead.


def torch_chw(image: np.ndarray) -> torch.Tensor:
  return torch.from_numpy(np.ascontiguousarray(image, np.float32).transpose(2, 0, 1))


def numpy_hwc(image: torch.Tensor) -> np.ndarray:
  return image.numpy().transpose(1, 2, 0)


def test_grayscale_matches_torchvision_and_pil():
  image = random_image((12, 14, 3))
  got = augment.grayscale(image.astype(np.float32))
  assert_float32_like(got, image)
  np.testing.assert_allclose(got, numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3)), atol=1e-3)
  pil = np.asarray(Image.fromarray(image).convert('L'), np.float32)
  np.testing.assert_allclose(got, np.repeat(pil[..., None], 3, -1), atol=0.55)  # PIL rounds.


def torchvision_blur(image: np.ndarray, sigma: float, kernel_size: int = 23) -> np.ndarray:
  """torchvision's blur with timm's kernel size for 3-Augment-style blurs."""
  return numpy_hwc(TF.gaussian_blur(torch_chw(image), [kernel_size] * 2, [sigma, sigma]))


@pytest.mark.parametrize('sigma', [0.1, 0.7, 2.0])
@pytest.mark.parametrize('shape', [(24, 26), (31, 17)])
def test_gaussian_blur_matches_torchvision(sigma, shape):
  image = random_image((*shape, 3)).astype(np.float32)
  got = augment.gaussian_blur(image, sigma, 23)
  assert_float32_like(got, image)
  np.testing.assert_allclose(got, torchvision_blur(image, sigma), atol=1e-3)


@pytest.mark.parametrize('shape', [(5, 9), (9, 2), (1, 4)])
def test_gaussian_blur_of_images_under_the_kernel_radius_cuts_the_kernel(shape):
  """torch cannot reflect a border as wide as the image: the kernel is cut to the shorter side's
  2 * side - 1 taps, which torchvision's blur with that kernel size gives."""
  image = random_image((*shape, 3)).astype(np.float32)
  got = augment.gaussian_blur(image, 1.5, 23)
  taps = 2 * min(shape) - 1
  want = torchvision_blur(image, 1.5, taps) if taps > 1 else image
  np.testing.assert_allclose(got, want, atol=1e-3)


def test_three_augment_picks_each_branch_a_third_and_blurs_with_sigma_in_range():
  image = random_image((24, 24, 3)).astype(np.float32)
  outputs = over_seeds(lambda rng: augment.three_augment(image, rng), 300)
  grey = numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3))
  solarized = np.asarray(ImageOps.solarize(Image.fromarray(image.astype(np.uint8))), np.float32)
  is_grey = [np.allclose(x, grey, atol=1e-3) for x in outputs]
  is_solarized = [np.array_equal(x, solarized) for x in outputs]
  blurred = [x for x, g, s in zip(outputs, is_grey, is_solarized) if not (g or s)]
  for count in (sum(is_grey), sum(is_solarized), len(blurred)):
    assert 70 <= count <= 130  # 100 expected; 3.6 standard deviations.
  sigmas = []
  for x in blurred[:40]:
    fit = optimize.minimize_scalar(
        lambda s: np.abs(torchvision_blur(image, s) - x).max(),
        bounds=(0.01, 3.0),
        method='bounded',
        options=dict(xatol=1e-5),
    )
    assert fit.fun < 0.01
    sigmas.append(fit.x)
  assert 0.1 - 1e-3 <= min(sigmas) < 0.4 and 1.7 < max(sigmas) <= 2.0 + 1e-3
  for x in outputs:
    assert_float32_like(x, image)


ADJUSTMENTS = [
    (augment.adjust_brightness, TF.adjust_brightness),
    (augment.adjust_contrast, TF.adjust_contrast),
    (augment.adjust_saturation, TF.adjust_saturation),
]


def torchvision_jitter(image: np.ndarray, factors, order) -> np.ndarray:
  """torchvision's adjustments of float images in [0, 1], on [0, 255]."""
  x = torch_chw(image) / 255
  for i in order:
    x = ADJUSTMENTS[i][1](x, float(factors[i]))
  return numpy_hwc(x) * 255


@pytest.mark.parametrize('index', range(3))
@pytest.mark.parametrize('factor', [0.0, 0.6, 1.0, 1.7])
def test_color_adjustment_matches_torchvision(index, factor):
  image = random_image((10, 12, 3))
  got = ADJUSTMENTS[index][0](image.astype(np.float32), factor)
  assert_float32_like(got, image)
  np.testing.assert_allclose(got, torchvision_jitter(image, {index: factor}, [index]), atol=1e-3)


def test_jitter_colors_applies_in_the_given_order():
  image = random_image((10, 12, 3))
  factors = np.float32([1.6, 0.4, 1.9])  # Strong enough to clip, so the order matters.
  outputs = set()
  for order in itertools.permutations(range(3)):
    got = augment.jitter_colors(image.astype(np.float32), factors, order)
    np.testing.assert_allclose(got, torchvision_jitter(image, factors, order), atol=1e-3)
    outputs.add(np.round(got, 2).tobytes())
  assert len(outputs) > 1


def test_color_jitter_factors_are_uniform_in_range():
  # Mid-range colours do not clip: the three adjustments are then linear in the image, the pixel's
  # luma and the mean luma, and the three factors can be read back from the output.
  image = np.random.default_rng(0).uniform(70, 120, (8, 8, 3)).astype(np.float32)
  outputs = over_seeds(lambda rng: augment.color_jitter(image, rng, 0.4), 300)
  luma = numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3))
  design = np.stack([image.ravel(), luma.ravel(), np.ones(image.size)], axis=1)
  factors = []
  for x in outputs:
    assert_float32_like(x, image)
    (a, b, k), *_ = np.linalg.lstsq(design, x.ravel(), rcond=None)
    brightness = a + b + k / luma.mean()
    factors.append((brightness, (a + b) / brightness, a / (a + b)))
  factors = np.array(factors)
  assert factors.min() > 0.6 - 1e-3 and factors.max() < 1.4 + 1e-3
  np.testing.assert_allclose(factors.mean(0), 1.0, atol=0.04)
  np.testing.assert_allclose(factors.std(0), 0.8 / np.sqrt(12), rtol=0.15)


def test_color_jitter_orders_are_uniform():
  """Each of the 6 orders about a sixth of the time, read back where only one order gives
  torchvision's result (others commute where nothing clips)."""
  image = random_image((10, 12, 3)).astype(np.float32)
  counts = collections.Counter()
  for s in range(600):
    got = augment.color_jitter(image, np.random.default_rng([s, 7]), 0.9)  # Strong: clips.
    factors = np.random.default_rng([s, 7]).uniform(0.1, 1.9, 3)
    matches = [
        order
        for order in itertools.permutations(range(3))
        if np.allclose(got, torchvision_jitter(image, factors, order), atol=1e-3)
    ]
    assert matches
    if len(matches) == 1:
      counts.update(matches)
  # ~340 read back, ~57 each (binomial std ~7).
  assert len(counts) == 6 and all(30 <= c <= 85 for c in counts.values()), counts


class GeneratorAsRandom:
  """Python's `random` functions that timm's RandomErasing calls, drawing from a numpy Generator."""

  def __init__(self, rng: np.random.Generator):
    self.rng = rng

  def random(self) -> float:
    return self.rng.random()

  def uniform(self, low: float, high: float) -> float:
    return self.rng.uniform(low, high)

  def randint(self, low: int, high: int) -> int:
    return int(self.rng.integers(low, high + 1))


@pytest.mark.parametrize(
    'height,width,area,aspect',
    [
        (40, 40, (0.02, 1 / 3), (0.3, 1 / 0.3)),
        (13, 31, (0.02, 1 / 3), (0.3, 1 / 0.3)),
        (31, 13, (0.3, 0.9), (0.5, 4.0)),  # Many boxes that do not fit.
    ],
)
def test_random_erasing_is_timms_algorithm_draw_for_draw(monkeypatch, height, width, area, aspect):
  """timm's RandomErasing with its `random` draws taken from the same generator erases the same
  boxes: the probability test, the attempts, the area and log-aspect draws, the rounding, the fit
  test and the corner."""
  erase = timm.data.random_erasing.RandomErasing(
      0.7, area[0], area[1], aspect[0], aspect[1], mode='pixel', device='cpu'
  )
  erased_count = 0
  for s in range(300):
    ours = (
        augment.random_erase(
            np.zeros((height, width, 3), np.float32),
            np.random.default_rng([s, 7]),
            0.7,
            area,
            aspect,
        )
        != 0
    )
    monkeypatch.setattr(
        timm.data.random_erasing, 'random', GeneratorAsRandom(np.random.default_rng([s, 7]))
    )
    theirs = numpy_hwc(erase(torch.zeros(3, height, width))) != 0
    np.testing.assert_array_equal(ours, theirs)
    erased_count += ours.any()
  assert 150 <= erased_count <= 230


def test_random_erasing_matches_timm():
  size, prob, area, aspect, n = 40, 0.6, (0.02, 1 / 3), (0.3, 1 / 0.3), 2000
  our_images = over_seeds(
      lambda rng: augment.random_erase(
          np.zeros([size, size, 3], np.float32), rng, prob, area, aspect
      ),
      n,
  )
  erase = timm.data.random_erasing.RandomErasing(
      prob, area[0], area[1], aspect[0], aspect[1], mode='pixel', device='cpu'
  )
  random.seed(0)
  torch.manual_seed(0)
  their_images = np.stack([numpy_hwc(erase(torch.zeros(3, size, size))) for _ in range(n)])
  ours, theirs = our_images != 0, their_images != 0
  # The noise as [0, 1] pixels: ours from [-1, 1], timm's from its ImageNet-normalised space.
  our_pixels = (our_images[ours.all(-1)] + 1) / 2
  mean, std = (
      np.float32(c)
      for c in (timm_constants.IMAGENET_DEFAULT_MEAN, timm_constants.IMAGENET_DEFAULT_STD)
  )
  their_pixels = their_images[theirs.all(-1)] * std + mean
  np.testing.assert_allclose(our_pixels.mean(0), their_pixels.mean(0), atol=0.003)
  np.testing.assert_allclose(our_pixels.std(0), their_pixels.std(0), atol=0.003)
  assert (ours.all(-1) == ours.any(-1)).all()  # Every channel of an erased pixel.
  stats = []
  for erased in (ours[..., 0], theirs[..., 0]):
    boxes = np.array(boxes_of(erased), np.float64)
    h, w = boxes.T
    # Rounding each side to whole pixels moves the box by half a pixel at most.
    assert ((h + 0.5) * (w + 0.5) >= area[0] * size**2).all()
    assert ((h - 0.5) * (w - 0.5) <= area[1] * size**2).all()
    assert ((h + 0.5) / (w - 0.5) >= aspect[0]).all() and ((h - 0.5) / (w + 0.5) <= aspect[1]).all()
    log_aspect = np.log(h / w)
    stats.append(
        [
            len(boxes) / n,
            (h * w).mean() / size**2,
            log_aspect.mean(),
            log_aspect.std(),
            *np.histogram(log_aspect, bins=4, range=np.log(aspect))[0] / len(boxes),
        ]
    )
  ours_stats, timm_stats = stats
  assert abs(ours_stats[0] - prob) < 0.04
  # Erased share, mean area fraction, log-aspect mean and std, log-aspect histogram: each about
  # 3 standard errors of the difference.
  tolerance = [0.05, 0.02, 0.1, 0.05] + [0.06] * 4
  assert (np.abs(np.subtract(ours_stats, timm_stats)) <= tolerance).all(), (ours_stats, timm_stats)


def box_corners(erased: np.ndarray) -> np.ndarray:
  """(top, left, height, width) of each erased image's box, of the erased images only."""
  corners = []
  for mask in erased:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if rows.size:
      corners.append((rows[0], cols[0], rows.size, cols.size))
  return np.array(corners)


@pytest.mark.parametrize(
    'height,width,area,aspect',
    [
        (13, 31, (0.02, 1 / 3), (0.3, 1 / 0.3)),  # timm's defaults on a wide image.
        # Large boxes, mostly tall (a range not symmetric in log: height and width swapped would show),
        # many of which do not fit.
        (31, 13, (0.3, 0.9), (0.5, 4.0)),
    ],
)
def test_random_erasing_boxes_and_positions_match_timm_on_non_square_images(
    height, width, area, aspect
):
  prob, n = 0.7, 1500
  ours = (
      over_seeds(
          lambda rng: augment.random_erase(
              np.zeros([height, width, 3], np.float32), rng, prob, area, aspect
          ),
          n,
      )[..., 0]
      != 0
  )
  erase = timm.data.random_erasing.RandomErasing(
      prob, area[0], area[1], aspect[0], aspect[1], mode='pixel', device='cpu'
  )
  random.seed(0)
  torch.manual_seed(0)
  theirs = np.stack([erase(torch.zeros(1, height, width))[0].numpy() for _ in range(n)]) != 0
  ours, theirs = box_corners(ours), box_corners(theirs)
  assert abs(len(ours) - len(theirs)) / n < 0.05  # About 3 standard errors of the difference.
  for column in range(4):  # Top, left, height, width: each distributed as timm's.
    assert stats.ks_2samp(ours[:, column], theirs[:, column]).pvalue > 1e-3, column
