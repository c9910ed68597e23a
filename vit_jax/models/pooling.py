"""Pooling of the encoded tokens into one representation: the values of `model.classifier`.

`CLASSIFIERS` is their registry; each maps (encoded tokens [b, tokens, D], the model) to [b, D] and is
called inside the model's `__call__`, so a pooling with parameters (MAP) adds them at the top of the
model's tree. 'token': the class token's output (the model prepends one); 'gap': the mean of the patch
tokens; 'map': multihead attention pooling of the patch tokens (or of every token, the model's
`map_include_prefix`); 'token_gap': the class token's output and the patch tokens' mean side by
side, [b, 2 D] (DINOv2's linear evaluation, transformers' Dinov2ForImageClassification).
"""

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import norms
from vit_jax.models.attention import ATTENTION_FNS
from vit_jax.models.block import MlpBlock

Dtype = Any
# The MAP head's name in a model's tree (`map_head`), which checkpoint readers and writers name too.
MAP_HEAD = 'MAPHead_0'


class MAPHead(nn.Module):
  """Multihead attention pooling (big_vision's `MAPHead`, timm's `AttentionPoolLatent`).

  A learned probe token attends over the tokens, then x + MLP(LN(x)); its output is the representation.
  The parameter names are big_vision's (`probe`, `MultiHeadDotProductAttention_0`, `LayerNorm_0`,
  `MlpBlock_0`), so its checkpoints, and timm's reader of them, take these parameters as they are.
  """

  num_heads: int
  mlp_dim: int
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.
  mlp_activation: str = 'gelu_tanh'  # A key of block.MLP_ACTIVATIONS.
  layernorm_epsilon: float = 1e-6
  norm_layer: str = 'layernorm'  # A key of norms.NORM_LAYERS.

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    n, _, d = x.shape
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d), jnp.float32)
    probe = jnp.tile(probe.astype(x.dtype), (n, 1, 1))
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads,
        dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(),
        attention_fn=ATTENTION_FNS[self.attention],
        name='MultiHeadDotProductAttention_0',
    )(probe, x)
    y = norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'LayerNorm_0')(x)
    # No dropout in the head, as in big_vision and timm.
    x = x + MlpBlock(
        self.mlp_dim, dtype=self.dtype, activation=self.mlp_activation, name='MlpBlock_0'
    )(y, deterministic=True)
    return x[:, 0]


def _class_token(x: jnp.ndarray, model: Any) -> jnp.ndarray:
  del model
  return x[:, 0]


def _mean(x: jnp.ndarray, model: Any) -> jnp.ndarray:
  return jnp.mean(x[:, model.num_prefix_tokens :], axis=1)  # The patches' (not the registers').


def map_head(model: Any) -> MAPHead:
  """The MAP head `MAPHead_0` of a ViT `model` (its map_heads, map_mlp_dim, activation): what
  classifier 'map' pools with, and what a run draws afresh into a loaded model that has none."""
  return MAPHead(
      num_heads=model.map_heads or model.num_heads,
      mlp_dim=model.map_mlp_dim or model.mlp_dim,
      dtype=model.dtype,
      attention=model.attention,
      mlp_activation=model.mlp_activation,
      layernorm_epsilon=model.layernorm_epsilon,
      norm_layer=model.norm_layer,
      name=MAP_HEAD,
  )


def _attention_pooling(x: jnp.ndarray, model: Any) -> jnp.ndarray:
  # The probe attends to the patches alone, as timm's VisionTransformer's attn_pool
  # (pool_include_prefix=False), or with map_include_prefix to every token, as its Eva's.
  return map_head(model)(x if model.map_include_prefix else x[:, model.num_prefix_tokens :])


def _class_token_and_mean(x: jnp.ndarray, model: Any) -> jnp.ndarray:
  return jnp.concatenate([x[:, 0], _mean(x, model)], axis=-1)


CLASSIFIERS = {
    'token': _class_token,
    'gap': _mean,
    'map': _attention_pooling,
    'token_gap': _class_token_and_mean,
}
# The poolings that read the class token: a model with one of them has a class token by default.
CLASS_TOKEN_POOLINGS = ('token', 'token_gap')
