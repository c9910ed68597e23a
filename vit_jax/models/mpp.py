"""Masked patch prediction (paper Sec. 4.6): BERT-style self-supervision for the ViT.

Half of the patch embeddings are corrupted (of those, 80% replaced by a learned [mask] embedding, 10% by
another patch's embedding of the same image, 10% left as they are) and the model predicts, for each
corrupted patch, its mean colour quantised to `num_bits` bits per channel (512 classes for 3 bits).
The model is the ViT backbone (pure or hybrid) with the corruption between patch embedding and encoder,
so its parameters are the ViT's (`embedding`, `cls`, `Transformer/...`, the hybrid's ResNet stem) plus
`mask_token` and `mpp_head`, and the classifier fine-tunes from it by `config.init_from`.
"""

from typing import Any, Mapping

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.vit import ViTBackbone

# Fields of a ViT model config (variants.get_model_config) for the classifier's parts beyond the
# backbone, a pre-logits layer, dropout before the head, the head's bias, and its patch dropout: the
# predictor has none of them (a masked autoencoder hides patches by its own mask_ratio).
CLASSIFIER_FIELDS = ('representation_size', 'head_dropout_rate', 'head_bias_init', 'patch_dropout')


def backbone_fields(model: Mapping[str, Any]) -> dict[str, Any]:
  """A ViT model config without `CLASSIFIER_FIELDS`: the fields `MaskedPatchPredictor` takes."""
  return {name: value for name, value in model.items() if name not in CLASSIFIER_FIELDS}


def colour_targets(images: jnp.ndarray, patch_pixels: int, num_bits: int) -> jnp.ndarray:
  """The class of each patch's mean colour: images [b, H, W, 3] in [-1, 1] -> int32 [b, patches].

  Patches are `patch_pixels` x `patch_pixels` input pixels, in the order of the model's tokens: pass
  the model's `input_stride`, so a hybrid's tokens (cut from the ResNet stem's feature map) get the
  colours of the image regions they cover.
  """
  chex.assert_shape(images, (None, None, None, 3))
  b, h, w, c = images.shape
  p = patch_pixels
  patches = images.reshape(b, h // p, p, w // p, p, c).mean(axis=(2, 4)).reshape(b, -1, c)
  levels = 2**num_bits
  quantised = jnp.clip(jnp.floor((patches + 1) / 2 * levels), 0, levels - 1).astype(jnp.int32)
  return (quantised[..., 0] * levels + quantised[..., 1]) * levels + quantised[..., 2]


def corrupt_patches(
    x: jnp.ndarray, mask_token: jnp.ndarray, key: jax.Array, mask_rate: float
) -> tuple[jnp.ndarray, jnp.ndarray]:
  """BERT-style corruption of patch embeddings x [b, patches, D]; returns them and the corrupted mask.

  Each patch is corrupted with probability `mask_rate`; a corrupted one becomes `mask_token` (80%),
  another patch of the same image (10%: uniformly one of the others, never itself), or stays as it is
  (10%). `key` draws the whole batch's
  pattern, or is one key per example [b]: each example's pattern then is its own, whatever batch and
  row it is in.
  """
  n, length, _ = x.shape

  def draws(key: jax.Array, rows: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    corrupt_key, kind_key, source_key = jax.random.split(key, 3)
    return (
        jax.random.bernoulli(corrupt_key, mask_rate, (rows, length)),
        jax.random.uniform(kind_key, (rows, length)),
        # One of the `length - 1` others: drawn below it, then past it.
        jax.random.randint(source_key, (rows, length, 1), 0, max(length - 1, 1)),
    )

  if key.ndim == 0:
    corrupted, kind, source = draws(key, n)
  else:
    chex.assert_shape(key, (n,))
    corrupted, kind, source = (a[:, 0] for a in jax.vmap(draws, (0, None))(key, 1))
  own = jnp.arange(length)[None, :, None]
  source = jnp.minimum(source + (source >= own), length - 1)  # An image of one patch: itself.
  other = jnp.take_along_axis(x, source, axis=1)
  x = jnp.where((corrupted & (kind < 0.8))[..., None], mask_token.astype(x.dtype), x)
  x = jnp.where((corrupted & (kind >= 0.8) & (kind < 0.9))[..., None], other, x)
  return x, corrupted


class MaskedPatchPredictor(ViTBackbone, kw_only=True):
  """A ViT (the fields of `VisionTransformer` but num_classes and representation_size) whose output is
  a colour class for every patch token.

  Returns float32 logits [b, patches, 2^(3 num_bits)] and the bool mask [b, patches] of corrupted
  patches; needs an 'mpp' rng, or `corruption_keys` (one key per image, see `corrupt_patches`), and
  'dropout' when training. The targets are `colour_targets(images, model.input_stride, model.num_bits)`.
  """

  mask_rate: float = 0.5
  num_bits: int = 3

  @nn.compact
  def __call__(
      self, images: jnp.ndarray, *, train: bool = False, corruption_keys: jax.Array | None = None
  ) -> tuple[jnp.ndarray, jnp.ndarray]:
    x = self.embed_patches(images)
    mask_token = self.param(
        'mask_token', nn.initializers.normal(0.02), (1, 1, x.shape[-1]), jnp.float32
    )
    key = self.make_rng('mpp') if corruption_keys is None else corruption_keys
    x, corrupted = corrupt_patches(x, mask_token, key, self.mask_rate)
    x = self.encode(x, grid=self.patch_grid(images), train=train)
    # With fc_norm the encoder leaves the normalisation to the model: here per token.
    tokens = self.apply_fc_norm(x[:, self.num_prefix_tokens :])
    logits = nn.Dense(2 ** (3 * self.num_bits), dtype=self.dtype, name='mpp_head')(tokens)
    return logits.astype(jnp.float32), corrupted
