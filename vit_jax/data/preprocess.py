"""The train and eval preprocessing of a decoded image: the train ops' registries applied
(`train_ops.CROPS`, `train_ops.AUGMENTS`), the eval crops' (`EVAL_CROPS`), their config checks and
dtypes. The pixels are read and resized in `images`, the crop boxes drawn in `crops`.

Every random op draws only from the `np.random.Generator` it is given, so an augmented example is a
pure function of its bytes and its seed: the same example at the same stream position looks the same
in a resumed run, in whichever worker process it is prepared.

A decoded image (`images.decode`) is uint8 [h, w, 3], or [h, w, 1] for a greyscale one (whose RGB
image, `images.rgb`, is that channel three times): the ops that treat every channel alike and
apart (`Op.channelwise`: the crops, the flip, `normalize`) work on the one channel, a third of the
pixels, and the image becomes RGB before any other op and at the end, so its pixels are the RGB
image's to the bit.

Train preprocessing is the crop named by `config.pp.crop` (a key of `train_ops.CROPS`), then each
op of `train_ops.AUGMENTS` in order (an op: train_ops.py's `Op`). A crop maps uint8 [h, w, c] (or an
`images.Encoded` image, which it decodes: at a fraction of its size where `pp.reducing_gap` allows)
to [image_size, image_size, c] in [0, 255], uint8 with `pp.antialias` (PIL's 8-bit resize) and
float32 without; the augmentations keep that shape and the range: [0, 255] before the `normalize`
entry (`train_ops.NORMALIZE`), [-1, 1] (plus what they add) after it, where timm's random erasing
works. Where every op that is on keeps 8-bit pixels and none after `normalize` is on, the images
stop before it, uint8 (`train_dtype`), and the step normalises them on the device. Each augmentation
is off (skipped, no generator made) unless its `pp` field is set. Op i draws from
`np.random.default_rng([*seed, i])`: a prefix-stable sequence of streams, so op i's draws do not
depend on the ops after it.

Eval preprocessing is the crop named by `config.pp_eval.crop` (a key of `EVAL_CROPS`): uint8 pixels
with `pp_eval.antialias`, else `normalize`d (`eval_dtype`).
"""

from typing import Callable

import ml_collections
import numpy as np

from vit_jax import defaults
from vit_jax.data import crops
from vit_jax.data import images
from vit_jax.data import train_ops


def _check_reducing_gap(field: str, reducing_gap: float) -> None:
  if not (reducing_gap == 0 or reducing_gap >= 1):
    raise ValueError(
        f'{field}={reducing_gap} must be 0 (decode every image at its full size) or >= 1, e.g. '
        '3 (a JPEG decoded at 1/2, 1/4 or 1/8 of its size where 3x the output size remains)'
    )


def check_pp(pp: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the train preprocessing config is invalid."""
  if pp.crop not in train_ops.CROPS:
    raise ValueError(
        f'Unknown config.pp.crop {pp.crop!r}: use one of {", ".join(map(repr, train_ops.CROPS))}'
    )
  _check_reducing_gap('config.pp.reducing_gap', pp.reducing_gap)
  for op in (train_ops.CROPS[pp.crop], *train_ops.AUGMENTS):
    op.check(pp)


# The fields that only some crops read, by the crops that read them: with another crop a value other
# than the default would silently do nothing.
CROP_FIELDS = {
    'pp': {'min_area': ('inception', 'random_resized'), 'pad': ('random',)},
    'pp_eval': {'crop_fraction': ('central',)},
}


def check_run(config: ml_collections.ConfigDict) -> None:
  """A run's checks of config.pp and config.pp_eval: `check_pp`, `check_pp_eval`, and (not the
  pipelines', which read earlier runs' configs too) no `CROP_FIELDS` changed from their defaults with
  a crop that does not read them."""
  check_pp(config.pp)
  check_pp_eval(config.pp_eval)
  for section, fields in CROP_FIELDS.items():
    _check_crop_fields(section, config[section], fields)


def _check_crop_fields(
    section: str, pp: ml_collections.ConfigDict, fields: dict[str, tuple[str, ...]]
) -> None:
  default = defaults.get_config()[section]
  for field, crops_reading in fields.items():
    if pp.crop not in crops_reading and pp[field] != default[field]:
      raise ValueError(
          f'config.{section}.{field}={pp[field]} is a field of the crop '
          f'{" or ".join(map(repr, crops_reading))} only, not config.{section}.crop={pp.crop!r}: '
          f'set --config.{section}.crop={crops_reading[0]}, or --config.{section}.{field}='
          f'{default[field]}'
      )


def train_dtype(pp: ml_collections.ConfigDict) -> type[np.generic]:
  """The dtype of `train_preprocess`'s images: uint8 pixels where every op that is on keeps 8-bit
  pixels (the antialiased crops, flip, RandAugment) and none works on normalised ones (random
  erasing); else float32 in [-1, 1]. A uint8 batch is a quarter of the bytes to stack, share between
  processes and copy to the device, where the step normalises it (`on_device.model_input`)."""
  eight_bit = pp.antialias and not pp.three_augment and not pp.color_jitter
  return np.uint8 if eight_bit and not pp.erase_prob else np.float32


def _checked(image: np.ndarray, dtype: type[np.generic]) -> np.ndarray:
  """The preprocessed image as the batch takes it: RGB, C-contiguous, of the declared dtype."""
  if image.dtype != dtype:  # An op's dtype out of step with train_dtype / eval_dtype: a bug here.
    raise TypeError(f'preprocessing made {image.dtype} images where {np.dtype(dtype)} was declared')
  return np.ascontiguousarray(images.rgb(image))


def train_preprocess(
    image: np.ndarray | images.Encoded,
    seed: tuple[int, ...],
    *,
    pp: ml_collections.ConfigDict,
    image_size: int,
) -> np.ndarray:
  """Decoded uint8 [h, w, 3] (or greyscale [h, w, 1]), or an `images.Encoded` image that the crop
  decodes (`images.UnreadableImage` where it cannot), to an augmented C-contiguous RGB
  [image_size, image_size, 3] of `train_dtype(pp)`: uint8 pixels, or float32 normalised to [-1, 1]
  (random erasing adds N(0, 1) noise beyond it). `model_input` of either is the same.

  `seed`: non-negative integers; op i draws from np.random.default_rng([*seed, i]). `pp` must have
  passed `check_pp`."""
  dtype = train_dtype(pp)
  for i, op in enumerate((train_ops.CROPS[pp.crop], *train_ops.AUGMENTS)):
    if op is train_ops.NORMALIZE and dtype == np.uint8:
      break  # The step normalises; no op after it is on.
    if op.on(pp):
      if not op.channelwise:
        image = images.rgb(image)
      image = op.apply(image, np.random.default_rng([*seed, i]), pp, image_size)
  return _checked(image, dtype)


def model_input(image: np.ndarray) -> np.ndarray:
  """An image of `train_preprocess` or `eval_preprocess` as the model takes it: float32 in [-1, 1]
  (uint8 pixels normalised, as `on_device.model_input` does in a step; float32 as it is)."""
  return images.normalize(image) if image.dtype == np.uint8 else image


def _central(image, pp_eval, image_size):
  return crops.central_crop(
      image, image_size, pp_eval.crop_fraction, pp_eval.antialias, pp_eval.reducing_gap
  )


def _eval_resize(image, pp_eval, image_size):
  return images.crop_and_resize(
      image, images.whole(image_size), pp_eval.antialias, pp_eval.reducing_gap
  )


# config.pp_eval.crop -> (image, pp_eval, image_size) -> float32 [image_size, image_size, 3] in
# [0, 255]: a resize to the square; the central square after resizing the shorter side.
EVAL_CROPS: dict[str, Callable[[np.ndarray, ml_collections.ConfigDict, int], np.ndarray]] = {
    'central': _central,
    'resize': _eval_resize,
}


def check_pp_eval(pp_eval: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the eval preprocessing config is invalid."""
  if pp_eval.crop not in EVAL_CROPS:
    raise ValueError(
        f'Unknown config.pp_eval.crop {pp_eval.crop!r}: use one of '
        f'{", ".join(map(repr, EVAL_CROPS))}'
    )
  if not 0 < pp_eval.crop_fraction <= 1:
    raise ValueError(
        f'config.pp_eval.crop_fraction={pp_eval.crop_fraction} must be in (0, 1], ' 'e.g. 0.875'
    )
  _check_reducing_gap('config.pp_eval.reducing_gap', pp_eval.reducing_gap)


def eval_dtype(pp_eval: ml_collections.ConfigDict) -> type[np.generic]:
  """The dtype of `eval_preprocess`'s images: uint8 pixels from the antialiased crops, else float32
  in [-1, 1] (TensorFlow's resize interpolates between levels)."""
  return np.uint8 if pp_eval.antialias else np.float32


def eval_preprocess(
    image: np.ndarray | images.Encoded, *, pp_eval: ml_collections.ConfigDict, image_size: int
) -> np.ndarray:
  """Decoded uint8 [h, w, 3] (or greyscale [h, w, 1]), or an `images.Encoded` image that the crop
  decodes (`images.UnreadableImage` where it cannot), to C-contiguous RGB
  [image_size, image_size, 3] of `eval_dtype(pp_eval)`, by the crop of `pp_eval` (which must have
  passed `check_pp_eval`): uint8 pixels, or float32 in [-1, 1]; `model_input` of it is what the
  model sees."""
  image = EVAL_CROPS[pp_eval.crop](image, pp_eval, image_size)
  dtype = eval_dtype(pp_eval)
  return _checked(image if dtype == np.uint8 else images.normalize(image), dtype)
