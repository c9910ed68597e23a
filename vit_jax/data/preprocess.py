"""Per-example image ops, as TensorFlow graph functions for tf.data.

Every random op is stateless and takes its seed explicitly, so an augmented example is a pure function
of its bytes and its seed: the same example at the same stream position looks the same in a resumed run.

Train preprocessing is the crop named by `config.pp.crop` (a key of `CROPS`), then each op of
`AUGMENTS` in order, then `normalize`. An op is `apply(image, seed, pp, image_size) -> image` plus a
`check(pp)` of the `config.pp` fields it reads; a crop maps uint8 [h, w, 3] to float32
[image_size, image_size, 3] in [0, 255], an augmentation keeps that shape, dtype and range. Adding a
crop or an augmentation (e.g. RandAugment, random erasing: off unless its `pp` field is set) is one
function (and its check) and one entry.
"""
import dataclasses
from typing import Callable

import ml_collections
import tensorflow as tf

# Aspect ratios (width / height) of the inception crop, as in the original Inception and ViT code.
_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def _no_check(pp: ml_collections.ConfigDict) -> None:
  del pp  # Reads no field that can be wrong.


@dataclasses.dataclass(frozen=True)
class Op:
  """A train-time image op and the check (a one-line ValueError naming the field) of its fields."""
  apply: Callable[[tf.Tensor, tf.Tensor, ml_collections.ConfigDict, int], tf.Tensor]
  check: Callable[[ml_collections.ConfigDict], None] = _no_check


def decode(data: tf.Tensor) -> tf.Tensor:
  """Encoded JPEG / PNG / GIF / BMP bytes to uint8 [h, w, 3]; greyscale becomes RGB."""
  return tf.io.decode_image(data, channels=3, expand_animations=False)


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
  """Bilinear resize of [h, w, 3] to float32 [size, size, 3] in the input's value range."""
  return tf.image.resize(image, (size, size), method='bilinear')


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


def pad_and_random_crop(image: tf.Tensor, seed: tf.Tensor, pad: int) -> tf.Tensor:
  """Pads `pad` black pixels on every side, then crops back to the input size at a random offset."""
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  return tf.image.stateless_random_crop(padded, tf.shape(image), seed=seed)


def _inception(image, seed, pp, image_size):
  return resize(inception_crop(image, seed, pp.min_area), image_size)


def _check_min_area(pp: ml_collections.ConfigDict) -> None:
  if not 0 < pp.min_area <= 1:
    raise ValueError(f'config.pp.min_area={pp.min_area} must be in (0, 1], e.g. 0.05')


def _random(image, seed, pp, image_size):
  return pad_and_random_crop(resize(image, image_size), seed, pp.pad)


def _check_pad(pp: ml_collections.ConfigDict) -> None:
  if pp.pad < 0:
    raise ValueError(f'config.pp.pad={pp.pad} must be >= 0 pixels')


def _resize(image, seed, pp, image_size):
  del seed, pp  # Deterministic, and reads no field.
  return resize(image, image_size)


def _flip(image, seed, pp, image_size):
  del image_size  # Keeps the size.
  return tf.image.stateless_random_flip_left_right(image, seed) if pp.flip else image


# config.pp.crop -> the crop: random resized crop; resize, pad `pp.pad`, random crop; resize only.
CROPS: dict[str, Op] = {
    'inception': Op(_inception, _check_min_area),
    'random': Op(_random, _check_pad),
    'resize': Op(_resize),
}
# Applied after the crop, in this order; each is off unless its `pp` field says otherwise. Append new
# ones: an op's seed is the same whatever ops come after it.
AUGMENTS: tuple[Op, ...] = (Op(_flip),)


def check_pp(pp: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the train preprocessing config is invalid."""
  if pp.crop not in CROPS:
    raise ValueError(f'Unknown config.pp.crop {pp.crop!r}: use one of {", ".join(map(repr, CROPS))}')
  for op in (CROPS[pp.crop], *AUGMENTS):
    op.check(pp)


def train_preprocess(image: tf.Tensor, seed: tf.Tensor, *, pp: ml_collections.ConfigDict,
                     image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to an augmented float32 [image_size, image_size, 3] in [-1, 1].

  `seed` is a [2] int tensor. `pp` must have passed `check_pp`.
  """
  ops = (CROPS[pp.crop], *AUGMENTS)
  # Split seeds are a prefix-stable sequence: op i's seed does not depend on how many ops follow.
  for op, op_seed in zip(ops, tf.unstack(tf.random.experimental.stateless_split(seed, len(ops)))):
    image = op.apply(image, op_seed, pp, image_size)
  return normalize(image)


def eval_preprocess(image: tf.Tensor, *, image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to float32 [image_size, image_size, 3] in [-1, 1]: resize only."""
  return normalize(resize(image, image_size))
