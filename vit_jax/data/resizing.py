"""Bilinear resizing of numpy images (`resize`): PIL's antialiased filter (timm's) or TensorFlow's
(the original code's), each to the bit of its reference.

The pixel work is PIL's, which releases the GIL while it runs, or whole-array numpy: no per-pixel
Python.
"""

import numpy as np
from PIL import Image


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
