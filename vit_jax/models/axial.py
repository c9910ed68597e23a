"""Axial-ViT (the paper's Appendix D.7): each block is row self-attention + MLP, then column
self-attention + MLP, over the patch grid.

Each half is the ViT's own pre-LayerNorm block (`Encoder1DBlock`), run on the grid's rows (sequences
of w tokens) and then on its columns (h tokens), so attention costs N (h + w) instead of N^2 for N
patches, at twice the projections and MLPs. The tokens are the grid alone: the model pools them
(classifier 'gap' or 'map'), as a class token belongs to no row or column.
"""

import dataclasses
from typing import Optional

import chex
import jax.numpy as jnp
import flax.linen as nn

from vit_jax.models.block import Encoder1DBlock, Rate


class AxialBlock(Encoder1DBlock):
  """Row block `row`, then column block `column`, on tokens [b, h * w, D] of the grid (h, w), rows
  first; both halves have this block's fields. Called as an `Encoder1DBlock` is."""

  @nn.compact
  def __call__(
      self,
      inputs: jnp.ndarray,
      deterministic: bool,
      drop_path_rate: Rate = None,
      shared_posemb: Optional[jnp.ndarray] = None,
  ) -> jnp.ndarray:
    if self.posemb is not None or shared_posemb is not None or drop_path_rate:
      # Refused by variants.py; here so that no caller adds per-row embeddings or drops a row of an
      # image instead of the image.
      raise ValueError('an axial block takes no per-block position embeddings nor stochastic depth')
    b, n, d = inputs.shape
    h, w = self.grid
    chex.assert_shape(
        inputs, (b, h * w, d), custom_message='axial blocks take the patch grid alone'
    )
    fields = {
        f.name: getattr(self, f.name)
        for f in dataclasses.fields(Encoder1DBlock)
        if f.init and f.name not in ('parent', 'name')
    }
    x = Encoder1DBlock(**fields, name='row')(inputs.reshape(b * h, w, d), deterministic)
    x = x.reshape(b, h, w, d).transpose(0, 2, 1, 3).reshape(b * w, h, d)
    x = Encoder1DBlock(**fields, name='column')(x, deterministic)
    return x.reshape(b, w, h, d).transpose(0, 2, 1, 3).reshape(b, n, d)
