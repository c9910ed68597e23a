"""Reading and resizing pixels, on numpy arrays: decoding with PIL (`decode`; an image file's bytes,
`Encoded`, decoded by its crop, `crop_and_resize`, at a fraction of its size where the crop allows),
bilinear resizing (`resize`: PIL's antialiased filter or TensorFlow's), `rgb` and `normalize`.

A decoded image is uint8 [h, w, 3], or [h, w, 1] for a greyscale one (whose RGB image, `rgb`, is that
channel three times, as PIL's convert('RGB') makes it).

The pixel work is PIL's (decoding, antialiased resizing), which releases the GIL while it runs, or
whole-array numpy: no per-pixel Python.
"""

import contextlib
import dataclasses
import io
from typing import Callable, Iterator

import numpy as np
from PIL import ExifTags
from PIL import Image
from PIL import ImageOps

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
# What a file checked out without `git lfs pull` holds instead of the image.
LFS_POINTER = b'version https://git-lfs'


# EXIF orientations that turn an image a quarter: its upright height is its stored width.
_QUARTER_TURNS = (5, 6, 7, 8)
# libjpeg's DCT scalings that PIL's JPEG `draft` decodes at: 1/8, 1/4, 1/2 of each side.
_JPEG_SCALES = (8, 4, 2)

# (top, left, height, width) of a crop, in pixels of the upright image.
Box = tuple[int, int, int, int]
# (height, width) of an upright image -> (the box to crop, (height, width) to resize it to).
Geometry = Callable[[int, int], tuple[Box, tuple[int, int]]]


class UnreadableImage(ValueError):
  """Bytes that `decode` cannot read as an image; the message is a one-line reason."""


@dataclasses.dataclass(frozen=True)
class Encoded:
  """An image file's bytes as a source read them, decoded by its crop (`crop_and_resize`), which
  knows the size it needs: a JPEG much larger than that can be decoded at a fraction of its size.
  `exif_orientation` as `decode`'s."""

  data: bytes
  exif_orientation: bool = False


@contextlib.contextmanager
def _read_by_pil() -> Iterator[None]:
  """PIL's errors while it reads an image, as one-line `UnreadableImage`s."""
  try:
    yield
  except UnreadableImage:
    raise
  except Image.UnidentifiedImageError:
    raise UnreadableImage('not an image format PIL reads') from None
  # PIL's decoders raise many types for corrupt data (OSError, SyntaxError, ValueError, EOFError,
  # struct.error, DecompressionBombError, ...): each makes the file unreadable, not the run fail.
  except Exception as e:  # pylint: disable=broad-exception-caught
    reason = str(e).strip().splitlines()
    raise UnreadableImage(f'{type(e).__name__}: {reason[0]}' if reason else type(e).__name__) from e


def decode(data: bytes, exif_orientation: bool = False) -> np.ndarray:
  """Encoded image bytes, any format PIL reads, whatever a file name says, to uint8 [h, w, 3], or
  [h, w, 1] for an 8-bit greyscale image (PIL's mode 'L'): `rgb` of it is exactly PIL's
  Image.open(BytesIO(data)).convert('RGB'), what timm's and torchvision's ImageFolder train on,
  because it is that. So every variant PIL reads is read as PIL reads it: JPEG (with
  libjpeg's accurate integer DCT, at full resolution: no draft mode, which changes pixels), PNG of
  any bit depth (16-bit greyscale clipped to 255 as PIL's conversion clips it), GIF (the first
  frame; transparent pixels take their palette colour), every BMP PIL reads (1-, 4-, 8-, 16-, 24-
  and 32-bit, run-length compressed, OS/2), WebP (animations too: the first frame), TIFF, PNM and
  JPEG 2000. Greyscale becomes RGB, alpha is dropped (not blended). EXIF orientation is not applied
  (as PIL's Image.open, timm's ImageFolder and tfds read images), unless `exif_orientation`: an image
  with an Orientation tag is then turned upright by PIL's ImageOps.exif_transpose, as `datasets`
  decodes a Hugging Face dataset's images. The array is read-only.

  Raises UnreadableImage with a one-line reason for bytes PIL cannot read (truncated or corrupt
  files, other formats, a git-lfs pointer file in place of the image)."""
  with _read_by_pil(), _opened(data) as image:
    if exif_orientation:
      image = _upright(image)
    return _array(image)


def check(data: bytes) -> None:
  """Raises `UnreadableImage` where `decode` would, at a fraction of its cost for a JPEG: decoded
  at 1/8 of its size, its whole bitstream is read all the same (where its errors lie); libjpeg
  leaves out the inverse DCTs at full size and their colour conversion, which cannot fail."""
  with _read_by_pil(), _opened(data) as image:
    image.draft(None, (max(image.width // 8, 1), max(image.height // 8, 1)))  # Other formats: none.
    _array(image)


def _opened(data: bytes) -> Image.Image:
  if data.startswith(LFS_POINTER):
    raise UnreadableImage('a git-lfs pointer, not the image')
  return Image.open(io.BytesIO(data))


def _array(image: Image.Image) -> np.ndarray:
  """The decoded pixels of a PIL image: [h, w, 1] for 'L', else of its RGB conversion."""
  if image.mode == 'L':  # Its RGB is this channel thrice: the ops before `rgb` do a third.
    return np.asarray(image)[..., None]
  # convert('RGB') of an RGB image is a copy: skipping it saves one copy of the pixels.
  return np.asarray(image if image.mode == 'RGB' else image.convert('RGB'))


def _upright(image: Image.Image) -> Image.Image:
  """`image` turned as its EXIF Orientation says, by datasets' rule (the tag read once loaded)."""
  image.load()
  if image.getexif().get(ExifTags.Base.Orientation) is None:
    return image
  return ImageOps.exif_transpose(image)


def pixels(image: np.ndarray | Encoded) -> np.ndarray:
  """A decoded image as it is; an `Encoded` one `decode`d at its full size."""
  return decode(image.data, image.exif_orientation) if isinstance(image, Encoded) else image


def crop_and_resize(
    image: np.ndarray | Encoded, geometry: Geometry, antialias: bool, reducing_gap: float = 0.0
) -> np.ndarray:
  """The box that `geometry(height, width)` gives for the upright image, resized to the size it
  gives (`resize_to`'s filter and dtype).

  `reducing_gap` (0, or >= 1): an `Encoded` JPEG is decoded at 1/2, 1/4 or 1/8 of its size
  (libjpeg's DCT scaling, PIL's `draft`), the smallest that leaves the box `reducing_gap` times
  the output's size or more, as PIL's Image.thumbnail(reducing_gap=...) decodes (PIL: "with
  reducing_gap >= 3 indistinguishable from fair resampling in most cases"); the box is then
  rounded to the reduced pixels. A 4032 x 3024 photo decodes ~5x faster at 1/4. 0: every image
  at its full size, so the pixels are `decode`'s (timm's, to the bit)."""
  if reducing_gap and isinstance(image, Encoded):
    image, (top, left, height, width), size = _reduced(image, geometry, reducing_gap)
  else:
    image = pixels(image)
    (top, left, height, width), size = geometry(*image.shape[:2])
  return resize_to(image[top : top + height, left : left + width], *size, antialias)


def _reduced(
    encoded: Encoded, geometry: Geometry, reducing_gap: float
) -> tuple[np.ndarray, Box, tuple[int, int]]:
  """`encoded` decoded at the smallest of libjpeg's scales that `reducing_gap` leaves its box
  (at its full size unless it is a JPEG), and the box in those pixels."""
  with _read_by_pil():
    image = _opened(encoded.data)
  if image.format != 'JPEG':
    decoded = decode(encoded.data, encoded.exif_orientation)
    return decoded, *geometry(*decoded.shape[:2])
  with _read_by_pil():
    # A JPEG's EXIF is read as it opens: its orientation is known before its pixels are.
    orientation = (
        image.getexif().get(ExifTags.Base.Orientation) if encoded.exif_orientation else None
    )
  width, height = image.size
  if orientation in _QUARTER_TURNS:
    width, height = height, width
  (top, left, box_h, box_w), size = geometry(height, width)
  scale = next(
      (s for s in _JPEG_SCALES if min(box_h / size[0], box_w / size[1]) >= reducing_gap * s), 1
  )
  with _read_by_pil():
    if scale > 1:
      image.draft(None, (image.width // scale, image.height // scale))
    reduced = _array(image if orientation is None else ImageOps.exif_transpose(image))
  if reduced.shape[:2] == (height, width):
    return reduced, (top, left, box_h, box_w), size
  rows = _scaled_span(top, box_h, scale, reduced.shape[0])
  columns = _scaled_span(left, box_w, scale, reduced.shape[1])
  return reduced, (rows[0], columns[0], rows[1], columns[1]), size


def _scaled_span(start: int, length: int, scale: int, limit: int) -> tuple[int, int]:
  """(start, length) of a span of full-size pixels in pixels `scale` times larger, rounded."""
  first = min(round(start / scale), limit - 1)
  return first, max(min(round((start + length) / scale), limit) - first, 1)


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


def flat_columns(columns: np.ndarray, channels: int) -> np.ndarray:
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
  left, right = flat_columns(left, channels), flat_columns(right, channels)
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


def resize_to(image: np.ndarray, height: int, width: int, antialias: bool) -> np.ndarray:
  """Bilinear resize of [h, w, c] to [height, width, c]: `resize`'s filter and dtype."""
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
  return resize_to(image, size, size, antialias)


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
