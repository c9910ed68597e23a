"""RandAugment (Cubuk et al., https://arxiv.org/abs/1909.13719) on numpy images, with PIL's ops.

This follows the TF reference RandAugment that big_vision uses (big_vision/pp/autoaugment.py, a fork
of tensorflow/tpu's EfficientNet autoaugment.py): its 16 ops, its magnitude -> argument mapping and
its constants (translate 100 pixels, cutout 40, grey 128 where geometry or cutout uncovers pixels).
Each layer applies one op drawn uniformly; the reference also draws a per-op probability but never
uses it, so a drawn op is always applied. Every random draw comes from the caller's
`np.random.Generator`.

The reference's ops were meant as PIL's, so they call PIL on uint8 images where PIL has the op
(the earlier TF port had been fixed to PIL's where the reference missed: Contrast's mean grey,
Sharpness's rounding, integer luma), and numpy table lookups and slices where those are the same
and faster. Shear and translate sample input pixel round(M (x, y) + t) for output pixel (x, y), as
the reference; Rotate is PIL's rotate, the same map about the centre. Kept from the reference as
TF runs it, as that shaped the published recipes: Solarize's threshold int(25.6 * magnitude) is
compared with the uint8 pixels as a uint8, modulo 256 (magnitude 10: 0, every pixel inverted; 15:
128; big_vision issue #110), and Posterize keeps int(0.4 * magnitude) bits but at least 1 (TF
clamps its shift of 8 bits to 7).
"""

from typing import Callable

import numpy as np
from PIL import Image, ImageEnhance, ImageOps

_MAX_LEVEL = 10.0
_TRANSLATE_PIXELS = 100  # At magnitude 10; big_vision's randaug (AutoAugment uses 250).
_CUTOUT_HALF_SIZE = 40  # At magnitude 10: a box of up to 80 x 80 pixels.
_FILL = 128  # Mid grey, so filled pixels do not push later ops (e.g. AutoContrast) to an extreme.
_SOLARIZE_ADD_THRESHOLD = 128
_LEVELS = np.arange(256)  # The uint8 values, for lookup tables.


def _pil(op: Callable[..., Image.Image], image: np.ndarray, *args) -> np.ndarray:
  return np.asarray(op(Image.fromarray(image), *args))


def autocontrast(image: np.ndarray) -> np.ndarray:
  """PIL's ImageOps.autocontrast: each channel stretched linearly to [0, 255] (if not constant)."""
  return _pil(ImageOps.autocontrast, image)


def equalize(image: np.ndarray) -> np.ndarray:
  """PIL's ImageOps.equalize: histogram equalisation of each channel."""
  return _pil(ImageOps.equalize, image)


def invert(image: np.ndarray) -> np.ndarray:
  return 255 - image


def posterize(image: np.ndarray, bits: int) -> np.ndarray:
  """Keeps the `bits` high bits of each value (PIL's ImageOps.posterize, also for 0 bits)."""
  return image & np.uint8(256 - 2 ** (8 - bits))


def _lookup(image: np.ndarray, table: np.ndarray) -> np.ndarray:
  # A 256-entry table is faster than the arithmetic on the pixels, and needs no wider dtype.
  return np.take(table.astype(np.uint8), image)


def solarize(image: np.ndarray, threshold: int) -> np.ndarray:
  """Inverts the values >= threshold (PIL's ImageOps.solarize)."""
  return _lookup(image, np.where(_LEVELS < threshold, _LEVELS, 255 - _LEVELS))


def solarize_add(image: np.ndarray, addition: int) -> np.ndarray:
  """Adds `addition` to the values below 128, clipping at 255."""
  added = np.minimum(_LEVELS + addition, 255)
  return _lookup(image, np.where(_LEVELS < _SOLARIZE_ADD_THRESHOLD, added, _LEVELS))


def color(image: np.ndarray, factor: float) -> np.ndarray:
  """PIL's ImageEnhance.Color: 0 is grey, 1 the image, above 1 more saturated."""
  return _pil(lambda im: ImageEnhance.Color(im).enhance(factor), image)


def contrast(image: np.ndarray, factor: float) -> np.ndarray:
  """PIL's ImageEnhance.Contrast: 0 is the mean grey level, 1 the image."""
  return _pil(lambda im: ImageEnhance.Contrast(im).enhance(factor), image)


def brightness(image: np.ndarray, factor: float) -> np.ndarray:
  """PIL's ImageEnhance.Brightness: 0 is black, 1 the image."""
  return _pil(lambda im: ImageEnhance.Brightness(im).enhance(factor), image)


def sharpness(image: np.ndarray, factor: float) -> np.ndarray:
  """PIL's ImageEnhance.Sharpness: 0 is PIL's SMOOTH filter (border pixels kept), 1 the image."""
  return _pil(lambda im: ImageEnhance.Sharpness(im).enhance(factor), image)


def _affine(image: np.ndarray, matrix: tuple[float, ...]) -> np.ndarray:
  """Output pixel (x, y) takes input pixel round(a x + b y + c, d x + e y + f); [a..f] = matrix.

  Pixels mapped from outside the image are grey. PIL samples input floor(M (x + 1/2, y + 1/2) + t')
  (nearest), the same map for t' = t + 1/2 - M (1/2, 1/2), which rounds a half up where the TF
  reference rounds it away from 0: a negative shear's rows at exact halves (every tenth at level
  0.3) shift one pixel less.
  """
  a, b, c, d, e, f = matrix
  data = (a, b, c + 0.5 - (a + b) / 2, d, e, f + 0.5 - (d + e) / 2)
  return _pil(
      lambda im: im.transform(
          im.size,
          Image.Transform.AFFINE,
          data,
          resample=Image.Resampling.NEAREST,
          fillcolor=(_FILL,) * 3,
      ),
      image,
  )


def rotate(image: np.ndarray, degrees: float) -> np.ndarray:
  """PIL's rotate: counter-clockwise about the image centre, nearest pixel."""
  return _pil(
      lambda im: im.rotate(degrees, resample=Image.Resampling.NEAREST, fillcolor=(_FILL,) * 3),
      image,
  )


def shear_x(image: np.ndarray, level: float) -> np.ndarray:
  return _affine(image, (1.0, level, 0.0, 0.0, 1.0, 0.0))


def shear_y(image: np.ndarray, level: float) -> np.ndarray:
  return _affine(image, (1.0, 0.0, 0.0, level, 1.0, 0.0))


def translate_x(image: np.ndarray, pixels: float) -> np.ndarray:
  """Moves the content `pixels` to the left (right if negative)."""
  return _affine(image, (1.0, 0.0, pixels, 0.0, 1.0, 0.0))


def translate_y(image: np.ndarray, pixels: float) -> np.ndarray:
  """Moves the content `pixels` up (down if negative)."""
  return _affine(image, (1.0, 0.0, 0.0, 0.0, 1.0, pixels))


def cutout(image: np.ndarray, half_size: int, center: tuple[int, int]) -> np.ndarray:
  """Greys rows [cy - half_size, cy + half_size) x columns [cx - half_size, cx + half_size)."""
  (cy, cx), out = center, image.copy()
  out[max(cy - half_size, 0) : cy + half_size, max(cx - half_size, 0) : cx + half_size] = _FILL
  return out


# Name -> the op, on a uint8 [h, w, 3] image and the arguments from `op_args`; reference's order.
OPS: dict[str, Callable[..., np.ndarray]] = {
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


def _random_sign(value: float, rng: np.random.Generator) -> float:
  """`value` or `-value`, each with probability 1/2: geometric ops go either way."""
  return value if rng.random() < 0.5 else -value


def _random_center(image: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
  """A uniformly drawn pixel (y, x) of the image."""
  cy, cx = rng.integers(0, image.shape[:2])
  return int(cy), int(cx)


def _enhance_factor(level: float) -> float:
  return level * 1.8 + 0.1


# Name -> (level = magnitude / 10, rng, image) -> the op's arguments after the image.
_ARGS: dict[str, Callable[[float, np.random.Generator, np.ndarray], tuple]] = {
    'AutoContrast': lambda level, rng, image: (),
    'Equalize': lambda level, rng, image: (),
    'Invert': lambda level, rng, image: (),
    'Rotate': lambda level, rng, image: (_random_sign(level * 30.0, rng),),
    'Posterize': lambda level, rng, image: (max(int(level * 4), 1),),
    'Solarize': lambda level, rng, image: (int(level * 256) % 256,),
    'Color': lambda level, rng, image: (_enhance_factor(level),),
    'Contrast': lambda level, rng, image: (_enhance_factor(level),),
    'Brightness': lambda level, rng, image: (_enhance_factor(level),),
    'Sharpness': lambda level, rng, image: (_enhance_factor(level),),
    'ShearX': lambda level, rng, image: (_random_sign(level * 0.3, rng),),
    'ShearY': lambda level, rng, image: (_random_sign(level * 0.3, rng),),
    'TranslateX': lambda level, rng, image: (_random_sign(level * _TRANSLATE_PIXELS, rng),),
    'TranslateY': lambda level, rng, image: (_random_sign(level * _TRANSLATE_PIXELS, rng),),
    'Cutout': lambda level, rng, image: (
        int(level * _CUTOUT_HALF_SIZE),
        _random_center(image, rng),
    ),
    'SolarizeAdd': lambda level, rng, image: (int(level * 110),),
}


def op_args(name: str, magnitude: float, rng: np.random.Generator, image: np.ndarray) -> tuple:
  """The arguments, after the image, of `OPS[name]` at `magnitude`, drawn from `rng`. 10 is the TF
  reference's top level; AugReg's recipes go to 20 (preprocess checks the bound)."""
  return _ARGS[name](magnitude / _MAX_LEVEL, rng, image)


def randaugment(
    image: np.ndarray, rng: np.random.Generator, layers: int, magnitude: float
) -> np.ndarray:
  """Applies `layers` ops, each drawn uniformly from `OPS`, at `magnitude` (0-20, see op_args).

  `image` is uint8 or float32 [h, w, 3] in [0, 255]; the output has the same shape, dtype and
  range, and is a function of the image and `rng`'s draws. The ops work on uint8, as the
  reference's and PIL's do, so a float32 image is rounded (half to even) to whole grey levels first
  (0 layers: returned unchanged).
  """
  eight_bit = image.dtype == np.uint8
  if layers == 0:
    return np.ascontiguousarray(image, None if eight_bit else np.float32)
  augmented = image if eight_bit else np.clip(np.rint(image), 0, 255).astype(np.uint8)
  names = list(OPS)
  for _ in range(layers):
    name = names[rng.integers(len(names))]
    augmented = OPS[name](augmented, *op_args(name, magnitude, rng, augmented))
  return augmented if eight_bit else augmented.astype(np.float32)
