"""The train-time image ops of `config.pp` (preprocess.py's `train_preprocess` applies them): the
registries `CROPS` (config.pp.crop) and `AUGMENTS` (after the crop, in order), each entry an `Op`:
`apply(image, rng, pp, image_size) -> image`, a `check(pp)` of the fields it reads (a one-line
ValueError naming the field) and `on(pp)`. The crop boxes are drawn in `crops`, the pixels resized in
`images`, the augmentations computed in `augment` and `randaugment`.
"""

import dataclasses
from typing import Callable

import ml_collections
import numpy as np

from vit_jax.data import augment
from vit_jax.data import crops
from vit_jax.data import images
from vit_jax.data import randaugment
from vit_jax.data import resizing

# Largest RandAugment magnitude: AugReg's strongest recipes use 20; above it the reference's
# Posterize would keep more than 8 bits.
_MAX_RANDAUG_MAGNITUDE = 20


def _no_check(pp: ml_collections.ConfigDict) -> None:
  del pp  # Reads no field that can be wrong.


def _always(pp: ml_collections.ConfigDict) -> bool:
  del pp  # On in every config.
  return True


@dataclasses.dataclass(frozen=True)
class Op:
  """A train-time image op, the check (a one-line ValueError naming the field) of its fields, and
  whether `pp` turns it on. An op that is off is skipped before its generator is made: seeding one
  costs about as much as a small image's flip, for each example and op. A `channelwise` op does to
  each channel what it does to the others, whatever their values (the geometry, an affine map of
  the values), so it takes a greyscale [h, w, 1] image and gives what it gives its RGB image's
  channels; any other op is given the RGB image."""

  apply: Callable[[np.ndarray, np.random.Generator, ml_collections.ConfigDict, int], np.ndarray]
  check: Callable[[ml_collections.ConfigDict], None] = _no_check
  on: Callable[[ml_collections.ConfigDict], bool] = _always
  channelwise: bool = False


def _inception(image, rng, pp, image_size):
  geometry = lambda *shape: (crops.inception_box(shape, rng, pp.min_area), (image_size, image_size))
  return images.crop_and_resize(image, geometry, pp.antialias, pp.reducing_gap)


def _random_resized(image, rng, pp, image_size):
  geometry = lambda *shape: (
      crops.random_resized_box(shape, rng, pp.min_area),
      (image_size, image_size),
  )
  return images.crop_and_resize(image, geometry, pp.antialias, pp.reducing_gap)


def _check_min_area(pp: ml_collections.ConfigDict) -> None:
  if not 0 < pp.min_area <= 1:
    raise ValueError(f'config.pp.min_area={pp.min_area} must be in (0, 1], e.g. 0.05')


def _random(image, rng, pp, image_size):
  resized = images.crop_and_resize(image, images.whole(image_size), pp.antialias, pp.reducing_gap)
  return crops.pad_and_random_crop(resized, rng, pp.pad)


def _check_pad(pp: ml_collections.ConfigDict) -> None:
  if pp.pad < 0:
    raise ValueError(f'config.pp.pad={pp.pad} must be >= 0 pixels')


def _resize(image, rng, pp, image_size):
  del rng  # Deterministic.
  return images.crop_and_resize(image, images.whole(image_size), pp.antialias, pp.reducing_gap)


def _flip(image, rng, pp, image_size):
  del pp, image_size  # Keeps the size.
  if rng.random() >= 0.5:
    return image
  height, width, channels = image.shape
  mirrored = resizing.flat_columns(np.arange(width - 1, -1, -1), channels)
  return np.take(image.reshape(height, width * channels), mirrored, 1).reshape(image.shape)


def _randaug(image, rng, pp, image_size):
  del image_size  # Keeps the size.
  return randaugment.randaugment(image, rng, pp.randaug_layers, pp.randaug_magnitude)


def _check_randaug(pp: ml_collections.ConfigDict) -> None:
  if pp.randaug_layers < 0:  # The config keeps it an integer.
    raise ValueError(f'config.pp.randaug_layers={pp.randaug_layers} must be >= 0, e.g. 2 (0: off)')
  if not 0 <= pp.randaug_magnitude <= _MAX_RANDAUG_MAGNITUDE:
    raise ValueError(
        f'config.pp.randaug_magnitude={pp.randaug_magnitude} must be in '
        f'[0, {_MAX_RANDAUG_MAGNITUDE}], e.g. 10'
    )


def _three_augment(image, rng, pp, image_size):
  del pp, image_size  # Keeps the size.
  return augment.three_augment(image, rng)


def _color_jitter(image, rng, pp, image_size):
  del image_size  # Keeps the size.
  return augment.color_jitter(image, rng, pp.color_jitter)


def _check_color_jitter(pp: ml_collections.ConfigDict) -> None:
  if not 0 <= pp.color_jitter < float('inf'):
    raise ValueError(
        f'config.pp.color_jitter={pp.color_jitter} must be finite and >= 0, e.g. 0.3 (0: off)'
    )


def _normalize(image, rng, pp, image_size):
  del rng, pp, image_size  # Deterministic, and reads no field.
  return images.normalize(image)


# The entry of AUGMENTS after which the pixels are normalised: where the step can take uint8 ones.
NORMALIZE = Op(_normalize, channelwise=True)


def _erase(image, rng, pp, image_size):
  del image_size  # Keeps the size.
  return augment.random_erase(image, rng, pp.erase_prob, pp.erase_area, pp.erase_aspect)


def _check_erase(pp: ml_collections.ConfigDict) -> None:
  if not 0 <= pp.erase_prob <= 1:
    raise ValueError(f'config.pp.erase_prob={pp.erase_prob} must be in [0, 1], e.g. 0.25 (0: off)')
  if len(pp.erase_area) != 2 or not 0 < pp.erase_area[0] <= pp.erase_area[1] <= 1:
    raise ValueError(
        f'config.pp.erase_area={pp.erase_area} must be (min, max) area fractions with '
        '0 < min <= max <= 1, e.g. (0.02, 0.33)'
    )
  if len(pp.erase_aspect) != 2 or not 0 < pp.erase_aspect[0] <= pp.erase_aspect[1]:
    raise ValueError(
        f'config.pp.erase_aspect={pp.erase_aspect} must be (min, max) aspect ratios '
        'with 0 < min <= max, e.g. (0.3, 3.3)'
    )


# config.pp.crop -> the crop: TensorFlow's random resized crop (the original code's), torchvision's
# (timm's); resize, pad `pp.pad`, random crop; resize only.
CROPS: dict[str, Op] = {
    'inception': Op(_inception, _check_min_area, channelwise=True),
    'random_resized': Op(_random_resized, _check_min_area, channelwise=True),
    'random': Op(_random, _check_pad, channelwise=True),
    'resize': Op(_resize, channelwise=True),
}
# Applied after the crop, in this order; each but `normalize` is off unless its `pp` field is set.
# Add an op where its value range is (before or after normalize): its stream is the one of its
# position, so ops off at their defaults leave default runs bit-identical.
AUGMENTS: tuple[Op, ...] = (
    Op(_flip, on=lambda pp: pp.flip, channelwise=True),
    Op(_randaug, _check_randaug, on=lambda pp: pp.randaug_layers > 0),
    Op(_three_augment, on=lambda pp: pp.three_augment),  # A boolean field, always valid.
    Op(_color_jitter, _check_color_jitter, on=lambda pp: pp.color_jitter > 0),
    NORMALIZE,
    Op(_erase, _check_erase, on=lambda pp: pp.erase_prob > 0),  # timm erases normalised images.
)
