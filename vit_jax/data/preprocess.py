"""Per-example image ops, as TensorFlow graph functions for tf.data.

Every random op is stateless and takes its seed explicitly, so an augmented example is a pure function
of its bytes and its seed: the same example at the same stream position looks the same in a resumed run.

Train preprocessing is the crop named by `config.pp.crop` (a key of `CROPS`), then each op of
`AUGMENTS` in order. An op is `apply(image, seed, pp, image_size) -> image` plus a `check(pp)` of
the `config.pp` fields it reads; a crop maps uint8 [h, w, 3] to float32 [image_size, image_size, 3]
in [0, 255]; the augmentations keep that shape and dtype, and the range: [0, 255] before the
`normalize` entry of `AUGMENTS`, [-1, 1] (plus what they add) after it, where timm's random erasing
works. Each augmentation is off unless its `pp` field is set, so an op is one function (and its
check) and one entry. Op i's seed is the i-th of a prefix-stable sequence: it does not depend on the
ops after it.

Eval preprocessing is the crop named by `config.pp_eval.crop` (a key of `EVAL_CROPS`), then
`normalize`.
"""
import dataclasses
import functools
import math
from typing import Callable

import ml_collections
import tensorflow as tf

from vit_jax.data import augment
from vit_jax.data import randaugment

# Aspect ratios (width / height) of the inception crop, as in the original Inception and ViT code.
_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
# Largest RandAugment magnitude: AugReg's strongest recipes use 20; above it the reference's
# Posterize would keep more than 8 bits.
_MAX_RANDAUG_MAGNITUDE = 20


def _no_check(pp: ml_collections.ConfigDict) -> None:
  del pp  # Reads no field that can be wrong.


@dataclasses.dataclass(frozen=True)
class Op:
  """A train-time image op and the check (a one-line ValueError naming the field) of its fields."""
  apply: Callable[[tf.Tensor, tf.Tensor, ml_collections.ConfigDict, int], tf.Tensor]
  check: Callable[[ml_collections.ConfigDict], None] = _no_check


# The header bytes `decode` reads: up to a BMP's blue mask (file offset 62-65).
_HEADER_BYTES = 66
# Header fields `decode` reads: (file offset, bytes), each a little-endian unsigned integer.
_FIELDS = {
    'chunk': (12, 4), 'vp8x_flags': (20, 1), 'vp8l_bits': (24, 1),  # WebP's.
    'info_size': (14, 4), 'compression': (30, 4), 'colours': (46, 4),  # BMP's.
    'red_mask': (54, 4), 'green_mask': (58, 4), 'blue_mask': (62, 4),
}
# [fields, header bytes]: a field's row weights its bytes 1, 256, 256^2, 256^3 (float64 is exact).
_FIELD_WEIGHTS = [[256.0 ** (i - start) if start <= i < start + length else 0.0
                   for i in range(_HEADER_BYTES)] for start, length in _FIELDS.values()]


def _header_fields(data: tf.Tensor) -> dict[str, tf.Tensor]:
  """`_FIELDS` of `data`'s first bytes (zero-padded if it is shorter), as float64 scalars."""
  head = tf.strings.join([tf.strings.substr(data, 0, _HEADER_BYTES), b'\0' * _HEADER_BYTES])
  head = tf.cast(tf.io.decode_raw(head, tf.uint8)[:_HEADER_BYTES], tf.float64)
  weights = tf.constant(_FIELD_WEIGHTS, tf.float64)
  return dict(zip(_FIELDS, tf.unstack(tf.linalg.matvec(weights, head))))


def _bit(field: tf.Tensor, bit: int) -> tf.Tensor:
  return tf.math.floormod(tf.math.floordiv(field, 2 ** bit), 2) == 1


def _decode_webp(data: tf.Tensor) -> tf.Tensor:
  """A WebP's RGB, alpha dropped as PIL's convert('RGB') drops it. TensorFlow decodes a WebP only to
  exactly the channels it has (RGBA fails with channels=3, RGB with 4), so to the channels it has
  (channels=0); but that corrupts memory on an animation without alpha (TF 2.21: it decodes
  animations as RGBA), which fails here instead, by the header's flags as libwebp reads them."""
  f = _header_fields(data)
  vp8x = f['chunk'] == int.from_bytes(b'VP8X', 'little')
  animation_without_alpha = vp8x & _bit(f['vp8x_flags'], 1) & ~_bit(f['vp8x_flags'], 4)
  check = tf.raw_ops.Assert(condition=~animation_without_alpha,
                            data=['An animated WebP without alpha: not read'])
  with tf.control_dependencies([check]):
    rgb = tf.io.decode_image(data, channels=0, expand_animations=False)[..., :3]
  return tf.ensure_shape(rgb, [None, None, 3])  # 3 or 4 channels decoded: 3 kept.


def _decode_bmp(data: tf.Tensor) -> tf.Tensor:
  """A BMP's RGB. TensorFlow reads the pixel bytes only: it takes an 8-bit image's colour indices
  for grey levels, and ignores compression and bit fields. So the indices go through the palette
  here, and what TensorFlow would misread fails instead: run-length compression, bit fields other
  than BGR, an OS/2 header (its fields are elsewhere). 1-, 4- and 16-bit images fail in TensorFlow
  itself."""
  f = _header_fields(data)
  bgr_fields = ((f['red_mask'] == 0x00FF0000) & (f['green_mask'] == 0x0000FF00) &
                (f['blue_mask'] == 0x000000FF))
  readable = (f['info_size'] >= 40) & (
      (f['compression'] == 0) | ((f['compression'] == 3) & bgr_fields))
  check = tf.raw_ops.Assert(condition=readable, data=[
      'A BMP with run-length compression, bit fields other than BGR or an OS/2 header: not read'])
  with tf.control_dependencies([check]):
    image = tf.io.decode_bmp(data, channels=0)  # 1 (indices), 3 or 4 channels.
  # The palette, 256 entries of blue, green, red, 0 (zeros past its end), follows the header.
  table = tf.strings.substr(data, 14 + tf.cast(f['info_size'], tf.int64), 4 * 256)
  table = tf.io.decode_raw(tf.strings.join([table, b'\0' * 4 * 256]), tf.uint8)[:4 * 256]
  palette = tf.reshape(table, [256, 4])[:, 2::-1]
  through_palette = tf.gather(palette, tf.cast(image[..., 0], tf.int32))
  # Selected, not branched on: a cond here would nest in decode's switch (see there).
  rgb = tf.where(tf.shape(image)[-1] == 1, through_palette, image[..., :3])
  return tf.ensure_shape(rgb, [None, None, 3])


@functools.cache
def _format_table() -> tf.lookup.StaticHashTable:
  """A file's first two bytes -> `decode`'s branch: JPEG, WebP (RIFF), BMP; anything else 3 (PNG, GIF).
  Made eagerly (init_scope) even when first asked for while tf.data traces a function, so that every
  later trace and eager call can use the one cached table."""
  with tf.init_scope():
    return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant([b'\xff\xd8', b'RI', b'BM']), tf.constant([0, 1, 2], tf.int32)), default_value=3)


def decode(data: tf.Tensor) -> tf.Tensor:
  """Encoded JPEG / PNG / GIF / BMP / WebP bytes to uint8 [h, w, 3], whatever the extension says:
  pixel-exact as PIL's Image.open(f).convert('RGB') (timm's and torchvision's ImageFolder), in all
  the variants of tests/test_image_formats.py, but:
  - 16-bit greyscale PNGs: 8-bit here (the high byte, as PIL reads 16-bit RGB), where PIL clips the
    16-bit value to 255 (a white image);
  - transparent pixels of a GIF are black here, the palette's colour there (neither is the image);
  - some files PIL reads fail here (skipped, with a warning naming them): animated WebPs without
    alpha; 1-, 4- and 16-bit, OS/2 and run-length compressed BMPs.
  Greyscale becomes RGB, alpha is dropped (not blended), a GIF gives its first frame. EXIF
  orientation is not applied (as PIL's Image.open).

  JPEGs decode with libjpeg's accurate integer DCT, as PIL (so timm) does: pixel-exact, where
  TensorFlow's default DCT is up to 6 levels off (mean 1). It costs little: 1.47 vs 1.43 ms per
  224-500 px JPEG (2-core VM, min of 5 x 160 decodes; within the noise of repeats).

  One flat switch on the format's first two bytes, looked up in a table, no control flow nested in
  it (tf.debugging.Assert is a cond, the raw op is not): in tf.data a nested cond costs 0.1-0.7 ms an
  image, and comparing header fields ~0.03 ms. What the routing costs over a plain JPEG-or-not cond:
  0.089 against 0.069 ms per 32x32 PNG, level for JPEGs (2-core VM, one core, min of 5 x 2000).
  A RIFF file that is not a WebP, or bytes that are not an image, fail in their decoder."""
  branch = _format_table().lookup(tf.strings.substr(data, 0, 2))  # Shorter files: all they have.
  return tf.switch_case(branch, [
      lambda: tf.io.decode_jpeg(data, channels=3, dct_method='INTEGER_ACCURATE'),
      lambda: _decode_webp(data),
      lambda: _decode_bmp(data),
      lambda: tf.io.decode_image(data, channels=3, expand_animations=False),  # PNG, GIF.
  ])


def resize(image: tf.Tensor, size: int, antialias: bool = False) -> tf.Tensor:
  """Bilinear resize of [h, w, 3] to float32 [size, size, 3] in the input's value range.

  `antialias`: when shrinking, each output pixel averages every input pixel under the scaled triangle
  filter (PIL's resize, so timm's transforms); without it, only the 2x2 nearest ones (TensorFlow's
  default and the original code's), which aliases fine detail when downscaling by more than 2."""
  return tf.image.resize(image, (size, size), method='bilinear', antialias=antialias)


def normalize(image: tf.Tensor) -> tf.Tensor:
  """Pixel values in [0, 255] to float32 in [-1, 1]."""
  return tf.cast(image, tf.float32) / 127.5 - 1


def inception_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """A random crop covering [min_area, 1] of the image with aspect ratio in [3/4, 4/3]."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image),
      bounding_boxes=tf.zeros([1, 0, 4], tf.float32),
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=_ASPECT_RATIO_RANGE,
      area_range=(min_area, 1.0),
      use_image_if_no_bounding_boxes=True)
  return tf.slice(image, begin, size)


def random_resized_box(shape: tf.Tensor, seed: tf.Tensor, min_area: float,
                       tries: int = 10) -> tuple[tf.Tensor, tf.Tensor]:
  """torchvision's RandomResizedCrop box (timm's train crop), as (begin, size) for `tf.slice`.

  Up to `tries` draws of an area uniform in [min_area, 1] of the image and an aspect ratio (width /
  height) log-uniform in [3/4, 4/3]; the first box that fits lands at a uniform offset. If none fits,
  the central crop of the whole image, its aspect ratio clamped to that range. `inception_crop`
  differs: TensorFlow draws the ratio uniformly, then the height uniformly, over 100 tries."""
  height, width = tf.unstack(tf.cast(shape[:2], tf.float32))
  area_seed, ratio_seed, top_seed, left_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 4))
  area = tf.random.stateless_uniform([tries], area_seed, min_area, 1.0) * height * width
  low, high = _ASPECT_RATIO_RANGE
  ratio = tf.exp(tf.random.stateless_uniform([tries], ratio_seed, math.log(low), math.log(high)))
  # tf.round and Python's round (torchvision's) both round half to even.
  box_w, box_h = tf.round(tf.sqrt(area * ratio)), tf.round(tf.sqrt(area / ratio))
  fits = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)
  first = tf.argmax(tf.cast(fits, tf.int32))  # 0 when none fits, and then unused.
  in_ratio = width / height
  fallback_w = tf.where(in_ratio > high, tf.round(height * high), width)
  fallback_h = tf.where(in_ratio < low, tf.round(width / low), height)
  found = tf.reduce_any(fits)
  size_hw = tf.cast(tf.where(found, tf.stack([box_h[first], box_w[first]]),
                             tf.stack([fallback_h, fallback_w])), tf.int32)
  room = tf.cast(shape[:2], tf.int32) - size_hw
  random_offset = tf.stack([
      tf.random.stateless_uniform([], top_seed, 0, room[0] + 1, dtype=tf.int32),
      tf.random.stateless_uniform([], left_seed, 0, room[1] + 1, dtype=tf.int32)])
  offset = tf.where(found, random_offset, room // 2)
  return tf.concat([offset, [0]], 0), tf.concat([size_hw, [-1]], 0)


def random_resized_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """The crop of `random_resized_box`: timm's sampler of [min_area, 1] of the image."""
  begin, size = random_resized_box(tf.shape(image), seed, min_area)
  return tf.slice(image, begin, size)


def pad_and_random_crop(image: tf.Tensor, seed: tf.Tensor, pad: int) -> tf.Tensor:
  """Pads `pad` black pixels on every side, then crops back to the input size at a random offset."""
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  return tf.image.stateless_random_crop(padded, tf.shape(image), seed=seed)


def central_crop(image: tf.Tensor, size: int, crop_fraction: float,
                 antialias: bool = False) -> tf.Tensor:
  """Bilinear resize keeping the aspect ratio, the shorter side to round(size / crop_fraction), then
  the central size x size square (ImageNet's eval: 256 -> 224 at 0.875), float32 in the input's
  range; `antialias` as in `resize`."""
  shape = tf.cast(tf.shape(image)[:2], tf.float32)
  # The shorter side comes out exactly `target`: target * side / side is exact in float32.
  target = round(size / crop_fraction)
  scaled = tf.cast(tf.round(shape * target / tf.reduce_min(shape)), tf.int32)
  offset = (scaled - size) // 2
  return tf.slice(tf.image.resize(image, scaled, method='bilinear', antialias=antialias),
                  [offset[0], offset[1], 0], [size, size, 3])


def _inception(image, seed, pp, image_size):
  return resize(inception_crop(image, seed, pp.min_area), image_size, pp.antialias)


def _random_resized(image, seed, pp, image_size):
  return resize(random_resized_crop(image, seed, pp.min_area), image_size, pp.antialias)


def _check_min_area(pp: ml_collections.ConfigDict) -> None:
  if not 0 < pp.min_area <= 1:
    raise ValueError(f'config.pp.min_area={pp.min_area} must be in (0, 1], e.g. 0.05')


def _random(image, seed, pp, image_size):
  return pad_and_random_crop(resize(image, image_size, pp.antialias), seed, pp.pad)


def _check_pad(pp: ml_collections.ConfigDict) -> None:
  if pp.pad < 0:
    raise ValueError(f'config.pp.pad={pp.pad} must be >= 0 pixels')


def _resize(image, seed, pp, image_size):
  del seed  # Deterministic.
  return resize(image, image_size, pp.antialias)


def _flip(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  return tf.image.stateless_random_flip_left_right(image, seed) if pp.flip else image


def _randaug(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  return randaugment.randaugment(image, seed, pp.randaug_layers, pp.randaug_magnitude)


def _check_randaug(pp: ml_collections.ConfigDict) -> None:
  if pp.randaug_layers < 0:  # The config keeps it an integer.
    raise ValueError(f'config.pp.randaug_layers={pp.randaug_layers} must be >= 0, e.g. 2 (0: off)')
  if not 0 <= pp.randaug_magnitude <= _MAX_RANDAUG_MAGNITUDE:
    raise ValueError(f'config.pp.randaug_magnitude={pp.randaug_magnitude} must be in '
                     f'[0, {_MAX_RANDAUG_MAGNITUDE}], e.g. 10')


def _three_augment(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  return augment.three_augment(image, seed) if pp.three_augment else image


def _color_jitter(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  return augment.color_jitter(image, seed, pp.color_jitter) if pp.color_jitter else image


def _check_color_jitter(pp: ml_collections.ConfigDict) -> None:
  if not pp.color_jitter >= 0:
    raise ValueError(f'config.pp.color_jitter={pp.color_jitter} must be >= 0, e.g. 0.3 (0: off)')


def _normalize(image, seed, pp, image_size):
  del seed, pp, image_size  # Deterministic, and reads no field.
  return normalize(image)


def _erase(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  if not pp.erase_prob:
    return image
  return augment.random_erase(image, seed, pp.erase_prob, pp.erase_area, pp.erase_aspect)


def _check_erase(pp: ml_collections.ConfigDict) -> None:
  if not 0 <= pp.erase_prob <= 1:
    raise ValueError(f'config.pp.erase_prob={pp.erase_prob} must be in [0, 1], e.g. 0.25 (0: off)')
  if len(pp.erase_area) != 2 or not 0 < pp.erase_area[0] <= pp.erase_area[1] <= 1:
    raise ValueError(f'config.pp.erase_area={pp.erase_area} must be (min, max) area fractions with '
                     '0 < min <= max <= 1, e.g. (0.02, 0.33)')
  if len(pp.erase_aspect) != 2 or not 0 < pp.erase_aspect[0] <= pp.erase_aspect[1]:
    raise ValueError(f'config.pp.erase_aspect={pp.erase_aspect} must be (min, max) aspect ratios '
                     'with 0 < min <= max, e.g. (0.3, 3.3)')


# config.pp.crop -> the crop: TensorFlow's random resized crop (the original code's), torchvision's
# (timm's); resize, pad `pp.pad`, random crop; resize only.
CROPS: dict[str, Op] = {
    'inception': Op(_inception, _check_min_area),
    'random_resized': Op(_random_resized, _check_min_area),
    'random': Op(_random, _check_pad),
    'resize': Op(_resize),
}
# Applied after the crop, in this order; each but `normalize` is off unless its `pp` field is set.
# Add an op where its value range is (before or after normalize): its seed is the one of its
# position, so ops off at their defaults leave default runs bit-identical.
AUGMENTS: tuple[Op, ...] = (
    Op(_flip),
    Op(_randaug, _check_randaug),
    Op(_three_augment),  # A boolean field, always valid.
    Op(_color_jitter, _check_color_jitter),
    Op(_normalize),
    Op(_erase, _check_erase),  # timm erases normalised images.
)


def check_pp(pp: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the train preprocessing config is invalid."""
  if pp.crop not in CROPS:
    raise ValueError(f'Unknown config.pp.crop {pp.crop!r}: use one of {", ".join(map(repr, CROPS))}')
  for op in (CROPS[pp.crop], *AUGMENTS):
    op.check(pp)
  if pp.pad and pp.crop != 'random':  # Only that crop pads: with another the field does nothing.
    raise ValueError(f"config.pp.pad={pp.pad} pads the 'random' crop only, not config.pp.crop="
                     f"{pp.crop!r}: set --config.pp.crop=random, or --config.pp.pad=0")


def train_preprocess(image: tf.Tensor, seed: tf.Tensor, *, pp: ml_collections.ConfigDict,
                     image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to an augmented float32 [image_size, image_size, 3], normalised to
  [-1, 1] (random erasing adds N(0, 1) noise beyond it).

  `seed` is a [2] int tensor. `pp` must have passed `check_pp`.
  """
  ops = (CROPS[pp.crop], *AUGMENTS)
  # Split seeds are a prefix-stable sequence: op i's seed does not depend on how many ops follow.
  for op, op_seed in zip(ops, tf.unstack(tf.random.experimental.stateless_split(seed, len(ops)))):
    image = op.apply(image, op_seed, pp, image_size)
  return image


def _central(image, pp_eval, image_size):
  return central_crop(image, image_size, pp_eval.crop_fraction, pp_eval.antialias)


def _eval_resize(image, pp_eval, image_size):
  return resize(image, image_size, pp_eval.antialias)


# config.pp_eval.crop -> (image, pp_eval, image_size) -> float32 [image_size, image_size, 3] in
# [0, 255]: a resize to the square; the central square after resizing the shorter side.
EVAL_CROPS: dict[str, Callable[[tf.Tensor, ml_collections.ConfigDict, int], tf.Tensor]] = {
    'central': _central,
    'resize': _eval_resize,
}


def check_pp_eval(pp_eval: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the eval preprocessing config is invalid."""
  if pp_eval.crop not in EVAL_CROPS:
    raise ValueError(f'Unknown config.pp_eval.crop {pp_eval.crop!r}: use one of '
                     f'{", ".join(map(repr, EVAL_CROPS))}')
  if not 0 < pp_eval.crop_fraction <= 1:
    raise ValueError(f'config.pp_eval.crop_fraction={pp_eval.crop_fraction} must be in (0, 1], '
                     'e.g. 0.875')


def eval_preprocess(image: tf.Tensor, *, pp_eval: ml_collections.ConfigDict,
                    image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to float32 [image_size, image_size, 3] in [-1, 1], by the crop of
  `pp_eval` (which must have passed `check_pp_eval`)."""
  return normalize(EVAL_CROPS[pp_eval.crop](image, pp_eval, image_size))
