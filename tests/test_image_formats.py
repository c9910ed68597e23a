"""Image files as users have them, decoded as PIL's `Image.open(f).convert('RGB')` decodes them (what
timm's and torchvision's ImageFolder train on): through `preprocess.decode`, an image folder and
`predict.read_image`. Files PIL writes, and a few BMP variants it reads but does not write.
"""
import io
import struct
import zlib

import numpy as np
from PIL import Image
import pytest
import tensorflow as tf

import helpers
from vit_jax import data, predict
from vit_jax.data import preprocess

_RNG = np.random.default_rng(0)
_RGB = _RNG.integers(0, 256, (10, 13, 3), dtype=np.uint8)  # Not square, and BMP rows need padding.
_ALPHA = _RNG.integers(0, 256, (10, 13), dtype=np.uint8)
_RGBA = np.dstack([_RGB, _ALPHA])


def _encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
  out = io.BytesIO()
  image.save(out, format=fmt, **kwargs)
  return out.getvalue()


def _animation(fmt: str, mode: str, **kwargs) -> bytes:
  first, second = Image.fromarray(_RGBA, 'RGBA').convert(mode), Image.fromarray(255 - _RGBA, 'RGBA')
  return _encoded(first, fmt, save_all=True, append_images=[second.convert(mode)], duration=100,
                  **kwargs)


def _png16(pixels: np.ndarray) -> bytes:
  """A 16-bit RGB PNG (PIL writes none): raw rows, each after filter byte 0."""
  height, width, _ = pixels.shape
  rows = b''.join(b'\0' + row.astype('>u2').tobytes() for row in pixels)

  def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))
  header = struct.pack('>IIBBBBB', width, height, 16, 2, 0, 0, 0)  # 16 bits, RGB.
  return (b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', header) + chunk(b'IDAT', zlib.compress(rows)) +
          chunk(b'IEND', b''))


def _bmp(bits: int, compression: int, pixels: bytes, extra: bytes = b'', colours: int = 0) -> bytes:
  """A BMP with a 40-byte info header, then `extra` (palette or bit fields), then `pixels`."""
  height, width = _RGB.shape[:2]
  offset = 14 + 40 + len(extra)
  return (b'BM' + struct.pack('<IHHI', offset + len(pixels), 0, 0, offset) +
          struct.pack('<IiiHHIIiiII', 40, width, height, 1, bits, compression, len(pixels), 2835, 2835,
                      colours, 0) + extra + pixels)


def _palette_bmp() -> bytes:
  """8-bit, 5 colours, width 13 (rows padded to 16 bytes), rows bottom-up: PIL writes 256 colours."""
  rng = np.random.default_rng(1)
  palette = rng.integers(0, 256, (5, 3), dtype=np.uint8)
  indices = rng.integers(0, 5, _RGB.shape[:2], dtype=np.uint8)
  table = b''.join(bytes([b, g, r, 0]) for r, g, b in palette)
  return _bmp(8, 0, b''.join(bytes(row) + b'\0' * 3 for row in indices[::-1]), table, colours=5)


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


# Each of these decodes to exactly PIL's pixels.
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
    'grey.jpg': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'JPEG', quality=90),
    'cmyk.jpg': lambda: _encoded(Image.fromarray(_RGB).convert('CMYK'), 'JPEG', quality=90),
    'progressive.jpg': lambda: _encoded(Image.fromarray(_RGB), 'JPEG', quality=90, progressive=True),
    'rgb.bmp': lambda: _encoded(Image.fromarray(_RGB), 'BMP'),
    'rgba.bmp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'BMP'),
    'grey.bmp': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'BMP'),
    'palette.bmp': lambda: _encoded(_palette(), 'BMP'),
    'palette_5_colours.bmp': _palette_bmp,
    'bgr_bit_fields.bmp': lambda: _bgrx_bmp((0x00FF0000, 0x0000FF00, 0x000000FF)),
    'animated.gif': lambda: _animation('GIF', 'RGB'),
    'grey.gif': lambda: _encoded(Image.fromarray(_RGB[..., 0]), 'GIF'),
    'lossless.webp': lambda: _encoded(Image.fromarray(_RGB), 'WEBP', lossless=True),
    'lossy.webp': lambda: _encoded(Image.fromarray(_RGB), 'WEBP', quality=80),
    'rgba_lossless.webp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'WEBP', lossless=True),
    'rgba_lossy.webp': lambda: _encoded(Image.fromarray(_RGBA, 'RGBA'), 'WEBP', quality=80),
    'animated_rgba.webp': lambda: _animation('WEBP', 'RGBA', lossless=True),
    '1x1.png': lambda: _encoded(Image.fromarray(_RGB[:1, :1]), 'PNG'),
    '1x300.jpg': lambda: _encoded(Image.fromarray(np.tile(_RGB[:1], (1, 23, 1))[:, :300]), 'JPEG'),
    '300x1.webp': lambda: _encoded(Image.fromarray(np.tile(_RGB[:, :1], (30, 1, 1))), 'WEBP'),
}


def _pil(encoded: bytes) -> np.ndarray:
  return np.asarray(Image.open(io.BytesIO(encoded)).convert('RGB'))


@pytest.mark.parametrize('name', AS_PIL)
def test_each_variant_decodes_to_pils_pixels(name):
  encoded = AS_PIL[name]()
  np.testing.assert_array_equal(preprocess.decode(tf.constant(encoded)).numpy(), _pil(encoded))


def test_where_pil_is_wrong_or_arbitrary():
  # A 16-bit greyscale PNG: PIL clips the 16-bit value to 255 (almost all white); the high byte here,
  # as PIL itself reads 16-bit RGB.
  grey16 = _RGB[..., 0].astype(np.uint16) * 257 + 100
  encoded = _encoded(Image.fromarray(grey16), 'PNG')
  np.testing.assert_array_equal(preprocess.decode(encoded).numpy(), np.stack([grey16 >> 8] * 3, -1))
  assert (_pil(encoded) == 255).mean() > 0.95
  # A GIF's transparent pixels: the palette's colour in PIL, black here; the others as PIL's.
  encoded = _encoded(_palette(3), 'GIF', transparency=3)
  transparent = np.asarray(Image.open(io.BytesIO(encoded))) == 3
  ours = preprocess.decode(encoded).numpy()
  assert transparent.any() and (ours[transparent] == 0).all()
  np.testing.assert_array_equal(ours[~transparent], _pil(encoded)[~transparent])


UNREADABLE = {
    'animated.webp': lambda: _animation('WEBP', 'RGB', lossless=True),  # channels=0 would crash.
    '1bit.bmp': lambda: _encoded(Image.fromarray(_RGB[..., 0] > 128), 'BMP'),
    'rle8.bmp': _rle8_bmp,
    'rgb_bit_fields.bmp': lambda: _bgrx_bmp((0x000000FF, 0x0000FF00, 0x00FF0000)),  # PIL refuses it.
    'truncated.jpg': lambda: AS_PIL['progressive.jpg']()[:200],
    'truncated.png': lambda: AS_PIL['rgb.png']()[:200],
    'empty.png': lambda: b'',
    'not_an_image.png': lambda: b'not an image',
}


@pytest.mark.parametrize('name', UNREADABLE)
def test_what_is_not_read_fails_instead_of_decoding_wrong_pixels(name):
  with pytest.raises(tf.errors.InvalidArgumentError):
    preprocess.decode(UNREADABLE[name]())


def test_a_folder_reads_pils_pixels_whatever_the_extension_and_skips_what_it_cannot_read(
    tmp_path, caplog):
  # A PNG named .jpg, a JPEG named .PNG, upper-case extensions; a class of only the hard cases.
  files = {'a/0.jpg': AS_PIL['rgba.png'](), 'a/1.PNG': AS_PIL['cmyk.jpg'](),
           'b/0.WEBP': AS_PIL['rgba_lossy.webp'](), 'b/1.bmp': AS_PIL['palette_5_colours.bmp'](),
           'b/2.webp': UNREADABLE['animated.webp'](), 'b/3.jpg': b''}
  for split in ('train', 'test'):
    for name, encoded in files.items():
      (tmp_path / split / name).parent.mkdir(parents=True, exist_ok=True)
      (tmp_path / split / name).write_bytes(encoded)
  config = helpers.data_config(str(tmp_path), dataset='folder', image_size=16)
  with caplog.at_level('WARNING'):
    batch = next(data.eval_iterator(config, 'test', local_batch_size=8))
  read = ['a/0.jpg', 'a/1.PNG', 'b/0.WEBP', 'b/1.bmp']
  want = [preprocess.eval_preprocess(_pil(files[name]), pp_eval=config.pp_eval, image_size=16)
          for name in read]
  np.testing.assert_allclose(batch['image'][batch['mask']], want, atol=1e-6)
  assert batch['label'][batch['mask']].tolist() == [0, 0, 1, 1]
  skipped = [r.getMessage() for r in caplog.records if 'Skipping unreadable' in r.getMessage()]
  assert sorted(skipped) == [f'Skipping unreadable image file {tmp_path}/test/b/{name}'
                             for name in ('2.webp', '3.jpg')]


def test_prediction_reads_pils_pixels(tmp_path):
  for name in ('rgba_lossy.webp', 'palette_5_colours.bmp', 'animated_rgba.webp'):
    (tmp_path / name).write_bytes(AS_PIL[name]())
    np.testing.assert_array_equal(predict.read_image(str(tmp_path / name)), _pil(AS_PIL[name]()))


def test_a_file_name_that_is_not_utf8_is_a_one_line_error_naming_its_folder(tmp_path):
  for split in ('train', 'test'):
    (tmp_path / split / 'cat').mkdir(parents=True)
    (tmp_path / split / 'cat' / '0.png').write_bytes(AS_PIL['rgb.png']())
  # 'café.png' in Latin-1, as a zip made on Windows unpacks.
  with open(bytes(tmp_path / 'train' / 'cat') + b'/caf\xe9.png', 'wb') as f:
    f.write(AS_PIL['rgb.png']())
  config = helpers.data_config(str(tmp_path), dataset='folder')
  with pytest.raises(ValueError, match=(rf"^Image folder {tmp_path}/train/cat holds a name that is not "
                                        r"UTF-8: b'caf\\xe9.png'; rename it")):
    data.get_info(config)
