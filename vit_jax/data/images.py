"""Reading pixels, on numpy arrays: decoding with PIL (`decode`; an image file's bytes, `Encoded`,
decoded by its crop, `crop_and_resize`, at a fraction of its size where the crop allows, then
resized: resizing.py), `rgb` and `normalize`.

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

from vit_jax.data import resizing

# The extensions of the files an image folder lists: formats PIL reads (each checked in
# tests/data/test_image_formats.py against a file PIL wrote). `decode` reads by content, not by name.
IMAGE_EXTENSIONS = (
    '.jpg',
    '.jpeg',
    '.jfif',  # JPEGs as browsers and Windows save some.
    '.jpe',
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
    '.avif',
)
# What a file checked out without `git lfs pull` holds instead of the image.
LFS_POINTER = b'version https://git-lfs'


# EXIF orientations that turn an image a quarter: its upright height is its stored width.
_QUARTER_TURNS = (5, 6, 7, 8)
# libjpeg's DCT scalings that PIL's JPEG `draft` decodes at: 1/8, 1/4, 1/2 of each side; of JPEGs and
# of MPO files (a JPEG that holds more images after it: cameras' depth maps, stereo pairs).
_JPEG_FORMATS = ('JPEG', 'MPO')
_JPEG_SCALES = (8, 4, 2)

# (top, left, height, width) of a crop, in pixels of the upright image.
Box = tuple[int, int, int, int]
# (height, width) of an upright image -> (the box to crop, (height, width) to resize it to).
Geometry = Callable[[int, int], tuple[Box, tuple[int, int]]]


def whole(image_size: int) -> Geometry:
  """The whole image, resized to the square of `image_size`."""
  return lambda height, width: ((0, 0, height, width), (image_size, image_size))


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
  if image.mode == 'P' and isinstance(image.info.get('transparency'), bytes):
    # A palette's alpha bytes, which convert('RGB') drops with a UserWarning (once in each worker
    # process's log): dropped through RGBA instead, to the same pixels.
    image = image.convert('RGBA')
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
  gives (`resizing.resize_to`'s filter and dtype).

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
  return resizing.resize_to(image[top : top + height, left : left + width], *size, antialias)


def _reduced(
    encoded: Encoded, geometry: Geometry, reducing_gap: float
) -> tuple[np.ndarray, Box, tuple[int, int]]:
  """`encoded` decoded at the smallest of libjpeg's scales that `reducing_gap` leaves its box
  (at its full size unless it is a JPEG), and the box in those pixels."""
  with _read_by_pil():
    image = _opened(encoded.data)
  if image.format not in _JPEG_FORMATS:
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
