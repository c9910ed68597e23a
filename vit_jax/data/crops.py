"""The crop geometry: TensorFlow's inception crop (the original code's), torchvision's random resized
crop (timm's), pad and random crop, and the central crop of the eval. Each random crop draws only
from the `np.random.Generator` it is given.
"""

import math

import numpy as np

from vit_jax.data import images

# Aspect ratios (width / height) of the inception crop, as in the original Inception and ViT code.
_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
# Boxes TensorFlow's sample_distorted_bounding_box tries before it takes the whole image.
_INCEPTION_TRIES = 100


def _inception_box(
    height: int, width: int, rng: np.random.Generator, min_area: float, aspect_ratio: float
) -> tuple[int, int, int, int] | None:
  """One try of TensorFlow's GenerateRandomCrop (sample_distorted_bounding_box_op.cc): the crop's
  height uniform among the integers whose box at `aspect_ratio` covers [min_area, 1] of the image,
  a uniform offset; None where rounding leaves no such box. Python's round is C's lrintf in its
  default rounding mode: halves to even."""
  min_pixels, max_pixels = min_area * height * width, float(height * width)
  box_h = round(math.sqrt(min_pixels / aspect_ratio))
  max_h = round(math.sqrt(max_pixels / aspect_ratio))
  if round(max_h * aspect_ratio) > width:
    # The largest height whose rounded width fits (TensorFlow's epsilon, then its correction).
    max_h = int((width + 0.5 - 1e-7) / aspect_ratio)
    if round(max_h * aspect_ratio) > width:
      max_h -= 1
  max_h = min(max_h, height)
  box_h = min(box_h, max_h)
  if box_h < max_h:
    box_h += int(rng.integers(max_h - box_h + 1))
  box_w = round(box_h * aspect_ratio)
  # Rounding may leave the area just outside the range: TensorFlow tries one row more, or less.
  if box_w * box_h < min_pixels:
    box_h += 1
    box_w = round(box_h * aspect_ratio)
  if box_w * box_h > max_pixels:
    box_h -= 1
    box_w = round(box_h * aspect_ratio)
  if not (min_pixels <= box_w * box_h <= max_pixels and 0 < box_w <= width and 0 < box_h <= height):
    return None
  # TensorFlow's offsets are uniform in [0, room), not [0, room]: a box shorter than the image never
  # reaches its last row (nor a narrower one its last column).
  top = int(rng.integers(height - box_h)) if box_h < height else 0
  left = int(rng.integers(width - box_w)) if box_w < width else 0
  return top, left, box_h, box_w


def inception_box(shape: tuple[int, ...], rng: np.random.Generator, min_area: float) -> images.Box:
  """A random crop box (top, left, height, width) of an image of `shape` [h, w, ...] covering
  [min_area, 1] of it with aspect ratio in [3/4, 4/3]: TensorFlow's sample_distorted_bounding_box
  (the original code's crop) with the whole image as the object, its arithmetic in float64 instead
  of float32. Up to 100 tries, each of an aspect ratio (width / height) uniform in [3/4, 4/3], then
  a height uniform among those that fit it; the whole image if none fits. `random_resized_box` is
  torchvision's sampler: log-uniform ratio, uniform area."""
  height, width = shape[:2]
  for _ in range(_INCEPTION_TRIES):
    box = _inception_box(height, width, rng, min_area, rng.uniform(*_ASPECT_RATIO_RANGE))
    if box is not None:
      return box
  return 0, 0, height, width


def random_resized_box(
    shape: tuple[int, ...], rng: np.random.Generator, min_area: float, tries: int = 10
) -> tuple[int, int, int, int]:
  """torchvision's RandomResizedCrop box (timm's train crop) for an image of `shape` [h, w, ...], as
  (top, left, height, width): timm's get_params, its float64 arithmetic and order of draws, and
  torchvision's check that a side is not 0 (torchvision's own draws are float32).

  Up to `tries` draws of an area uniform in [min_area, 1] of the image and an aspect ratio (width /
  height) log-uniform in [3/4, 4/3]; the first box that fits lands at a uniform offset. If none fits,
  the central crop of the whole image, its aspect ratio clamped to that range."""
  height, width = shape[:2]
  low, high = _ASPECT_RATIO_RANGE
  for _ in range(tries):
    target_area = height * width * rng.uniform(min_area, 1.0)
    aspect_ratio = math.exp(rng.uniform(math.log(low), math.log(high)))
    # Python's round, as torchvision's: halves to even.
    box_w = round(math.sqrt(target_area * aspect_ratio))
    box_h = round(math.sqrt(target_area / aspect_ratio))
    if 0 < box_w <= width and 0 < box_h <= height:
      top = int(rng.integers(height - box_h + 1))
      left = int(rng.integers(width - box_w + 1))
      return top, left, box_h, box_w
  in_ratio = width / height
  box_h, box_w = height, width
  if in_ratio < low:
    box_h = round(width / low)
  elif in_ratio > high:
    box_w = round(height * high)
  return (height - box_h) // 2, (width - box_w) // 2, box_h, box_w


def pad_and_random_crop(image: np.ndarray, rng: np.random.Generator, pad: int) -> np.ndarray:
  """Pads `pad` black pixels on every side, then crops back to the input size at an offset uniform
  in [0, 2 * pad] along each axis."""
  top, left = rng.integers(2 * pad + 1, size=2)
  padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
  return padded[top : top + image.shape[0], left : left + image.shape[1]]


def central_scaled_size(
    height: int, width: int, size: int, crop_fraction: float
) -> tuple[int, int]:
  """The (height, width) `central_crop` resizes an image of (height, width) to before it takes the
  central size x size square: the shorter side int(size / crop_fraction), as timm's eval transform
  (and DeiT's, MAE's) takes it from its crop_pct, the longer one's proportion rounded down."""
  target = math.floor(size / crop_fraction)
  longer = int(target * max(height, width) / min(height, width))
  return (longer, target) if height > width else (target, longer)


def central_crop(
    image: np.ndarray | images.Encoded,
    size: int,
    crop_fraction: float,
    antialias: bool = False,
    reducing_gap: float = 0.0,
) -> np.ndarray:
  """Bilinear resize keeping the aspect ratio, the shorter side to int(size / crop_fraction), then
  the central size x size square (ImageNet's eval: 256 -> 224 at 0.875), in the input's range and
  of `resizing.resize`'s dtype; `antialias` and `reducing_gap` as in `images.crop_and_resize`. The
  geometry is torchvision's Resize(int) + CenterCrop (timm's eval transform), so with `antialias`
  its pixels are too: the longer side's proportion rounded down, the offset rounded half to even."""

  def geometry(height: int, width: int) -> tuple[images.Box, tuple[int, int]]:
    return (0, 0, height, width), central_scaled_size(height, width, size, crop_fraction)

  scaled = images.crop_and_resize(image, geometry, antialias, reducing_gap)
  top, left = round((scaled.shape[0] - size) / 2), round((scaled.shape[1] - size) / 2)
  return scaled[top : top + size, left : left + size]
