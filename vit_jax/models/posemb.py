"""Position embeddings, the values of `model.posemb` (registry `POSEMBS`): learned, or fixed 2-D sin-cos.

Each is a module the encoder names `posembed_input`, called with the tokens [b, prefix + h * w, D] and
the patch grid (h, w). The learned one is the `Transformer/posembed_input/pos_embedding` parameter of the
original checkpoints; the fixed one has no parameter, so a model using it has no `pos_embedding`.
"""
from typing import Callable

import flax.linen as nn
import jax.numpy as jnp


def posemb_sincos_2d(h: int, w: int, width: int, temperature: float = 10_000.) -> jnp.ndarray:
  """big_vision's fixed 2-D position embeddings (MoCo v3): float32 (1, h * w, width), rows first.

  A quarter of the channels each is sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k), for the column x,
  the row y and w_k = temperature^(-k / (width / 4 - 1)), k < width / 4.
  """
  if width % 4 or width < 8:
    raise ValueError(f'sincos2d position embeddings need a width that is a multiple of 4 (at least 8), '
                     f'got {width}')
  y, x = jnp.mgrid[:h, :w]
  omega = 1.0 / temperature ** (jnp.arange(width // 4) / (width // 4 - 1))
  y = jnp.einsum('m,d->md', y.flatten(), omega)
  x = jnp.einsum('m,d->md', x.flatten(), omega)
  return jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)[None]


class AddPositionEmbs(nn.Module):
  """Adds learned 1D position embeddings, one per token (class token included)."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    del grid  # One embedding per token, whatever grid they come from.
    shape = (1, inputs.shape[1], inputs.shape[2])
    if self.has_variable('params', 'pos_embedding'):
      # Flax would only say that the initializer's shape differs from the stored one.
      stored = tuple(self.get_variable('params', 'pos_embedding').shape)
      if stored != shape:
        raise ValueError(f'the position embeddings {stored} are for {stored[1]} tokens, but the images '
                         f'give {shape[1]}: the parameters are for another image size; fit them to this '
                         'one with vit_jax.models.loading.adapt_params (as config.init_from does)')
    pos_embedding = self.param('pos_embedding', self.posemb_init, shape, jnp.float32)
    return inputs + pos_embedding.astype(inputs.dtype)


class AddSincosPositionEmbs(nn.Module):
  """Adds `posemb_sincos_2d` to the patch tokens.

  A class token gets a zero embedding (as MAE and timm do): big_vision adds the embeddings before
  prepending its class token, which is the same.
  """

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    h, w = grid
    posemb = posemb_sincos_2d(h, w, inputs.shape[-1])
    posemb = jnp.pad(posemb, ((0, 0), (inputs.shape[1] - h * w, 0), (0, 0)))
    return inputs + posemb.astype(inputs.dtype)


POSEMBS = {'learn': AddPositionEmbs, 'sincos2d': AddSincosPositionEmbs}
