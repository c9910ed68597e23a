"""Masked patch prediction (paper Sec. 4.6): BERT-style self-supervision for the ViT.

Half of the patch embeddings are corrupted (of those, 80% replaced by a learned [mask] embedding, 10% by
another patch's embedding of the same image, 10% left as they are) and the model predicts, for each
corrupted patch, its mean colour quantised to `num_bits` bits per channel (512 classes for 3 bits).
The parameter names are the ViT's (`embedding`, `cls`, `Transformer/...`) plus `mask_token` and
`mpp_head`, so the classifier fine-tunes from it by `config.init_from`.
"""
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.vit import Encoder


def colour_targets(images: jnp.ndarray, patch_size: int, num_bits: int) -> jnp.ndarray:
  """The class of each patch's mean colour: images [b, H, W, 3] in [-1, 1] -> int32 [b, patches]."""
  b, h, w, c = images.shape
  p = patch_size
  patches = images.reshape(b, h // p, p, w // p, p, c).mean(axis=(2, 4)).reshape(b, -1, c)
  levels = 2 ** num_bits
  quantised = jnp.clip(jnp.floor((patches + 1) / 2 * levels), 0, levels - 1).astype(jnp.int32)
  return (quantised[..., 0] * levels + quantised[..., 1]) * levels + quantised[..., 2]


def corrupt_patches(x: jnp.ndarray, mask_token: jnp.ndarray, key: jax.Array,
                    mask_rate: float) -> tuple[jnp.ndarray, jnp.ndarray]:
  """BERT-style corruption of patch embeddings x [b, patches, D]; returns them and the corrupted mask.

  Each patch is corrupted with probability `mask_rate`; a corrupted one becomes `mask_token` (80%),
  another patch of the same image (10%), or stays as it is (10%).
  """
  n, length, _ = x.shape
  corrupt_key, kind_key, source_key = jax.random.split(key, 3)
  corrupted = jax.random.bernoulli(corrupt_key, mask_rate, (n, length))
  kind = jax.random.uniform(kind_key, (n, length))
  other = jnp.take_along_axis(x, jax.random.randint(source_key, (n, length, 1), 0, length), axis=1)
  x = jnp.where((corrupted & (kind < 0.8))[..., None], mask_token.astype(x.dtype), x)
  x = jnp.where((corrupted & (kind >= 0.8) & (kind < 0.9))[..., None], other, x)
  return x, corrupted


class MaskedPatchPredictor(nn.Module):
  """A ViT whose output is a colour class for every (corrupted) patch token.

  Returns float32 logits [b, patches, 2^(3 num_bits)] and the bool mask [b, patches] of corrupted
  patches; needs an 'mpp' rng (and 'dropout' when training).
  """
  patch_size: int
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  classifier: str = 'token'
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  mask_rate: float = 0.5
  num_bits: int = 3
  dtype: jnp.dtype = jnp.float32
  attention: str = 'xla'
  remat: str | None = None
  scan: bool = False

  @nn.compact
  def __call__(self, images: jnp.ndarray, *, train: bool = False):
    p = self.patch_size
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                name='embedding')(images.astype(self.dtype))
    n, h, w, d = x.shape
    mask_token = self.param('mask_token', nn.initializers.normal(0.02), (1, 1, d), jnp.float32)
    x, corrupted = corrupt_patches(jnp.reshape(x, (n, h * w, d)), mask_token, self.make_rng('mpp'),
                                   self.mask_rate)
    if self.classifier == 'token':
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    x = Encoder(num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
                dropout_rate=self.dropout_rate, attention_dropout_rate=self.attention_dropout_rate,
                dtype=self.dtype, attention=self.attention, remat=self.remat, scan=self.scan,
                name='Transformer')(x, train=train)
    tokens = x[:, 1:] if self.classifier == 'token' else x
    logits = nn.Dense(2 ** (3 * self.num_bits), dtype=self.dtype, name='mpp_head')(tokens)
    return logits.astype(jnp.float32), corrupted
