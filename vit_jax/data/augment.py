"""Augmentations after the crop besides RandAugment (randaugment.py): DeiT III's 3-Augment, timm's
colour jitter and random erasing, in numpy.

Each draws all its randomness from the `np.random.Generator` it is given; train_ops.AUGMENTS
applies them where their value range is (3-Augment and colour jitter on float32 [h, w, 3] pixels in
[0, 255], erasing on normalised images, as timm does).
"""

import math
from typing import Sequence

import numpy as np

# 3-Augment's blur (DeiT III): sigma uniform in this range; torchvision's GaussianBlur with a 23-tap
# kernel (DeiT III's own code blurs with PIL's GaussianBlur(radius=sigma): within 4/255 of it).
_BLUR_SIGMA_RANGE = (0.1, 2.0)
_BLUR_KERNEL_SIZE = 23
_ERASE_ATTEMPTS = 10  # Boxes tried per image by timm's RandomErasing before it gives up.
# timm's erasing fills N(0, 1) in its input space, pixels normalised by ImageNet's mean and std (per
# channel, of [0, 1] pixels): the same pixels here, where images are normalised to [-1, 1], are
# N(2 mean - 1, 2 std), the spread of the image's own values (N(0, 1) here would be 2.2 times it).
_ERASE_MEAN = 2 * np.float32([0.485, 0.456, 0.406]) - 1
_ERASE_STD = 2 * np.float32([0.229, 0.224, 0.225])
# torchvision's rgb_to_grayscale weights (ITU-R 601-2 luma, as TensorFlow's rgb_to_grayscale).
_LUMA = np.float32([0.2989, 0.587, 0.114])


def _luma(image: np.ndarray) -> np.ndarray:
  """[h, w, 1] luma of float32 [h, w, 3]."""
  return (image @ _LUMA)[..., None]


def grayscale(image: np.ndarray) -> np.ndarray:
  """Luma of float [h, w, 3] (torchvision's weights), kept as 3 equal channels."""
  return np.repeat(_luma(image), 3, axis=-1)


def solarize(image: np.ndarray, threshold: float = 128) -> np.ndarray:
  """Inverts the values >= `threshold` of float [h, w, 3] in [0, 255] (PIL's ImageOps.solarize)."""
  # np.where(image < threshold, image, inverted), bit for bit, selected by bit masks: np.where's
  # float32 loop is several times slower on a mask that changes from one value to the next, as on
  # the interleaved channels of any image.
  image = np.asarray(image, np.float32)
  keep = -(image < threshold).astype(np.int32)  # All bits set where a value stays.
  inverted = (255 - image).view(np.int32)
  selected = inverted ^ ((inverted ^ image.view(np.int32)) & keep)
  return selected.view(np.float32)


def _correlate_rows(image: np.ndarray, kernel: np.ndarray) -> np.ndarray:
  """`image` correlated with the symmetric, odd-length `kernel` along its first axis, the borders
  reflected without repeating the edge (torch's 'reflect' padding)."""
  radius, size = len(kernel) // 2, image.shape[0]
  padded = np.pad(image, [(radius, radius)] + [(0, 0)] * (image.ndim - 1), mode='reflect')
  out = kernel[radius] * padded[radius : radius + size]
  pair = np.empty_like(out)
  # Whole-slab shifted sums, one product per pair of taps. A banded matrix product is faster alone,
  # but BLAS's threads slow it tenfold where the input workers already keep every core busy.
  for i in range(radius):
    np.add(padded[i : i + size], padded[2 * radius - i : 2 * radius - i + size], out=pair)
    pair *= kernel[i]
    out += pair
  return out


def gaussian_blur(image: np.ndarray, sigma: float, kernel_size: int) -> np.ndarray:
  """torchvision's gaussian_blur of float [h, w, 3]: an odd `kernel_size`, reflected borders. On an
  image with a side not longer than the kernel's radius, the kernel is cut to side * 2 - 1."""
  # A reflected border is at most the image's side less one.
  radius = min(kernel_size // 2, min(image.shape[:2]) - 1)
  x = np.arange(-radius, radius + 1)
  kernel = np.exp(-0.5 * (x / sigma) ** 2)
  kernel = (kernel / kernel.sum()).astype(np.float32)
  # The 2-D Gaussian is separable: down the columns, then (transposed) along the rows.
  vertical = _correlate_rows(np.asarray(image, np.float32), kernel)
  blurred = _correlate_rows(vertical.transpose(1, 0, 2), kernel)
  return np.ascontiguousarray(blurred.transpose(1, 0, 2))


def three_augment(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
  """DeiT III's 3-Augment: grayscale, solarize or a Gaussian blur (sigma in [0.1, 2]), one chosen
  uniformly, of float32 [h, w, 3] in [0, 255]."""
  choice = rng.integers(3)
  if choice == 0:
    return grayscale(image)
  if choice == 1:
    return solarize(image)
  return gaussian_blur(image, rng.uniform(*_BLUR_SIGMA_RANGE), _BLUR_KERNEL_SIZE)


def _blend(image: np.ndarray, other: np.ndarray, factor: float) -> np.ndarray:
  return np.clip(np.float32(factor) * image + np.float32(1 - factor) * other, 0, 255)


def adjust_brightness(image: np.ndarray, factor: float) -> np.ndarray:
  """torchvision's adjust_brightness of float [h, w, 3] in [0, 255]: 0 black, 1 unchanged."""
  return _blend(image, np.float32(0), factor)


def adjust_contrast(image: np.ndarray, factor: float) -> np.ndarray:
  """torchvision's adjust_contrast: 0 the image's mean luma, 1 unchanged."""
  return _blend(image, _luma(image).mean(dtype=np.float32), factor)


def adjust_saturation(image: np.ndarray, factor: float) -> np.ndarray:
  """torchvision's adjust_saturation: 0 grayscale, 1 unchanged."""
  return _blend(image, _luma(image), factor)


_COLOR_ADJUSTMENTS = (adjust_brightness, adjust_contrast, adjust_saturation)


def jitter_colors(image: np.ndarray, factors: Sequence[float], order: Sequence[int]) -> np.ndarray:
  """Brightness, contrast and saturation by factors[0], [1], [2], applied in `order` (a permutation
  of 0, 1, 2): it matters where values clip."""
  for i in order:
    image = _COLOR_ADJUSTMENTS[i](image, factors[i])
  return image


def color_jitter(image: np.ndarray, rng: np.random.Generator, strength: float) -> np.ndarray:
  """timm's color_jitter (torchvision's ColorJitter, no hue) of float32 [h, w, 3] in [0, 255]: each
  factor uniform in [max(0, 1 - strength), 1 + strength], applied in a random order."""
  factors = rng.uniform(max(0.0, 1 - strength), 1 + strength, 3)
  return jitter_colors(image, factors, rng.permutation(len(_COLOR_ADJUSTMENTS)))


def random_erase(
    image: np.ndarray,
    rng: np.random.Generator,
    prob: float,
    area: tuple[float, float],
    aspect: tuple[float, float],
) -> np.ndarray:
  """timm's RandomErasing(mode='pixel') of a normalised float32 [h, w, 3]: with probability `prob`,
  of up to 10 boxes of an area fraction in `area` and a log-uniform aspect ratio (height / width)
  in `aspect`, the first that fits is filled with the noise timm's fills it with (N(0, 1) in its
  ImageNet-normalised space: _ERASE_MEAN, _ERASE_STD here); `image` itself where nothing is erased.
  timm's draws, in timm's order, from `rng` instead of Python's `random`."""
  if rng.random() > prob:
    return image
  height, width, channels = image.shape
  log_aspect = (math.log(aspect[0]), math.log(aspect[1]))
  for _ in range(_ERASE_ATTEMPTS):
    target_area = rng.uniform(*area) * height * width
    ratio = math.exp(rng.uniform(*log_aspect))
    # Python's round (half to even), as timm's.
    box_height = round(math.sqrt(target_area * ratio))
    box_width = round(math.sqrt(target_area / ratio))
    if box_height < height and box_width < width:
      top = rng.integers(height - box_height + 1)
      left = rng.integers(width - box_width + 1)
      erased = image.copy()
      noise = rng.standard_normal((box_height, box_width, channels), np.float32)
      erased[top : top + box_height, left : left + box_width] = noise * _ERASE_STD + _ERASE_MEAN
      return erased
  return image
