"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021).

Module and parameter names follow the original `vit_jax` code, so the parameter tree is the tree of the
published `.npz` checkpoints (ViT-B_16.npz, the AugReg files) and they load without renaming.

Fast paths (model fields; none changes the parameter tree): `attention='dot_product_attention'` computes
attention with `jax.nn.dot_product_attention` (cuDNN flash attention on GPU, XLA elsewhere); `remat=POLICY`
recomputes each block's activations in the backward pass except what the `jax.checkpoint_policies` policy
saves; `scan=True` compiles one block and loops over `nn.scan`, so compile time does not grow with depth.

A scanned encoder reads its blocks stacked (`Transformer/encoderblock/...`, layer axis first). `init`
still returns the per-block tree of the checkpoints, and `apply` takes either layout: per-block
parameters are stacked inside the program, which is cheap to run but not to compile (the gradient of the
stacking is one slice per layer and parameter), so training keeps them stacked (`stack_blocks`) and
unstacks at the checkpoint boundary (`unstack_blocks`).
"""
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import resnet

Dtype = Any
BLOCK = 'encoderblock'  # Blocks are `encoderblock_{i}` in the checkpoints, `encoderblock` when stacked.


def _holds(node: Any, key: str) -> bool:
  return isinstance(node, Mapping) and key in node


def stack_blocks(tree: Any, num_layers: int) -> Any:
  """Per-block layout -> scan layout, wherever `tree` holds encoder blocks; the rest is unchanged.

  In every mapping with `encoderblock_0 .. encoderblock_{num_layers-1}`, they become one `encoderblock`
  whose arrays have a leading layer axis. `tree` may be parameters, an optimizer state (its moments are
  parameter-shaped) or a whole train state, or their shapes under `jax.eval_shape`; a tree already
  stacked is returned as it is. Under `jax.jit`, `out_shardings` places the result.
  """
  names = [f'{BLOCK}_{i}' for i in range(num_layers)]

  def stack(node):
    if not _holds(node, names[0]):
      return node
    found = sorted(k for k in node if k.startswith(f'{BLOCK}_'))
    if found != sorted(names):
      raise ValueError(f'expected encoder blocks {names[0]}..{names[-1]}, got {", ".join(found)}')
    rest = {k: v for k, v in node.items() if k not in names}
    return {**rest, BLOCK: jax.tree.map(lambda *xs: jnp.stack(xs), *[node[k] for k in names])}

  return jax.tree.map(stack, tree, is_leaf=lambda node: _holds(node, names[0]))


def unstack_blocks(tree: Any) -> Any:
  """Scan layout -> per-block layout (the inverse of `stack_blocks`); per-block trees are unchanged."""

  def unstack(node):
    if not _holds(node, BLOCK):
      return node
    rest = {k: v for k, v in node.items() if k != BLOCK}
    num_layers = jax.tree.leaves(node[BLOCK])[0].shape[0]
    return {**rest, **{f'{BLOCK}_{i}': jax.tree.map(lambda x, i=i: x[i], node[BLOCK])
                       for i in range(num_layers)}}

  return jax.tree.map(unstack, tree, is_leaf=lambda node: _holds(node, BLOCK))


def fused_attention(query: jnp.ndarray, key: jnp.ndarray, value: jnp.ndarray, *,
                    dropout_rate: float = 0.0, deterministic: bool = True) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` as an `attention_fn` of `nn.MultiHeadDotProductAttention`.

  Both take [batch, tokens, heads, head_dim]; JAX picks cuDNN flash attention on GPU (for bfloat16 and
  float16) and XLA elsewhere. The fused kernel has no dropout on the attention weights.
  """
  if dropout_rate > 0.0 and not deterministic:
    raise ValueError(f"attention='dot_product_attention' has no dropout on the attention weights "
                     f'(attention_dropout_rate={dropout_rate}): set it to 0 or use attention=\'xla\'')
  return jax.nn.dot_product_attention(query, key, value)


def head_major_attention(query: jnp.ndarray, key: jnp.ndarray, value: jnp.ndarray, *,
                         dropout_rng: Optional[jax.Array] = None, dropout_rate: float = 0.0,
                         deterministic: bool = True, precision: Any = None,
                         module: Optional[nn.Module] = None) -> jnp.ndarray:
  """`nn.dot_product_attention` with the heads moved in front of the tokens for the two matmuls.

  Takes and returns [batch, tokens, heads, head_dim] like it, with the same dropout masks; its batched
  matmuls have their batch dimensions leading, which XLA:CPU runs several times faster (flax's
  `...qhd,...khd` layout makes the forward pass of a ViT-Ti 1.8x slower on CPU). Like flax, it sows
  the weights into `intermediates` when the attention module is called with `sow_weights=True`.
  """
  query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
  query, key, value = (jnp.swapaxes(x, -3, -2) for x in (query, key, value))
  weights = jax.nn.softmax(jnp.einsum('...qd,...kd->...qk', query, key, precision=precision))
  if module is not None:
    module.sow('intermediates', 'attention_weights', weights)
  if not deterministic and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    keep = jax.random.bernoulli(dropout_rng, keep_prob, weights.shape)
    weights = weights * (keep.astype(weights.dtype) / jnp.asarray(keep_prob, weights.dtype))
  return jnp.swapaxes(jnp.einsum('...qk,...kd->...qd', weights, value, precision=precision), -3, -2)


ATTENTION_FNS = {'xla': head_major_attention, 'dot_product_attention': fused_attention}


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
  attention: str = 'xla'  # A key of ATTENTION_FNS.

  # `deterministic` may be positional: `nn.remat` needs it as a static positional argument.
  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        dropout_rate=self.attention_dropout_rate, deterministic=deterministic,
        attention_fn=ATTENTION_FNS[self.attention], name='MultiHeadDotProductAttention_1')(x, x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = x + inputs
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name='MlpBlock_3')(
        y, deterministic=deterministic)
    return x + y


class ScanBlock(Encoder1DBlock):
  """A block as an `nn.scan` body: (carry, deterministic) -> (carry, no output)."""

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool) -> tuple[jnp.ndarray, None]:
    return super().__call__(inputs, deterministic), None


class ScannedBlocks(nn.Module):
  """`num_layers` blocks as one `nn.scan`: parameters stacked under `encoderblock` (layer axis first)."""
  num_layers: int
  block_kwargs: dict[str, Any]
  remat: Optional[str] = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    block = ScanBlock
    if self.remat:
      # prevent_cse=False: scan already keeps XLA from merging the recomputation into the forward pass.
      block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat), prevent_cse=False,
                       static_argnums=(2,))
    # Each layer gets its own initialisation and dropout keys (split, not broadcast).
    x, _ = nn.scan(block, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                   in_axes=nn.broadcast, length=self.num_layers)(
                       **self.block_kwargs, name=BLOCK)(x, deterministic)
    return x


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and a final LayerNorm.

  `remat` names a `jax.checkpoint_policies` policy to rematerialise each block with (None: off); `scan`
  runs the blocks as one `nn.scan`; it initialises per-block parameters and applies with either layout
  (see the module docstring).
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'
  remat: Optional[str] = None
  scan: bool = False

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    x = AddPositionEmbs(name='posembed_input')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block_kwargs = dict(
        mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        attention=self.attention)
    if self.scan:
      # The scanned blocks read stacked parameters; per-block ones (from checkpoints) are stacked on
      # the way in, and `init` unstacks what the scan creates, so the stored tree is per-block.
      blocks = nn.map_variables(
          ScannedBlocks, 'params', init=True,
          trans_in_fn=lambda v: {**v, 'params': stack_blocks(v.get('params', {}), self.num_layers)},
          trans_out_fn=lambda v: {**v, 'params': unstack_blocks(v.get('params', {}))})(
              num_layers=self.num_layers, block_kwargs=block_kwargs, remat=self.remat)
      # The blocks live in this module's scope, so their parameters sit at Transformer/encoderblock_{i}
      # (or Transformer/encoderblock) as in the checkpoints, not one level down.
      nn.share_scope(self, blocks)
      x = blocks(x, not train)
    else:
      block = Encoder1DBlock
      if self.remat:
        block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat),
                         static_argnums=(2,))  # deterministic (self is 0).
      for i in range(self.num_layers):
        x = block(**block_kwargs, name=f'{BLOCK}_{i}')(x, not train)
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
  attention: str = 'xla'  # 'xla' | 'dot_product_attention'
  remat: Optional[str] = None  # A jax.checkpoint_policies name, e.g. 'nothing_saveable'; None: off.
  scan: bool = False
  # The R50+ViT hybrid: units per stage of a ResNet-v2 stem before the patch embedding (None: pure ViT).
  resnet_layers: Optional[tuple[int, ...]] = None
  resnet_width_factor: float = 1.0

  @nn.compact
  def __call__(self, images: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    x = images.astype(self.dtype)
    if self.resnet_layers:
      x = resnet.resnet_stem(x, num_layers=self.resnet_layers, width_factor=self.resnet_width_factor,
                             dtype=self.dtype)
    p = self.patch_size
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                name='embedding')(x)
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
        dtype=self.dtype, attention=self.attention, remat=self.remat, scan=self.scan,
        name='Transformer')(x, train=train)
    x = x[:, 0] if self.classifier == 'token' else jnp.mean(x, axis=1)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    if self.num_classes is None:
      return x.astype(jnp.float32)
    # Zero-initialised head: the fine-tuning recipe of the paper, and harmless for pretraining.
    x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                 name='head')(x)
    return x.astype(jnp.float32)
