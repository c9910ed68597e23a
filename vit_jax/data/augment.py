"""Augmentations after the crop besides RandAugment (randaugment.py): DeiT III's 3-Augment, timm's
colour jitter and random erasing, as stateless TensorFlow graph functions.

Each takes its randomness from an explicit seed; preprocess.AUGMENTS applies them where their value
range is (3-Augment and colour jitter on [0, 255] pixels, erasing on normalised images, as timm does).
"""
import functools
import math

import tensorflow as tf

# 3-Augment's blur (DeiT III): sigma uniform in this range; torchvision's GaussianBlur with a 23-tap
# kernel (DeiT III's own code blurs with PIL's GaussianBlur(radius=sigma): within 4/255 of it).
_BLUR_SIGMA_RANGE = (0.1, 2.0)
_BLUR_KERNEL_SIZE = 23
_ERASE_ATTEMPTS = 10  # Boxes tried per image by timm's RandomErasing before it gives up.


def grayscale(image: tf.Tensor) -> tf.Tensor:
  """Luma of float [h, w, 3] (torchvision's weights), kept as 3 equal channels."""
  return tf.image.grayscale_to_rgb(tf.image.rgb_to_grayscale(image))


def solarize(image: tf.Tensor, threshold: float = 128) -> tf.Tensor:
  """Inverts the values >= `threshold` of an image in [0, 255] (PIL's ImageOps.solarize)."""
  return tf.where(image < threshold, image, 255 - image)


def gaussian_blur(image: tf.Tensor, sigma: tf.Tensor, kernel_size: int) -> tf.Tensor:
  """torchvision's gaussian_blur of float [h, w, 3]: an odd `kernel_size`, reflected borders. On an
  image with a side not longer than the kernel's radius, the kernel is cut to side * 2 - 1."""
  # A reflected border is at most the image's side less one.
  radius = tf.minimum(kernel_size // 2, tf.reduce_min(tf.shape(image)[:2]) - 1)
  x = tf.cast(tf.range(-radius, radius + 1), tf.float32)
  kernel = tf.exp(-0.5 * (x / sigma)**2)
  kernel /= tf.reduce_sum(kernel)
  padded = tf.pad(image, [[radius, radius], [radius, radius], [0, 0]], mode='REFLECT')
  # The 2-D Gaussian is separable: a vertical then a horizontal pass, per channel.
  vertical = tf.tile(kernel[:, None, None, None], [1, 1, 3, 1])
  horizontal = tf.tile(kernel[None, :, None, None], [1, 1, 3, 1])
  blurred = tf.nn.depthwise_conv2d(padded[None], vertical, [1, 1, 1, 1], 'VALID')
  blurred = tf.nn.depthwise_conv2d(blurred, horizontal, [1, 1, 1, 1], 'VALID')[0]
  return tf.ensure_shape(blurred, image.shape)


def three_augment(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """DeiT III's 3-Augment: grayscale, solarize or a Gaussian blur (sigma in [0.1, 2]), one chosen
  uniformly, of float [h, w, 3] in [0, 255]."""
  choice_seed, sigma_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  sigma = tf.random.stateless_uniform([], sigma_seed, *_BLUR_SIGMA_RANGE)
  return tf.switch_case(
      tf.random.stateless_uniform([], choice_seed, 0, 3, tf.int32),
      [lambda: grayscale(image), lambda: solarize(image),
       lambda: gaussian_blur(image, sigma, _BLUR_KERNEL_SIZE)])


def _blend(image: tf.Tensor, other: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  return tf.clip_by_value(factor * image + (1 - factor) * other, 0, 255)


def adjust_brightness(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """torchvision's adjust_brightness of float [h, w, 3] in [0, 255]: 0 black, 1 unchanged."""
  return _blend(image, tf.zeros_like(image), factor)


def adjust_contrast(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """torchvision's adjust_contrast: 0 the image's mean luma, 1 unchanged."""
  return _blend(image, tf.reduce_mean(tf.image.rgb_to_grayscale(image)), factor)


def adjust_saturation(image: tf.Tensor, factor: tf.Tensor) -> tf.Tensor:
  """torchvision's adjust_saturation: 0 grayscale, 1 unchanged."""
  return _blend(image, tf.image.rgb_to_grayscale(image), factor)


_COLOR_ADJUSTMENTS = (adjust_brightness, adjust_contrast, adjust_saturation)


def jitter_colors(image: tf.Tensor, factors: tf.Tensor, order: tf.Tensor) -> tf.Tensor:
  """Brightness, contrast and saturation by factors[0], [1], [2], applied in `order` (a permutation
  of 0, 1, 2): it matters where values clip."""
  for step in range(len(_COLOR_ADJUSTMENTS)):
    image = tf.switch_case(order[step], [functools.partial(adjust, image, factors[i])
                                         for i, adjust in enumerate(_COLOR_ADJUSTMENTS)])
  return image


def color_jitter(image: tf.Tensor, seed: tf.Tensor, strength: float) -> tf.Tensor:
  """timm's color_jitter (torchvision's ColorJitter, no hue): each factor uniform in
  [max(0, 1 - strength), 1 + strength], in a random order."""
  factor_seed, order_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  factors = tf.random.stateless_uniform([3], factor_seed, max(0.0, 1 - strength), 1 + strength)
  order = tf.random.experimental.stateless_shuffle(tf.range(3), order_seed)
  return jitter_colors(image, factors, order)


def random_erase(image: tf.Tensor, seed: tf.Tensor, prob: float, area: tuple[float, float],
                 aspect: tuple[float, float]) -> tf.Tensor:
  """timm's RandomErasing(mode='pixel'): with probability `prob`, of up to 10 boxes of an area
  fraction in `area` and a log-uniform aspect ratio (height / width) in `aspect`, the first that
  fits is filled with N(0, 1) noise (the mean and std of a normalised image)."""
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))
  areas = tf.random.stateless_uniform([_ERASE_ATTEMPTS], seeds[0], *area) * tf.cast(
      height * width, tf.float32)
  ratios = tf.exp(tf.random.stateless_uniform([_ERASE_ATTEMPTS], seeds[1], *map(math.log, aspect)))
  heights = tf.cast(tf.round(tf.sqrt(areas * ratios)), tf.int32)
  widths = tf.cast(tf.round(tf.sqrt(areas / ratios)), tf.int32)
  fits = (heights < height) & (widths < width)
  first = tf.argmax(tf.cast(fits, tf.int32))
  # An empty box where no attempt fits or the image is not erased.
  erase = fits[first] & (tf.random.stateless_uniform([], seeds[2]) < prob)
  box_height = tf.where(erase, heights[first], 0)
  box_width = tf.where(erase, widths[first], 0)
  top = tf.random.stateless_uniform([], seeds[3], 0, height - box_height + 1, tf.int32)
  left = tf.random.stateless_uniform([], seeds[4], 0, width - box_width + 1, tf.int32)
  rows = tf.range(height)[:, None]
  cols = tf.range(width)[None, :]
  box = (rows >= top) & (rows < top + box_height) & (cols >= left) & (cols < left + box_width)
  return tf.where(box[..., None], tf.random.stateless_normal(tf.shape(image), seeds[5]), image)
