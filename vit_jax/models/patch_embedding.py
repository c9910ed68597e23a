"""The patch embedding: a convolution of stride and size the patch size (nn.Conv's parameters
`kernel` [p, p, in, D] and `bias` [D], drawn and computed as nn.Conv draws and computes them).

Within `resampled_patches(method)`, a model of another patch size than its stored kernel resamples the
kernel to its own by FlexiViT's pseudo-inverse resize (checkpoints/patch_resizing.py), in the traced
computation, as fine-tuning at a new patch size resamples it once on the host: the evaluators at
another patch size and FlexiViT's steps (train/flexi.py) trace their model in it
(`fitted_to_images`).
"""

import contextlib
import functools
from typing import Any, Callable, Iterator

import flax.linen as nn
import jax.numpy as jnp
from flax.linen import dtypes
from jax import lax

from vit_jax.checkpoints import patch_resizing
from vit_jax.models import posemb

# The methods of the `resampled_patches` contexts entered, innermost last.
_RESAMPLING: list[str] = []


@contextlib.contextmanager
def resampled_patches(method: str) -> Iterator[None]:
  """Within it, a stored patch embedding of another patch size is resampled to the model's by
  `method` (a config.patch_interpolation) as the model runs."""
  patch_resizing.check_patch_method(method)
  _RESAMPLING.append(method)
  try:
    yield
  finally:
    _RESAMPLING.pop()


def fitted_to_images(fn: Callable, posemb_method: str, patch_method: str) -> Callable:
  """`fn` tracing its model in posemb.fitted_to_grid and `resampled_patches`: a model of another
  image or patch size than its parameters' resizes their position embeddings to its grid (timm's
  dynamic_img_size) and resamples their patch embedding (FlexiViT's) as it runs."""

  @functools.wraps(fn)
  def fitted(*args: Any) -> Any:
    with posemb.fitted_to_grid(posemb_method), resampled_patches(patch_method):
      return fn(*args)

  return fitted


class PatchEmbedding(nn.Module):
  """[b, H, W, in] -> [b, H / p, W / p, features]: each p x p patch's linear embedding."""

  patch_size: int
  features: int
  use_bias: bool = True
  dtype: jnp.dtype = jnp.float32

  def _kernel(self, shape: tuple[int, ...]) -> jnp.ndarray:
    if self.has_variable('params', 'kernel'):
      stored = self.get_variable('params', 'kernel')
      if stored.shape[:2] != shape[:2] and stored.shape[2:] == shape[2:]:
        if not _RESAMPLING:
          # Flax would only say that the initializer's shape differs from the stored one.
          raise ValueError(
              f'the patch embedding {tuple(stored.shape)} is for patches of '
              f'{stored.shape[0]}x{stored.shape[1]} pixels, but the model cuts {shape[0]}x'
              f'{shape[1]}: resample it with vit_jax.checkpoints.adapting.adapt_params (as '
              'config.init_from does)'
          )
        return patch_resizing.resample_kernel(stored, shape[:2], _RESAMPLING[-1])
    return self.param('kernel', nn.initializers.lecun_normal(), shape, jnp.float32)

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    p = self.patch_size
    kernel = self._kernel((p, p, x.shape[-1], self.features))
    bias = self.param('bias', nn.initializers.zeros, (self.features,)) if self.use_bias else None
    x, kernel, bias = dtypes.promote_dtype(x, kernel, bias, dtype=self.dtype)
    y = lax.conv_general_dilated(
        x, kernel, (p, p), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )
    return y if bias is None else y + bias
