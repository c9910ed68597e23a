"""Per-example image ops on numpy arrays, with PIL for decoding and antialiased resizing.

Every random op draws only from the `np.random.Generator` it is given, so an augmented example is a
pure function of its bytes and its seed: the same example at the same stream position looks the same
in a resumed run, in whichever worker process it is prepared.

A decoded image is uint8 [h, w, 3], or [h, w, 1] for a greyscale one (whose RGB image, `rgb`, is that
channel three times, as PIL's convert('RGB') makes it): the ops that treat every channel alike and
apart (`Op.channelwise`: the crops, the flip, `normalize`) work on the one channel, a third of the
pixels, and the image becomes RGB before any other op and at the end, so its pixels are the RGB
image's to the bit.

Train preprocessing is the crop named by `config.pp.crop` (a key of `CROPS`), then each op of
`AUGMENTS` in order. An op is `apply(image, rng, pp, image_size) -> image`, a `check(pp)` of the
`config.pp` fields it reads and `on(pp)`; a crop maps uint8 [h, w, c] to [image_size, image_size, c] in
[0, 255], uint8 with `pp.antialias` (PIL's 8-bit resize) and float32 without; the augmentations
keep that shape and the range: [0, 255] before the `normalize` entry of `AUGMENTS`, [-1, 1] (plus
what they add) after it, where timm's random erasing works. Where every op that is on keeps 8-bit
pixels and none after `normalize` is on, the images stop before it, uint8 (`train_dtype`), and the
step normalises them on the device. Each augmentation is off (skipped, no generator made) unless
its `pp` field is set, so an op is one entry of three functions. Op i draws from `np.random.default_rng([*seed, i])`:
a prefix-stable sequence of streams, so op i's draws do not depend on the ops after it.

Eval preprocessing is the crop named by `config.pp_eval.crop` (a key of `EVAL_CROPS`): uint8 pixels
with `pp_eval.antialias`, else `normalize`d (`eval_dtype`).

The pixel work is PIL's (decoding, antialiased resizing), which releases the GIL while it runs, or
whole-array numpy: no per-pixel Python.
"""

import dataclasses
import io
import math
from typing import Callable

import ml_collections
import numpy as np
from PIL import Image

from vit_jax.data import augment
from vit_jax.data import randaugment

# The extensions of the files an image folder lists: formats PIL reads (each checked in
# tests/data/test_image_formats.py against a file PIL wrote). `decode` reads by content, not by name.
IMAGE_EXTENSIONS = (
    '.jpg',
    '.jpeg',
    '.png',
    '.bmp',
    '.gif',
    '.webp',
    '.tif',
    '.tiff',
    '.ppm',
    '.pgm',
    '.pbm',
    '.pnm',
    '.jp2',
)

# Aspect ratios (width / height) of the inception crop, as in the original Inception and ViT code.
_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)
# Boxes TensorFlow's sample_distorted_bounding_box tries before it takes the whole image.
_INCEPTION_TRIES = 100
# Largest RandAugment magnitude: AugReg's strongest recipes use 20; above it the reference's
# Posterize would keep more than 8 bits.
_MAX_RANDAUG_MAGNITUDE = 20
# What a file checked out without `git lfs pull` holds instead of the image.
_LFS_POINTER = b'version https://git-lfs'


class UnreadableImage(ValueError):
  """Bytes that `decode` cannot read as an image; the message is a one-line reason."""


def decode(data: bytes) -> np.ndarray:
  """Encoded image bytes, any format PIL reads, whatever a file name says, to uint8 [h, w, 3], or
  [h, w, 1] for an 8-bit greyscale image (PIL's mode 'L'): `rgb` of it is exactly PIL's
  Image.open(BytesIO(data)).convert('RGB'), what timm's and torchvision's ImageFolder train on,
  because it is that. So every variant PIL reads is read as PIL reads it: JPEG (with
  libjpeg's accurate integer DCT, at full resolution: no draft mode, which changes pixels), PNG of
  any bit depth (16-bit greyscale clipped to 255 as PIL's conversion clips it), GIF (the first
  frame; transparent pixels take their palette colour), every BMP PIL reads (1-, 4-, 8-, 16-, 24-
  and 32-bit, run-length compressed, OS/2), WebP (animations too: the first frame), TIFF, PNM and
  JPEG 2000. Greyscale becomes RGB, alpha is dropped (not blended), EXIF orientation is not applied
  (as PIL's Image.open). The array is read-only.

  Raises UnreadableImage with a one-line reason for bytes PIL cannot read (truncated or corrupt
  files, other formats, a git-lfs pointer file in place of the image)."""
  if data.startswith(_LFS_POINTER):
    raise UnreadableImage('a git-lfs pointer, not the image')
  try:
    with Image.open(io.BytesIO(data)) as image:
      if image.mode == 'L':  # Its RGB is this channel thrice: the ops before `rgb` do a third.
        return np.asarray(image)[..., None]
      # convert('RGB') of an RGB image is a copy: skipping it saves one copy of the pixels.
      return np.asarray(image if image.mode == 'RGB' else image.convert('RGB'))
  except Image.UnidentifiedImageError:
    raise UnreadableImage('not an image format PIL reads') from None
  # PIL's decoders raise many types for corrupt data (OSError, SyntaxError, ValueError, EOFError,
  # struct.error, DecompressionBombError, ...): each makes the file unreadable, not the run fail.
  except Exception as e:  # pylint: disable=broad-exception-caught
    reason = str(e).strip().splitlines()
    raise UnreadableImage(f'{type(e).__name__}: {reason[0]}' if reason else type(e).__name__) from e


def _pil_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """PIL's bilinear (antialiased) resize to [height, width, channels]. A uint8 image is resized as
  an 8-bit 'RGB' (or greyscale 'L') image (rounded to integers after each 1-D pass), exactly as
  timm's transforms resize the uint8 crops they take of decoded images, and stays uint8 (a quarter
  of the bytes for the ops after it to move); any other dtype to float32, one channel at a time in
  float mode 'F' (no rounding). PIL resizes each channel of an 'RGB' image as it resizes an 'L' one.
  """
  if image.dtype == np.uint8:
    pil = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image)  # 'L' or 'RGB'.
    resized = pil.resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(resized).reshape(height, width, image.shape[-1])
  channels = [
      np.asarray(
          Image.fromarray(np.ascontiguousarray(image[..., c], np.float32)).resize(
              (width, height), Image.Resampling.BILINEAR
          )
      )
      for c in range(image.shape[-1])
  ]
  return np.stack(channels, axis=-1)


def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """TensorFlow's half-pixel-centre bilinear taps along one axis: (lower, upper, weight of upper),
  in its float32 arithmetic (resize_bilinear_op.cc's compute_interpolation_weights)."""
  scale = np.float32(in_size / out_size)
  position = (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
  floor = np.floor(position)
  lower = np.maximum(floor, 0).astype(np.intp)
  upper = np.minimum(np.ceil(position), in_size - 1).astype(np.intp)
  return lower, upper, position - floor


def _flat_columns(columns: np.ndarray, channels: int) -> np.ndarray:
  """The indices of pixel columns `columns` in an image's rows flattened to [h, w * channels]:
  numpy loops over such rows 5-20x faster than over [h, w, 3]'s pixels (an inner loop of 3). Taken
  with np.take, which writes C-contiguous rows (image[:, indices] writes them transposed)."""
  return (columns[:, None] * channels + np.arange(channels)).ravel()


def _tf_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
  """TensorFlow's tf.image.resize(method='bilinear', antialias=False) to float32 [height, width, 3]:
  each output pixel interpolates the 2x2 input pixels nearest its centre, in TensorFlow's order of
  float32 operations (left-right, then top-bottom)."""
  in_height, in_width, channels = image.shape
  top, bottom, y_weight = _bilinear_taps(in_height, height)
  left, right, x_weight = _bilinear_taps(in_width, width)
  left, right = _flat_columns(left, channels), _flat_columns(right, channels)
  x_weight = np.repeat(x_weight, channels)
  rows = image.reshape(in_height, in_width * channels)

  def lerp(low: np.ndarray, high: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """low + (high - low) * weight, in place in `high`: glibc maps each new array this large
    afresh, and its page faults cost more than the arithmetic."""
    high -= low
    high *= weight
    high += low
    return high

  def horizontal(taps: np.ndarray) -> np.ndarray:
    # Gathered before the conversion to float32, so that only the taps are converted: new arrays.
    left_taps, right_taps = (
        np.take(taps, c, 1).astype(np.float32, copy=False) for c in (left, right)
    )
    return lerp(left_taps, right_taps, x_weight)

  upper, lower = horizontal(rows[top]), horizontal(rows[bottom])
  return lerp(upper, lower, y_weight[:, None]).reshape(height, width, channels)


def _resize_to(image: np.ndarray, height: int, width: int, antialias: bool) -> np.ndarray:
  if image.shape[:2] == (height, width):  # Both filters leave an image at its size as it is.
    return image if antialias and image.dtype == np.uint8 else image.astype(np.float32)
  return (_pil_resize if antialias else _tf_resize)(image, height, width)


def resize(image: np.ndarray, size: int, antialias: bool = False) -> np.ndarray:
  """Bilinear resize of [h, w, c] to [size, size, c] in the input's value range: uint8 for a uint8
  image with `antialias`, else float32.

  `antialias`: PIL's bilinear resize (timm's transforms): when shrinking, each output pixel averages
  every input pixel under the scaled triangle filter; uint8 images are resized in 8 bits, as timm
  resizes its uint8 crops, so the crops' outputs are timm's to the bit. Without it, TensorFlow's
  default (the original code's): only the 2x2 nearest input pixels, which aliases fine detail when
  shrinking by more than 2."""
  return _resize_to(image, size, size, antialias)


def rgb(image: np.ndarray) -> np.ndarray:
  """[h, w, 3] as it is; greyscale [h, w, 1] as RGB, its channel three times."""
  return image if image.shape[-1] == 3 else np.concatenate((image, image, image), axis=-1)


def normalize(image: np.ndarray) -> np.ndarray:
  """Pixel values in [0, 255] to a new C-contiguous float32 array in [-1, 1]."""
  out = image.astype(np.float32, order='C')
  out /= np.float32(127.5)
  out -= np.float32(1)
  return out


# `normalize` of each uint8 level. The step normalises uint8 batches by looking their pixels up here
# (`on_device.model_input`), so its images equal the host's to the bit on every backend: XLA's own
# arithmetic for the same formula multiplies by a rounded reciprocal and fuses the multiply-add, and
# differs in the last bit for most levels.
LEVELS = normalize(np.arange(256, dtype=np.uint8))


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


def inception_crop(image: np.ndarray, rng: np.random.Generator, min_area: float) -> np.ndarray:
  """A random crop covering [min_area, 1] of the image with aspect ratio in [3/4, 4/3]: TensorFlow's
  sample_distorted_bounding_box (the original code's crop) with the whole image as the object, its
  arithmetic in float64 instead of float32. Up to 100 tries, each of an aspect ratio (width /
  height) uniform in [3/4, 4/3], then a height uniform among those that fit it; the whole image if
  none fits. `random_resized_crop` is torchvision's sampler: log-uniform ratio, uniform area."""
  height, width = image.shape[:2]
  for _ in range(_INCEPTION_TRIES):
    box = _inception_box(height, width, rng, min_area, rng.uniform(*_ASPECT_RATIO_RANGE))
    if box is not None:
      top, left, box_h, box_w = box
      return image[top : top + box_h, left : left + box_w]
  return image


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


def random_resized_crop(image: np.ndarray, rng: np.random.Generator, min_area: float) -> np.ndarray:
  """The crop of `random_resized_box`: timm's sampler of [min_area, 1] of the image."""
  top, left, box_h, box_w = random_resized_box(image.shape, rng, min_area)
  return image[top : top + box_h, left : left + box_w]


def pad_and_random_crop(image: np.ndarray, rng: np.random.Generator, pad: int) -> np.ndarray:
  """Pads `pad` black pixels on every side, then crops back to the input size at an offset uniform
  in [0, 2 * pad] along each axis."""
  top, left = rng.integers(2 * pad + 1, size=2)
  padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
  return padded[top : top + image.shape[0], left : left + image.shape[1]]


def central_crop(
    image: np.ndarray, size: int, crop_fraction: float, antialias: bool = False
) -> np.ndarray:
  """Bilinear resize keeping the aspect ratio, the shorter side to round(size / crop_fraction), then
  the central size x size square (ImageNet's eval: 256 -> 224 at 0.875), in the input's range and
  of `resize`'s dtype; `antialias` as in `resize`. The geometry is torchvision's Resize(int) +
  CenterCrop (timm's eval transform), so with `antialias` its pixels are too: the longer side's
  proportion rounded down, the offset rounded half to even."""
  height, width = image.shape[:2]
  target = round(size / crop_fraction)
  longer = int(target * max(height, width) / min(height, width))
  scaled_h, scaled_w = (longer, target) if height > width else (target, longer)
  top, left = round((scaled_h - size) / 2), round((scaled_w - size) / 2)
  return _resize_to(image, scaled_h, scaled_w, antialias)[top : top + size, left : left + size]


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
  return resize(inception_crop(image, rng, pp.min_area), image_size, pp.antialias)


def _random_resized(image, rng, pp, image_size):
  return resize(random_resized_crop(image, rng, pp.min_area), image_size, pp.antialias)


def _check_min_area(pp: ml_collections.ConfigDict) -> None:
  if not 0 < pp.min_area <= 1:
    raise ValueError(f'config.pp.min_area={pp.min_area} must be in (0, 1], e.g. 0.05')


def _random(image, rng, pp, image_size):
  return pad_and_random_crop(resize(image, image_size, pp.antialias), rng, pp.pad)


def _check_pad(pp: ml_collections.ConfigDict) -> None:
  if pp.pad < 0:
    raise ValueError(f'config.pp.pad={pp.pad} must be >= 0 pixels')


def _resize(image, rng, pp, image_size):
  del rng  # Deterministic.
  return resize(image, image_size, pp.antialias)


def _flip(image, rng, pp, image_size):
  del pp, image_size  # Keeps the size.
  if rng.random() >= 0.5:
    return image
  height, width, channels = image.shape
  mirrored = _flat_columns(np.arange(width - 1, -1, -1), channels)
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
  if not pp.color_jitter >= 0:
    raise ValueError(f'config.pp.color_jitter={pp.color_jitter} must be >= 0, e.g. 0.3 (0: off)')


def _normalize(image, rng, pp, image_size):
  del rng, pp, image_size  # Deterministic, and reads no field.
  return normalize(image)


_NORMALIZE = Op(_normalize, channelwise=True)


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
    _NORMALIZE,
    Op(_erase, _check_erase, on=lambda pp: pp.erase_prob > 0),  # timm erases normalised images.
)


def check_pp(pp: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the train preprocessing config is invalid."""
  if pp.crop not in CROPS:
    raise ValueError(
        f'Unknown config.pp.crop {pp.crop!r}: use one of {", ".join(map(repr, CROPS))}'
    )
  for op in (CROPS[pp.crop], *AUGMENTS):
    op.check(pp)
  if pp.pad and pp.crop != 'random':  # Only that crop pads: with another the field does nothing.
    raise ValueError(
        f"config.pp.pad={pp.pad} pads the 'random' crop only, not config.pp.crop="
        f'{pp.crop!r}: set --config.pp.crop=random, or --config.pp.pad=0'
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
  return np.ascontiguousarray(rgb(image))


def train_preprocess(
    image: np.ndarray, seed: tuple[int, ...], *, pp: ml_collections.ConfigDict, image_size: int
) -> np.ndarray:
  """Decoded uint8 [h, w, 3] (or greyscale [h, w, 1]) to an augmented C-contiguous RGB
  [image_size, image_size, 3] of `train_dtype(pp)`: uint8 pixels, or float32 normalised to [-1, 1]
  (random erasing adds N(0, 1) noise beyond it). `model_input` of either is the same.

  `seed`: non-negative integers; op i draws from np.random.default_rng([*seed, i]). `pp` must have
  passed `check_pp`."""
  dtype = train_dtype(pp)
  for i, op in enumerate((CROPS[pp.crop], *AUGMENTS)):
    if op is _NORMALIZE and dtype == np.uint8:
      break  # The step normalises; no op after it is on.
    if op.on(pp):
      if not op.channelwise:
        image = rgb(image)
      image = op.apply(image, np.random.default_rng([*seed, i]), pp, image_size)
  return _checked(image, dtype)


def model_input(image: np.ndarray) -> np.ndarray:
  """An image of `train_preprocess` or `eval_preprocess` as the model takes it: float32 in [-1, 1]
  (uint8 pixels normalised, as `on_device.model_input` does in a step; float32 as it is)."""
  return normalize(image) if image.dtype == np.uint8 else image


def _central(image, pp_eval, image_size):
  return central_crop(image, image_size, pp_eval.crop_fraction, pp_eval.antialias)


def _eval_resize(image, pp_eval, image_size):
  return resize(image, image_size, pp_eval.antialias)


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


def eval_dtype(pp_eval: ml_collections.ConfigDict) -> type[np.generic]:
  """The dtype of `eval_preprocess`'s images: uint8 pixels from the antialiased crops, else float32
  in [-1, 1] (TensorFlow's resize interpolates between levels)."""
  return np.uint8 if pp_eval.antialias else np.float32


def eval_preprocess(
    image: np.ndarray, *, pp_eval: ml_collections.ConfigDict, image_size: int
) -> np.ndarray:
  """Decoded uint8 [h, w, 3] (or greyscale [h, w, 1]) to C-contiguous RGB
  [image_size, image_size, 3] of `eval_dtype(pp_eval)`, by the crop of `pp_eval` (which must have
  passed `check_pp_eval`): uint8 pixels, or float32 in [-1, 1]; `model_input` of it is what the
  model sees."""
  image = EVAL_CROPS[pp_eval.crop](image, pp_eval, image_size)
  dtype = eval_dtype(pp_eval)
  return _checked(image if dtype == np.uint8 else normalize(image), dtype)
