"""The masked autoencoder (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners"): the
self-supervised pretraining of today's ViTs (MAE's checkpoints, and those fine-tuned from them).

The encoder is the ViT backbone, run on a random `1 - mask_ratio` of each image's patches (after their
position embeddings; the prefix tokens always run); a light decoder (`decoder`) embeds its tokens to
its width, puts a learned mask token at every other patch, and predicts each patch's pixels. Its
parameters are the ViT's (`embedding`, `cls`, `Transformer/...`) plus `decoder`, which a classifier
fine-tuned from it by `config.init_from` drops. The loss is tasks/mae.py's.
"""

from typing import Any

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.encoder import Encoder
from vit_jax.models.vit import ViTBackbone

# The backbone's fields the decoder's blocks share (MAE's decoder blocks are its encoder's kind).
_SHARED_WITH_DECODER = (
    'mlp_activation',
    'layernorm_epsilon',
    'norm_layer',
    'dtype',
    'attention',
    'matmul',
    'remat',
    'scan',
)


def visible_patches(num_patches: int, mask_ratio: float) -> int:
  """How many of `num_patches` the encoder sees (MAE's and Hugging Face's rounding down)."""
  return int(num_patches * (1 - mask_ratio))


def patch_pixels(images: jnp.ndarray, stride: int) -> jnp.ndarray:
  """Images [b, H, W, C] -> each patch's pixels [b, H/s * W/s, s * s * C], patches row by row and each
  one's pixels row, column, channel (MAE's `patchify`): the decoder's targets."""
  b, h, w, c = images.shape
  s = stride
  patches = images.reshape(b, h // s, s, w // s, s, c).transpose(0, 1, 3, 2, 4, 5)
  return patches.reshape(b, (h // s) * (w // s), s * s * c)


def pixels_image(patches: jnp.ndarray, grid: tuple[int, int], stride: int) -> jnp.ndarray:
  """`patch_pixels`' inverse: patches [b, h * w, s * s * C] of the grid (h, w) -> images
  [b, h * s, w * s, C]."""
  b, _, size = patches.shape
  (h, w), s = grid, stride
  images = patches.reshape(b, h, w, s, s, size // (s * s)).transpose(0, 1, 3, 2, 4, 5)
  return images.reshape(b, h * s, w * s, -1)


class MaeDecoder(nn.Module):
  """Encoded visible tokens [b, prefix + k, D] -> every patch's predicted pixels [b, patches, out]."""

  hidden_size: int
  num_layers: int
  num_heads: int
  mlp_dim: int
  # A key of posemb.POSEMBS added at its input: fixed 'sincos2d_mae' (MAE's), 'sincos2d', or 'learn'.
  posemb: str
  num_prefix_tokens: int
  out_features: int
  mlp_activation: str = 'gelu_tanh'
  layernorm_epsilon: float = 1e-6
  norm_layer: str = 'layernorm'
  dtype: Any = jnp.float32
  attention: str = 'xla'
  matmul: str = 'default'
  remat: str | None = None
  scan: bool = False

  @nn.compact
  def __call__(
      self, tokens: jnp.ndarray, restore: jnp.ndarray, grid: tuple[int, int], train: bool
  ) -> jnp.ndarray:
    n, num_patches = restore.shape
    prefix = self.num_prefix_tokens
    x = nn.Dense(self.hidden_size, dtype=self.dtype, name='embed')(tokens)
    mask_token = self.param(
        'mask_token', nn.initializers.normal(0.02), (1, 1, self.hidden_size), jnp.float32
    )
    hidden = num_patches - (x.shape[1] - prefix)
    patches = jnp.concatenate(
        [
            x[:, prefix:],
            jnp.broadcast_to(mask_token.astype(x.dtype), (n, hidden, self.hidden_size)),
        ],
        axis=1,
    )
    # Back to the grid's order: the visible patches came first, in the order of their noise.
    patches = jnp.take_along_axis(patches, restore[..., None], axis=1)
    x = jnp.concatenate([x[:, :prefix], patches], axis=1)
    x = Encoder(
        num_layers=self.num_layers,
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        posemb=self.posemb,
        mlp_activation=self.mlp_activation,
        layernorm_epsilon=self.layernorm_epsilon,
        norm_layer=self.norm_layer,
        dtype=self.dtype,
        attention=self.attention,
        matmul=self.matmul,
        remat=self.remat,
        scan=self.scan,
        name='Transformer',
    )(x, grid=grid, train=train)
    pixels = nn.Dense(self.out_features, dtype=self.dtype, name='pred')(x[:, prefix:])
    return pixels.astype(jnp.float32)


class MaskedAutoencoder(ViTBackbone, kw_only=True):
  """A ViT backbone (the fields of `VisionTransformer` but num_classes and representation_size) that
  encodes a random share of each image's patches and decodes every patch's pixels.

  Called with `noise` [b, patches] (MAE's and Hugging Face's argument: each image keeps its
  `visible_patches` patches of the smallest noise), it returns the float32 predicted pixels
  [b, patches, input_stride^2 * 3] (as `patch_pixels` orders them) and the float32 mask
  [b, patches] of the hidden ones (1); without `noise` nothing is hidden.
  """

  mask_ratio: float = 0.75
  decoder_hidden_size: int = 512
  decoder_num_layers: int = 8
  decoder_num_heads: int = 16
  decoder_mlp_dim: int = 2048
  decoder_posemb: str = 'sincos2d'

  @nn.compact
  def __call__(
      self, images: jnp.ndarray, *, train: bool = False, noise: jax.Array | None = None
  ) -> tuple[jnp.ndarray, jnp.ndarray]:
    x = self.embed_patches(images)
    n, num_patches, _ = x.shape
    grid = self.patch_grid(images)
    if noise is None:
      visible, keep = num_patches, None
      restore = jnp.broadcast_to(jnp.arange(num_patches), (n, num_patches))
    else:
      chex.assert_shape(noise, (n, num_patches))
      visible = visible_patches(num_patches, self.mask_ratio)
      order = jnp.argsort(noise, axis=1, stable=True)
      keep, restore = order[:, :visible], jnp.argsort(order, axis=1, stable=True)
    tokens = self.apply_fc_norm(self.encode(x, grid=grid, train=train, keep=keep))
    pixels = MaeDecoder(
        hidden_size=self.decoder_hidden_size,
        num_layers=self.decoder_num_layers,
        num_heads=self.decoder_num_heads,
        mlp_dim=self.decoder_mlp_dim,
        posemb=self.decoder_posemb,
        num_prefix_tokens=self.num_prefix_tokens,
        out_features=self.input_stride**2 * images.shape[-1],
        **{name: getattr(self, name) for name in _SHARED_WITH_DECODER},
        name='decoder',
    )(tokens, restore, grid, train)
    return pixels, (restore >= visible).astype(jnp.float32)
