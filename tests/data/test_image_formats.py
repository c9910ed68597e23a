"""Image files as users have them, decoded as PIL's `Image.open(f).convert('RGB')` decodes them (what
timm's and torchvision's ImageFolder train on): through `images.decode`, an image folder and
`classifiers.read_image`. Files PIL writes, and variants it reads but does not write (BMPs, 16-bit PNG).
"""

import io
import struct
import warnings
import zlib

import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax import data
from vit_jax.tools import classifiers
from vit_jax.data import images
from vit_jax.data import preprocess

_RNG = np.random.default_rng(0)
_RGB = _RNG.integers(0, 256, (10, 13, 3), dtype=np.uint8)  # Not square, and BMP rows need padding.
_ALPHA = _RNG.integers(0, 256, (10, 13), dtype=np.uint8)
_RGBA = np.dstack([_RGB, _ALPHA])
_GREY16 = _RGB[..., 0].astype(np.uint16) * 257 + 100


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
  out = io.BytesIO()
  image.save(out, format=fmt, **kwargs)
  return out.getvalue()


def _animation(fmt: str, mode: str, **kwargs) -> bytes:
  first, second = Image.fromarray(_RGBA, 'RGBA').convert(mode), Image.fromarray(255 - _RGBA, 'RGBA')
  return _encoded(
      first, fmt, save_all=True, append_images=[second.convert(mode)], duration=100, **kwargs
  )


def _photo() -> np.ndarray:
  """Photo-like pixels (smooth, with noise), where JPEG's DCT rounding shows."""
  y, x = np.mgrid[0:48, 0:64]
  smooth = np.stack([np.sin(x / 7) * 90 + 128, np.cos(y / 9) * 90 + 128, (x * 3 + y) % 256], -1)
  noisy = smooth + np.random.default_rng(0).normal(0, 20, smooth.shape)
  return np.clip(noisy, 0, 255).astype(np.uint8)


def _png16(pixels: np.ndarray) -> bytes:
  """A 16-bit RGB PNG (PIL writes none): raw rows, each after filter byte 0."""
  height, width, _ = pixels.shape
  rows = b''.join(b'\0' + row.astype('>u2').tobytes() for row in pixels)

  def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))

  header = struct.pack('>IIBBBBB', width, height, 16, 2, 0, 0, 0)  # 16 bits, RGB.
  return (
      b'\x89PNG\r\n\x1a\n'
      + chunk(b'IHDR', header)
      + chunk(b'IDAT', zlib.compress(rows))
      + chunk(b'IEND', b'')
  )


def _bmp(bits: int, compression: int, pixels: bytes, extra: bytes = b'', colours: int = 0) -> bytes:
  """A BMP with a 40-byte info header, then `extra` (palette or bit fields), then `pixels`."""
  height, width = _RGB.shape[:2]
  offset = 14 + 40 + len(extra)
  return (
      b'BM'
      + struct.pack('<IHHI', offset + len(pixels), 0, 0, offset)
      + struct.pack(
          '<IiiHHIIiiII',
          40,
          width,
          height,
          1,
          bits,
          compression,
          len(pixels),
          2835,
          2835,
          colours,
          0,
      )
      + extra
      + pixels
  )


def _palette_bmp() -> bytes:
  """8-bit, 5 colours, width 13 (rows padded to 16 bytes), rows bottom-up: PIL writes 256 colours."""
  rng = np.random.default_rng(1)
  palette = rng.integers(0, 256, (5, 3), dtype=np.uint8)
  indices = rng.integers(0, 5, _RGB.shape[:2], dtype=np.uint8)
  table = b''.join(bytes([b, g, r, 0]) for r, g, b in palette)
  return _bmp(8, 0, b''.join(bytes(row) + b'\0' * 3 for row in indices[::-1]), table, colours=5)


def _4bit_bmp() -> bytes:
  """4-bit, 16 colours: two indices a byte, 13 pixels in 7 bytes padded to 8."""
  indices = np.random.default_rng(2).integers(0, 16, (10, 14), dtype=np.uint8)
  rows = [bytes(row[0::2] << 4 | row[1::2]) + b'\0' for row in indices[::-1]]
  table = b''.join(bytes([v, 255 - v, v // 2, 0]) for v in range(0, 256, 16))
  return _bmp(4, 0, b''.join(rows), table, colours=16)


def _16bit_bmp() -> bytes:
  """16-bit, 5 bits a channel (x1r5g5b5), 26 bytes a row padded to 28."""
  five = (_RGB >> 3).astype(np.uint16)
  values = five[..., 0] << 10 | five[..., 1] << 5 | five[..., 2]
  return _bmp(16, 0, b''.join(row.astype('<u2').tobytes() + b'\0\0' for row in values[::-1]))


def _os2_bmp() -> bytes:
  """24-bit with OS/2's 12-byte core header, where the fields are 16-bit."""
  height, width = _RGB.shape[:2]
  pixels = b''.join(row[:, ::-1].tobytes() + b'\0' for row in _RGB[::-1])  # BGR, 39 bytes + 1.
  return (
      b'BM'
      + struct.pack('<IHHI', 26 + len(pixels), 0, 0, 26)
      + struct.pack('<IHHHH', 12, width, height, 1, 24)
      + pixels
  )


def _bgrx_bmp(masks: tuple[int, int, int]) -> bytes:
  """32-bit with bit fields `masks` (red, green, blue), pixels stored as blue, green, red, 255."""
  pixels = b''.join(bytes([b, g, r, 255]) for row in _RGB[::-1] for r, g, b in row)
  return _bmp(32, 3, pixels, struct.pack('<III', *masks))


def _rle8_bmp() -> bytes:
  """Run-length compressed: one-pixel runs, a row end after each row, then the bitmap's end."""
  runs = b''.join(b''.join(bytes([1, i % 4]) for i in range(13)) + b'\0\0' for _ in range(10))
  return _bmp(8, 1, runs + b'\0\1', b''.join(bytes([v, v, v, 0]) for v in (0, 80, 160, 240)), 4)


def _palette(transparency=None) -> Image.Image:
  image = Image.fromarray(_RGB).quantize(32)
  if transparency is not None:
    image.info['transparency'] = transparency
  return image


# Each of these decodes to exactly PIL's pixels, including what PIL does that is arguable: a 16-bit
# greyscale image clipped to 255 (almost all white), a GIF's transparent pixels in their palette's
# colour.
AS_PIL = {
    'rgb.png': lambda: _encoded(Image.fromarray(_RGB), 'PNG'),
    'rgba.png': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'PNG'),
    'la.png': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA').convert('LA'), 'PNG'),
    'grey.png': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'PNG'),
    'palette.png': lambda: _encoded(_palette(), 'PNG'),
    'palette_transparent_index.png': lambda: _encoded(_palette(3), 'PNG', transparency=3),
    'palette_alpha.png': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA').quantize(32), 'PNG'),
    '1bit.png': lambda: _encoded(Image.fromarray(_RGB[..., 0] > 128), 'PNG'),
    '16bit_rgb.png': lambda: _png16(_RGB.astype(np.uint16) * 257 + _RGB[::-1]),  # Low bytes: noise.
    '16bit_grey.png': lambda: _encoded(Image.fromarray(_GREY16), 'PNG'),
    'grey.jpg': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'JPEG', quality=90),
    'cmyk.jpg': lambda: _encoded(Image.fromarray(_RGB).convert('CMYK'), 'JPEG', quality=90),
    'progressive.jpg': lambda: _encoded(
        Image.fromarray(_RGB), 'JPEG', quality=90, progressive=True
    ),
    'photo.jpg': lambda: _encoded(Image.fromarray(_photo()), 'JPEG', quality=90),
    'photo_444.jpg': lambda: _encoded(Image.fromarray(_photo()), 'JPEG', quality=75, subsampling=0),
    'rgb.bmp': lambda: _encoded(Image.fromarray(_RGB), 'BMP'),
    'rgba.bmp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'BMP'),
    'grey.bmp': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'BMP'),
    'palette.bmp': lambda: _encoded(_palette(), 'BMP'),
    'palette_5_colours.bmp': _palette_bmp,
    '1bit.bmp': lambda: _encoded(Image.fromarray(_RGB[..., 0] > 128), 'BMP'),
    '4bit.bmp': _4bit_bmp,
    '16bit.bmp': _16bit_bmp,
    'os2.bmp': _os2_bmp,
    'rle8.bmp': _rle8_bmp,
    'bgr_bit_fields.bmp': lambda: _bgrx_bmp((0x00FF0000, 0x0000FF00, 0x000000FF)),
    'animated.gif': lambda: _animation('GIF', 'RGB'),
    'grey.gif': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'GIF'),
    'transparent.gif': lambda: _encoded(_palette(3), 'GIF', transparency=3),
    'lossless.webp': lambda: _encoded(Image.fromarray(_RGB), 'WEBP', lossless=True),
    'lossy.webp': lambda: _encoded(Image.fromarray(_RGB), 'WEBP', quality=80),
    'rgba_lossless.webp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'WEBP', lossless=True),
    'rgba_lossy.webp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'WEBP', quality=80),
    'animated_rgba.webp': lambda: _animation('WEBP', 'RGBA', lossless=True),
    'animated.webp': lambda: _animation('WEBP', 'RGB', lossless=True),
    'rgb.tif': lambda: _encoded(Image.fromarray(_RGB), 'TIFF'),
    'lzw.tif': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'TIFF', compression='tiff_lzw'),
    'cmyk.tif': lambda: _encoded(Image.fromarray(_RGB).convert('CMYK'), 'TIFF'),
    '16bit_grey.tif': lambda: _encoded(Image.fromarray(_GREY16), 'TIFF'),
    'float.tif': lambda: _encoded(Image.fromarray(_RGB[..., 0] / np.float32(3)), 'TIFF'),
    'rgb.ppm': lambda: _encoded(Image.fromarray(_RGB), 'PPM'),
    'grey.pgm': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'PPM'),
    '16bit.pgm': lambda: _encoded(Image.fromarray(_GREY16), 'PPM'),
    '1bit.pbm': lambda: _encoded(Image.fromarray(_RGB[..., 0] > 128), 'PPM'),
    'lossless.jp2': lambda: _encoded(Image.fromarray(_RGB), 'JPEG2000', irreversible=False),
    'lossy.jp2': lambda: _encoded(Image.fromarray(_photo()), 'JPEG2000', quality_layers=[20]),
    '1x1.png': lambda: _encoded(Image.fromarray(_RGB[:1, :1]), 'PNG'),
    '1x300.jpg': lambda: _encoded(Image.fromarray(np.tile(_RGB[:1], (1, 23, 1))[:, :300]), 'JPEG'),
    '300x1.webp': lambda: _encoded(Image.fromarray(np.tile(_RGB[:, :1], (30, 1, 1))), 'WEBP'),
}


def _pil(encoded: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(encoded)).convert('RGB'))


@pytest.mark.parametrize('name', AS_PIL)
def test_each_variant_decodes_to_pils_pixels(name):
  encoded = AS_PIL[name]()
  decoded = images.decode(encoded)
  image = Image.open(io.BytesIO(encoded))
  # 8-bit greyscale stays one channel (its RGB is that channel thrice); every other mode is RGB.
  channels = 1 if image.mode == 'L' else 3
  assert decoded.dtype == np.uint8 and decoded.shape == (image.height, image.width, channels)
  np.testing.assert_array_equal(images.rgb(decoded), _pil(encoded))


def test_a_palette_with_alpha_bytes_decodes_without_pils_warning():
  # PIL's convert('RGB') of it warns (a UserWarning in each worker process's log), to these pixels.
  encoded = AS_PIL['palette_alpha.png']()
  assert isinstance(Image.open(io.BytesIO(encoded)).info['transparency'], bytes)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    images.decode(encoded)


def test_the_variants_pil_reads_arguably_are_read_as_pil_reads_them():
  """What the pixels of the variants above are in PIL, so what training sees."""
  # Clipped, not scaled.
  assert (images.decode(AS_PIL['16bit_grey.png']()) == 255).mean() > 0.95
  encoded = AS_PIL['transparent.gif']()
  transparent = np.asarray(Image.open(io.BytesIO(encoded))) == 3
  palette = np.array(Image.open(io.BytesIO(encoded)).getpalette(), np.uint8).reshape(-1, 3)
  assert transparent.any()
  assert (images.decode(encoded)[transparent] == palette[3]).all()


# An extension's format, where the extension alone does not say it: PNM's by the pixels' mode.
_MODES = {'.pbm': '1', '.pgm': 'L'}


@pytest.mark.parametrize('extension', images.IMAGE_EXTENSIONS)
def test_each_listed_extension_is_a_format_pil_reads_here(tmp_path, extension):
  """An image folder lists these names: each is a format this PIL writes and reads (its codec is
  installed), and decodes as PIL decodes the file."""
  path = tmp_path / f'image{extension.upper()}'
  Image.fromarray(_photo()).convert(_MODES.get(extension, 'RGB')).save(
      path, format=Image.registered_extensions()[extension]
  )
  encoded = path.read_bytes()
  with Image.open(path) as image:
    want = np.asarray(image.convert('RGB'))
  np.testing.assert_array_equal(images.rgb(images.decode(encoded)), want)


_LFS_POINTER = (
    b'version https://git-lfs.github.com/spec/v1\n'
    b'oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n'
    b'size 12345\n'
)
# Each fails with its one-line reason.
UNREADABLE = {
    'rgb_bit_fields.bmp': (
        lambda: _bgrx_bmp((0x000000FF, 0x0000FF00, 0x00FF0000)),
        r'^OSError: Unsupported BMP bitfields layout$',
    ),
    'truncated.jpg': (lambda: AS_PIL['progressive.jpg']()[:200], r'^OSError: .*[Tt]runcated'),
    'truncated_in_its_scan.jpg': (
        lambda: _encoded(Image.fromarray(np.tile(_photo(), (8, 8, 1))), 'JPEG')[:20000],
        r'^OSError: .*[Tt]runcated',
    ),
    'truncated.png': (lambda: AS_PIL['rgb.png']()[:200], r'^OSError: .*truncated'),
    'empty.png': (lambda: b'', r'^not an image format PIL reads$'),
    'not_an_image.png': (lambda: b'not an image', r'^not an image format PIL reads$'),
    'lfs_pointer.jpg': (lambda: _LFS_POINTER, r'^a git-lfs pointer, not the image$'),
}


@pytest.mark.parametrize('name', UNREADABLE)
def test_what_is_not_read_fails_with_a_one_line_reason(name):
  encoded, reason = UNREADABLE[name]
  with pytest.raises(images.UnreadableImage, match=reason) as raised:
    images.decode(encoded())
  assert isinstance(raised.value, ValueError) and '\n' not in str(raised.value)
  with pytest.raises(images.UnreadableImage, match=reason):
    images.check(encoded())  # The image folders' probe: a JPEG at 1/8 of its size.


@pytest.mark.parametrize('name', AS_PIL)
def test_what_decodes_passes_the_check(name):
  images.check(AS_PIL[name]())


def test_a_folder_reads_pils_pixels_whatever_the_extension_and_skips_what_it_cannot_read(
    tmp_path, caplog
):
  # A PNG named .jpg, a JPEG named .PNG, upper-case extensions; a class of only the hard cases.
  files = {
      'a/0.jpg': AS_PIL['rgba.png'](),
      'a/1.PNG': AS_PIL['cmyk.jpg'](),
      'b/0.WEBP': AS_PIL['rgba_lossy.webp'](),
      'b/1.bmp': AS_PIL['palette_5_colours.bmp'](),
      'b/2.webp': UNREADABLE['rgb_bit_fields.bmp'][0](),
      'b/3.jpg': b'',
      'b/4.tif': AS_PIL['16bit_grey.tif'](),
  }
  for split in ('train', 'test'):
    for name, encoded in files.items():
      (tmp_path / split / name).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / split / name).write_bytes(encoded)
  config = helpers.data_config(str(tmp_path), dataset='folder', image_size=16)
  with caplog.at_level('WARNING'):
    batch = next(data.eval_iterator(config, 'test', local_batch_size=8))
  read = ['a/0.jpg', 'a/1.PNG', 'b/0.WEBP', 'b/1.bmp', 'b/4.tif']
  want = [
      preprocess.eval_preprocess(_pil(files[name]), pp_eval=config.pp_eval, image_size=16)
      for name in read
  ]
  np.testing.assert_allclose(batch['image'][batch['mask']], want, atol=1e-6)
  assert batch['label'][batch['mask']].tolist() == [0, 0, 1, 1, 1]
  skipped = [r.getMessage() for r in caplog.records if 'Skipping unreadable' in r.getMessage()]
  assert sorted(skipped) == [  # Each with decode's one-line reason.
      f'Skipping unreadable image file {tmp_path}/test/b/2.webp (OSError: Unsupported BMP bitfields '
      'layout)',
      f'Skipping unreadable image file {tmp_path}/test/b/3.jpg (not an image format PIL ' 'reads)',
  ]


def test_prediction_reads_pils_pixels(tmp_path):
  for name in (
      'rgba_lossy.webp',
      'palette_5_colours.bmp',
      'animated_rgba.webp',
      'rle8.bmp',
      '16bit_grey.tif',
  ):
    (tmp_path / name).write_bytes(AS_PIL[name]())
    np.testing.assert_array_equal(
        classifiers.read_image(str(tmp_path / name)), _pil(AS_PIL[name]())
    )


def test_a_file_name_that_is_not_utf8_is_a_one_line_error_naming_its_folder(tmp_path):
  for split in ('train', 'test'):
    (tmp_path / split / 'cat').mkdir(parents=True)
    (tmp_path / split / 'cat' / '0.png').write_bytes(AS_PIL['rgb.png']())
  # 'café.png' in Latin-1, as a zip made on Windows unpacks.
  with open(bytes(tmp_path / 'train' / 'cat') + b'/caf\xe9.png', 'wb') as f:
    f.write(AS_PIL['rgb.png']())
  config = helpers.data_config(str(tmp_path), dataset='folder')
  with pytest.raises(
      ValueError,
      match=(
          rf'^Image folder {tmp_path}/train/cat holds a name that is not '
          r"UTF-8: b'caf\\xe9.png'; rename it"
      ),
  ):
    data.get_info(config)


# EXIF's orientations (1-8: how the stored pixels turn upright), as numpy writes them.
_UPRIGHT = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: a[::-1, ::-1].transpose(1, 0, 2),
    8: lambda a: np.rot90(a, 1),
}


@pytest.mark.parametrize('fmt', ['JPEG', 'PNG', 'WEBP', 'greyscale JPEG'])
def test_exif_orientation_is_applied_only_where_asked(fmt):
  """Image folders and tfds read the stored pixels (as timm's ImageFolder, PIL's Image.open); a
  Hugging Face dataset's images are turned upright, as `datasets` turns them."""
  pixels = _photo()[:30, :50]
  if fmt.startswith('greyscale'):
    pixels = pixels[..., 0]
  for orientation, upright in _UPRIGHT.items():
    encoded = helpers.encoded(pixels, fmt.split()[-1], orientation=orientation)
    stored = images.decode(encoded)
    np.testing.assert_array_equal(images.rgb(stored), _pil(encoded))
    turned = images.decode(encoded, exif_orientation=True)
    assert turned.shape == upright(stored).shape, orientation
    np.testing.assert_array_equal(turned, upright(stored), err_msg=f'orientation {orientation}')
  untagged = helpers.encoded(pixels, fmt.split()[-1])
  np.testing.assert_array_equal(
      images.decode(untagged, exif_orientation=True), images.decode(untagged)
  )
