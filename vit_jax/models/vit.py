"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021).

Module and parameter names follow the original `vit_jax` code, so the parameter tree is the tree of the
published `.npz` checkpoints (ViT-B_16.npz, the AugReg files) and they load without renaming.
"""
from typing import Any, Callable, Optional

import flax.linen as nn
import jax.numpy as jnp

Dtype = Any


class AddPositionEmbs(nn.Module):
  """Adds learned 1D position embeddings, one per token (class token included)."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs: jnp.ndarray) -> jnp.ndarray:
    shape = (1, inputs.shape[1], inputs.shape[2])
    pos_embedding = self.param('pos_embedding', self.posemb_init, shape, jnp.float32)
    return inputs + pos_embedding.astype(inputs.dtype)


class MlpBlock(nn.Module):
  """Dense -> GELU -> dropout -> Dense -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6), name=name)
    x = dense(self.mlp_dim, 'Dense_0')(inputs)
    x = nn.gelu(x)  # The tanh approximation, as in the original code and checkpoints.
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = dense(inputs.shape[-1], 'Dense_1')(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Submodule names are spelled out: they are the names in the original checkpoints (older Flax numbered
  submodules across types), and current Flax would number them per type.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        dropout_rate=self.attention_dropout_rate, deterministic=deterministic,
        name='MultiHeadDotProductAttention_1')(x, x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = x + inputs
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name='MlpBlock_3')(
        y, deterministic=deterministic)
    return x + y


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and a final LayerNorm."""
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    x = AddPositionEmbs(name='posembed_input')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    for i in range(self.num_layers):
      x = Encoder1DBlock(
          mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout_rate=self.dropout_rate,
          attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
          name=f'encoderblock_{i}')(x, deterministic=not train)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='encoder_norm')(x)


class VisionTransformer(nn.Module):
  """ViT classifier: patch embedding, transformer encoder, class-token or GAP pooling, head.

  `representation_size` adds the tanh pre-logits layer used in pretraining; `num_classes=None` returns
  the pooled (pre-logits) representation. Logits are float32 whatever the compute `dtype`.
  """
  num_classes: Optional[int]
  patch_size: int
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  classifier: str = 'token'
  representation_size: Optional[int] = None
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    p = self.patch_size
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                name='embedding')(images.astype(self.dtype))
    n, h, w, d = x.shape
    x = jnp.reshape(x, (n, h * w, d))
    if self.classifier == 'token':
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    elif self.classifier != 'gap':
      raise ValueError(f"classifier must be 'token' or 'gap', got {self.classifier!r}")

    x = Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate, attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype, name='Transformer')(x, train=train)
    x = x[:, 0] if self.classifier == 'token' else jnp.mean(x, axis=1)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    if self.num_classes is None:
      return x.astype(jnp.float32)
    # Zero-initialised head: the fine-tuning recipe of the paper, and harmless for pretraining.
    x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                 name='head')(x)
    return x.astype(jnp.float32)
