"""RandAugment (Cubuk et al., https://arxiv.org/abs/1909.13719) as TensorFlow graph ops for tf.data.

This follows the TF reference RandAugment that big_vision uses (big_vision/pp/autoaugment.py, a fork
of tensorflow/tpu's EfficientNet autoaugment.py): its 16 ops, its magnitude -> argument mapping and
its constants (translate 100 pixels, cutout 40, grey 128 where geometry or cutout uncovers pixels).
Each layer applies one op drawn uniformly; the reference also draws a per-op probability but never
uses it, so a drawn op is always applied. Random draws are stateless, from the caller's seed.

Kept from the reference, as they shape the published recipes: Solarize's threshold grows with the
magnitude (256 at magnitude 10: no pixel changes); Posterize keeps int(0.4 * magnitude) bits (0
bits, a black image, below magnitude 2.5). Changed where the reference meant "as PIL" and missed:
Contrast blends towards the mean grey level (the reference used pixel count / 256, fixed in
tensorflow/models#11219); Sharpness rounds its smoothed image (the reference truncated: half a
grey level darker); greys are PIL's integer luma (TF's float one is a level off on some pixels);
Posterize to 0 bits gives 0 (TF clamps a shift by 8 to 7).
"""
import functools
import math
from typing import Callable

import tensorflow as tf

_MAX_LEVEL = 10.0
_TRANSLATE_PIXELS = 100  # At magnitude 10; big_vision's randaug (AutoAugment uses 250).
_CUTOUT_HALF_SIZE = 40  # At magnitude 10: a box of up to 80 x 80 pixels.
_FILL = 128  # Mid grey, so filled pixels do not push later ops (e.g. AutoContrast) to an extreme.
_SOLARIZE_ADD_THRESHOLD = 128


def _blend(image1: tf.Tensor, image2: tf.Tensor, factor: float) -> tf.Tensor:
  """image1 + factor * (image2 - image1), clipped and truncated to uint8 as PIL's Image.blend."""
  image1 = tf.cast(image1, tf.float32)
  mixed = image1 + factor * (tf.cast(image2, tf.float32) - image1)
  return tf.cast(tf.clip_by_value(mixed, 0.0, 255.0), tf.uint8)


def _grey(image: tf.Tensor) -> tf.Tensor:
  """PIL's convert('L') in integers (ITU-R 601-2 luma), as uint8 [h, w, 1]."""
  weighted = tf.cast(image, tf.int32) * tf.constant([19595, 38470, 7471])
  return tf.cast((tf.reduce_sum(weighted, axis=-1, keepdims=True) + 2**15) // 2**16, tf.uint8)


def autocontrast(image: tf.Tensor) -> tf.Tensor:
  """Stretches each channel linearly to [0, 255]; a constant channel is kept."""
  # PIL's formula and precision (the top value can land at 254.99...), so the two agree exactly.
  pixels = tf.cast(image, tf.float64)
  lo = tf.reduce_min(pixels, axis=[0, 1])
  hi = tf.reduce_max(pixels, axis=[0, 1])
  scale = 255.0 / tf.maximum(hi - lo, 1.0)
  stretched = pixels * scale - lo * scale
  return tf.where(hi > lo, tf.cast(tf.clip_by_value(stretched, 0.0, 255.0), tf.uint8), image)


def equalize(image: tf.Tensor) -> tf.Tensor:
  """Histogram equalisation of each channel, with PIL's lookup table."""
  pixels = tf.transpose(tf.reshape(tf.cast(image, tf.int32), [-1, 3]))  # [3, h * w]
  hist = tf.math.bincount(pixels, minlength=256, maxlength=256, axis=-1)  # [3, 256]
  top_count = tf.gather(hist, tf.reduce_max(pixels, axis=1), batch_dims=1)
  # [3]; 0 (under 255 pixels below the top value) keeps the channel, as PIL does.
  step = (tf.shape(pixels)[1] - top_count) // 255
  below = tf.cumsum(hist, axis=1, exclusive=True)
  lut = tf.minimum((below + step[:, None] // 2) // tf.maximum(step, 1)[:, None], 255)
  equalized = tf.where(step[:, None] > 0, tf.gather(lut, pixels, batch_dims=1), pixels)
  return tf.reshape(tf.cast(tf.transpose(equalized), tf.uint8), tf.shape(image))


def invert(image: tf.Tensor) -> tf.Tensor:
  return 255 - image


def posterize(image: tf.Tensor, bits: int) -> tf.Tensor:
  """Keeps the `bits` high bits of each value."""
  return tf.bitwise.bitwise_and(image, tf.constant(256 - 2**(8 - bits), tf.uint8))


def solarize(image: tf.Tensor, threshold: int) -> tf.Tensor:
  """Inverts the values >= threshold."""
  return tf.where(tf.cast(image, tf.int32) < threshold, image, 255 - image)


def solarize_add(image: tf.Tensor, addition: int) -> tf.Tensor:
  """Adds `addition` to the values below 128, clipping at 255."""
  added = tf.cast(tf.minimum(tf.cast(image, tf.int32) + addition, 255), tf.uint8)
  return tf.where(image < _SOLARIZE_ADD_THRESHOLD, added, image)


def color(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Color: 0 is grey, 1 the image, above 1 more saturated."""
  return _blend(tf.image.grayscale_to_rgb(_grey(image)), image, factor)


def contrast(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Contrast: 0 is the mean grey level, 1 the image."""
  # PIL rounds a mean ending in .5 up (int(mean + 0.5)), not to even as tf.round does; summed in
  # integers so that the mean of a large image is exact.
  grey = _grey(image)
  total = tf.cast(tf.reduce_sum(tf.cast(grey, tf.int64)), tf.float64)
  mean = tf.cast(tf.floor(total / tf.cast(tf.size(grey), tf.float64) + 0.5), image.dtype)
  return _blend(tf.fill(tf.shape(image), mean), image, factor)


def brightness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Brightness: 0 is black, 1 the image."""
  return _blend(tf.zeros_like(image), image, factor)


def sharpness(image: tf.Tensor, factor: float) -> tf.Tensor:
  """PIL's ImageEnhance.Sharpness: 0 is PIL's SMOOTH filter (border pixels kept), 1 the image."""
  kernel = tf.constant([[1, 1, 1], [1, 5, 1], [1, 1, 1]], tf.float32) / 13
  kernel = tf.tile(kernel[:, :, None, None], [1, 1, 3, 1])
  # 'SAME' and a mask rather than 'VALID' and padding: an image under 3 pixels on a side is all
  # border, which PIL returns as it is.
  smooth = tf.nn.depthwise_conv2d(
      tf.cast(image, tf.float32)[None], kernel, strides=[1, 1, 1, 1], padding='SAME')[0]
  smooth = tf.cast(tf.round(tf.clip_by_value(smooth, 0.0, 255.0)), tf.uint8)
  height, width = tf.shape(image)[0], tf.shape(image)[1]
  rows, cols = tf.range(height), tf.range(width)
  interior = (((rows >= 1) & (rows < height - 1))[:, None, None]
              & ((cols >= 1) & (cols < width - 1))[None, :, None])
  smooth = tf.where(interior, smooth, image)
  return _blend(smooth, image, factor)


def _affine(image: tf.Tensor, matrix: list) -> tf.Tensor:
  """Output pixel (x, y) takes input pixel round(a x + b y + c, d x + e y + f); [a..f] = matrix.

  Pixels mapped from outside the image are grey.
  """
  transform = tf.cast(tf.stack(list(matrix) + [0.0, 0.0]), tf.float32)[None]
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=image[None], transforms=transform, output_shape=tf.shape(image)[:2],
      fill_value=float(_FILL), interpolation='NEAREST', fill_mode='CONSTANT')[0]


def rotate(image: tf.Tensor, degrees: tf.Tensor) -> tf.Tensor:
  """Rotates counter-clockwise about the image centre."""
  radians = tf.cast(degrees, tf.float32) * (math.pi / 180)
  cos, sin = tf.cos(radians), tf.sin(radians)
  h, w = (tf.cast(size - 1, tf.float32) for size in tf.unstack(tf.shape(image)[:2]))
  # The offsets map the centre ((w - 1) / 2, (h - 1) / 2) onto itself.
  return _affine(image, [cos, -sin, (w - cos * w + sin * h) / 2,
                         sin, cos, (h - sin * w - cos * h) / 2])


def shear_x(image: tf.Tensor, level: tf.Tensor) -> tf.Tensor:
  return _affine(image, [1.0, level, 0.0, 0.0, 1.0, 0.0])


def shear_y(image: tf.Tensor, level: tf.Tensor) -> tf.Tensor:
  return _affine(image, [1.0, 0.0, 0.0, level, 1.0, 0.0])


def translate_x(image: tf.Tensor, pixels: tf.Tensor) -> tf.Tensor:
  """Moves the content `pixels` to the left (right if negative)."""
  return _affine(image, [1.0, 0.0, pixels, 0.0, 1.0, 0.0])


def translate_y(image: tf.Tensor, pixels: tf.Tensor) -> tf.Tensor:
  """Moves the content `pixels` up (down if negative)."""
  return _affine(image, [1.0, 0.0, 0.0, 0.0, 1.0, pixels])


def cutout(image: tf.Tensor, half_size: int, center: tf.Tensor) -> tf.Tensor:
  """Greys rows [cy - half_size, cy + half_size) x columns [cx - half_size, cx + half_size)."""
  shape = tf.shape(image)
  rows = tf.range(shape[0])[:, None] - center[0]
  cols = tf.range(shape[1])[None, :] - center[1]
  inside = (rows >= -half_size) & (rows < half_size) & (cols >= -half_size) & (cols < half_size)
  return tf.where(inside[:, :, None], tf.constant(_FILL, tf.uint8), image)


# Name -> the op, on a uint8 [h, w, 3] image and the arguments from `op_args`; reference's order.
OPS: dict[str, Callable[..., tf.Tensor]] = {
    'AutoContrast': autocontrast,
    'Equalize': equalize,
    'Invert': invert,
    'Rotate': rotate,
    'Posterize': posterize,
    'Solarize': solarize,
    'Color': color,
    'Contrast': contrast,
    'Brightness': brightness,
    'Sharpness': sharpness,
    'ShearX': shear_x,
    'ShearY': shear_y,
    'TranslateX': translate_x,
    'TranslateY': translate_y,
    'Cutout': cutout,
    'SolarizeAdd': solarize_add,
}


def _random_sign(value: float, seed: tf.Tensor) -> tf.Tensor:
  """`value` or `-value`, each with probability 1/2: geometric ops go either way."""
  return tf.where(tf.random.stateless_uniform([], seed) < 0.5, value, -value)


def _random_center(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """A uniformly drawn pixel (y, x) of the image."""
  size = tf.shape(image)[:2]
  return tf.cast(tf.random.stateless_uniform([2], seed) * tf.cast(size, tf.float32), tf.int32)


def _enhance_factor(level: float) -> float:
  return level * 1.8 + 0.1


# Name -> (level = magnitude / 10, seed, image) -> the op's arguments after the image.
_ARGS: dict[str, Callable[[float, tf.Tensor, tf.Tensor], tuple]] = {
    'AutoContrast': lambda level, seed, image: (),
    'Equalize': lambda level, seed, image: (),
    'Invert': lambda level, seed, image: (),
    'Rotate': lambda level, seed, image: (_random_sign(level * 30.0, seed),),
    'Posterize': lambda level, seed, image: (int(level * 4),),
    'Solarize': lambda level, seed, image: (int(level * 256),),
    'Color': lambda level, seed, image: (_enhance_factor(level),),
    'Contrast': lambda level, seed, image: (_enhance_factor(level),),
    'Brightness': lambda level, seed, image: (_enhance_factor(level),),
    'Sharpness': lambda level, seed, image: (_enhance_factor(level),),
    'ShearX': lambda level, seed, image: (_random_sign(level * 0.3, seed),),
    'ShearY': lambda level, seed, image: (_random_sign(level * 0.3, seed),),
    'TranslateX': lambda level, seed, image: (_random_sign(level * _TRANSLATE_PIXELS, seed),),
    'TranslateY': lambda level, seed, image: (_random_sign(level * _TRANSLATE_PIXELS, seed),),
    'Cutout': lambda level, seed, image: (int(level * _CUTOUT_HALF_SIZE),
                                          _random_center(image, seed)),
    'SolarizeAdd': lambda level, seed, image: (int(level * 110),),
}


def op_args(name: str, magnitude: float, seed: tf.Tensor, image: tf.Tensor) -> tuple:
  """The arguments, after the image, of `OPS[name]` at `magnitude` and `seed`. 10 is the TF
  reference's top level; AugReg's recipes go to 20 (preprocess checks the bound)."""
  return _ARGS[name](magnitude / _MAX_LEVEL, seed, image)


def _apply(name: str, image: tf.Tensor, magnitude: float, seed: tf.Tensor) -> tf.Tensor:
  return OPS[name](image, *op_args(name, magnitude, seed, image))


def randaugment(image: tf.Tensor, seed: tf.Tensor, num_layers: int, magnitude: float) -> tf.Tensor:
  """Applies `num_layers` ops, each drawn uniformly from `OPS`, at `magnitude` (0-20, see op_args).

  `image` is float32 [h, w, 3] in [0, 255], `seed` a [2] int tensor; the output has the same shape,
  dtype and range, and is a function of (image, seed). The image is rounded to uint8 for the ops
  (0 layers: returned unchanged).
  """
  if num_layers == 0:
    return image
  augmented = tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)
  for layer_seed in tf.unstack(tf.random.experimental.stateless_split(seed, num_layers)):
    choice_seed, args_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
    choice = tf.random.stateless_uniform([], choice_seed, minval=0, maxval=len(OPS), dtype=tf.int32)
    branches = [functools.partial(_apply, name, augmented, magnitude, args_seed) for name in OPS]
    augmented = tf.ensure_shape(tf.switch_case(choice, branches), image.shape)
  return tf.cast(augmented, tf.float32)
