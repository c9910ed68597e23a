"""A patch embedding resampled to another patch size, the arrays alone: FlexiViT's pseudo-inverse
resize (Beyer et al. 2023, "FlexiViT: One Model for All Patch Sizes", section 3.4).

A patch x of P x P pixels resized to Q x Q is R x for a fixed matrix R (the resize's weights). The
kernel w of Q x Q that gives the resized patch the token the P x P kernel gave the patch solves
<R x, w'> = <x, w>: w' = pinv(R^T) w, exact when Q >= P (R then has full column rank), the least
squares over patches otherwise. R is separable (rows, then columns: jax.image.resize and
torch.nn.functional.interpolate alike), so w' = pinv(R_h)^T w pinv(R_w) per input and output channel.

R is a resize at pixel centres: 'bilinear' is big_vision's FlexiViT (tf.image.resize 'bilinear', not
antialiased: what its checkpoints were trained with), 'bicubic' timm's `resample_patch_embed`
(interpolate 'bicubic', antialias=True), 'bilinear_antialiased' timm's with
interpolation='bilinear'; the antialiased ones as PIL when shrinking. Growing, antialiasing changes
nothing. `resize_param` fits a loaded tree's patch embedding to a model (adapting.py);
models/patch_embedding.py resamples the stored kernel as the model runs.
"""

import functools
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

KERNEL = 'embedding/kernel'
# config.patch_interpolation -> the resize the kernels are the inverse of: jax.image's kernel, and
# whether it antialiases.
_RESIZES = {
    'bilinear': ('linear', False),
    'bicubic': ('cubic', True),
    'bilinear_antialiased': ('linear', True),
}
PATCH_METHODS = tuple(_RESIZES)


def check_patch_method(method: str) -> None:
  if method not in PATCH_METHODS:
    raise ValueError(
        f'Unknown config.patch_interpolation {method!r} (how a patch embedding is resampled to '
        f'another patch size): use one of {", ".join(PATCH_METHODS)}, e.g. '
        '--config.patch_interpolation=bilinear'
    )


@functools.lru_cache(maxsize=64)
def pinv_resize(old: int, new: int, method: str) -> np.ndarray:
  """(old, new) float64: pinv(R) for the (new, old) matrix R that resizes `old` samples to `new` by
  `method` (pinv(R^T) = pinv(R)^T); a kernel axis of `old` taps times it is that axis resampled to
  `new` taps."""
  check_patch_method(method)
  kernel, antialias = _RESIZES[method]
  # Column j of R is the resize of the j-th unit vector (jax.image.resize's own call, antialias
  # chosen); a constant also in a traced model.
  with jax.ensure_compile_time_eval():
    resize = jax.image.scale_and_translate(
        np.eye(old, dtype=np.float32),
        (new, old),
        (0,),
        np.array([new / old], np.float32),
        np.zeros(1, np.float32),
        kernel,
        antialias=antialias,
    )
  return np.linalg.pinv(np.asarray(resize, np.float64))


def resample_kernel(
    kernel: np.ndarray | jax.Array, size: tuple[int, int], method: str
) -> np.ndarray | jax.Array:
  """A patch embedding `kernel` [h, w, in, out] resampled to `size` = (h', w') taps; float64 for a
  numpy kernel (fitting a checkpoint), float32 for a jax one (in a traced model)."""
  rows, cols = (pinv_resize(n, m, method) for n, m in zip(kernel.shape[:2], size))
  if isinstance(kernel, jax.Array):
    return jnp.einsum(
        'hH,wW,hw...->HW...', rows.astype(np.float32), cols.astype(np.float32), kernel
    )
  return np.einsum('hH,wW,hw...->HW...', rows, cols, np.asarray(kernel, np.float64))


def resize_param(params: dict[str, Any], new: tuple[int, ...], method: str) -> Optional[str]:
  """Resamples the patch embedding of the flat tree `params` to the model's kernel shape `new` in
  place; returns the log's note, or None where there is nothing to resample (the same patch size, or
  other channels, which the shape check names)."""
  if KERNEL not in params:
    return None
  old = tuple(params[KERNEL].shape)
  if old == tuple(new) or len(old) != 4 or len(new) != 4 or old[2:] != tuple(new[2:]):
    return None
  params[KERNEL] = resample_kernel(params[KERNEL], new[:2], method).astype(params[KERNEL].dtype)
  return (
      f'resampled the patch embedding {old[0]}x{old[1]} -> {new[0]}x{new[1]} pixels '
      f'(pseudo-inverse, {method})'
  )
