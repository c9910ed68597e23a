"""The transformer encoder of the ViT: position embeddings, blocks, final LayerNorm.

The blocks (`block`, registry BLOCKS) are the ViT's pre-LayerNorm blocks (block.py) or Axial-ViT's
row-then-column pairs of them (axial.py).

Fast paths (none changes the parameter tree): `attention` picks the attention kernel (attention.py);
`matmul` how the blocks' projections and MLPs multiply (fp8.py: 'fp8' for FP8 tensor cores);
`remat=POLICY` recomputes each block's activations in the backward pass except what the
`jax.checkpoint_policies` policy saves; `scan=True` compiles one block and loops over `nn.scan`
(scanned.py), so compile time does not grow with depth. Stochastic depth (`drop_path_rate`) drops each
block's residual branches per sample at train time; it has no parameters either.

A scanned encoder reads its blocks stacked (scan_layout.py). `init` still returns the per-block tree of
the checkpoints, and `apply` takes either layout: per-block parameters are stacked inside the program,
which is cheap to run but not to compile (the gradient of the stacking is one slice per layer and
parameter), so training keeps them stacked (`stack_blocks`) and unstacks at the checkpoint boundary.
"""

from typing import Any, Mapping, Optional, Sequence, Union

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import differential, norms, scanned
from vit_jax.models.attention import token_padding
from vit_jax.models.axial import AxialBlock
from vit_jax.models.block import Dtype, Encoder1DBlock
from vit_jax.models.lora import Spec as LoraSpec
from vit_jax.models.posemb import POSEMBS, TENSOR_RULES as POSEMB_TENSOR_RULES
from vit_jax.models.scan_layout import BLOCK, stack_blocks, unstack_blocks

# model.block: what each of the encoder's `num_layers` blocks is.
BLOCKS = {'standard': Encoder1DBlock, 'axial': AxialBlock}


def keep_refused_by(model: Mapping[str, Any]) -> Optional[str]:
  """The first of the model fields posemb_where, posemb, rope and block whose value leaves a kept
  patch (the Encoder's `keep`: a masked autoencoder's, patch dropout's) no way to say where it was,
  or that needs the whole grid; None where none does."""
  refused = {
      'posemb_where': model['posemb_where'] != 'input',
      'posemb': model['posemb'] == 'relative',
      'rope': bool(model['rope']),
      'block': model['block'] != 'standard',
  }
  return next((field for field, refuses in refused.items() if refuses), None)


def drop_path_rates(rate: float, num_layers: int) -> np.ndarray:
  """The stochastic-depth rate of each block: from 0 in the first to `rate` in the last, linearly
  (timm's `linspace(0, rate, depth)`)."""
  return np.linspace(0.0, rate, num_layers)


def blocks_kv_heads(
    num_kv_heads: Optional[Union[int, Sequence[int]]], num_layers: int
) -> tuple[Optional[int], ...]:
  """Each block's key and value heads (None: its query heads) of model.num_kv_heads: unset, one
  number for all, or one per block."""
  if num_kv_heads is None or isinstance(num_kv_heads, int):
    return (num_kv_heads,) * num_layers
  if len(num_kv_heads) != num_layers:
    raise ValueError(f'num_kv_heads={tuple(num_kv_heads)} must have one number per block')
  return tuple(num_kv_heads)


# Tensor parallelism (Megatron style): (regex over the '/'-joined parameter path, the dimension split over
# the mesh axis `tensor`) for the attention heads and MLP units of `Encoder1DBlock` and of the MAP head
# (pooling.py, `MAPHead_0/{MultiHeadDotProductAttention_0, MlpBlock_0}`), and the blocks' relative
# position biases (posemb.py). Paths of optimizer-state leaves end with the parameter path, so the same
# rules serve them.
TENSOR_RULES = (
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$', 1),  # (D, heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/bias$', 0),  # (heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/out/kernel$', 0),  # (heads, D/heads, D)
    (r'MlpBlock_\d+/Dense_(0|linear)/kernel$', 1),  # (D, mlp)
    (r'MlpBlock_\d+/Dense_(0|linear)/bias$', 0),  # (mlp,)
    (r'MlpBlock_\d+/norm/(scale|bias)$', 0),  # (mlp,)
    (r'MlpBlock_\d+/Dense_1/kernel$', 0),  # (mlp, D)
    # Low-rank adapters (lora.py): split where the kernels they update are.
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)_lora/b$', 1),  # (rank, heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/out_lora/a$', 0),  # (heads, D/heads, rank)
    (r'MlpBlock_\d+/Dense_(0|linear)_lora/b$', 1),  # (rank, mlp)
    (r'MlpBlock_\d+/Dense_1_lora/a$', 0),  # (mlp, rank)
) + POSEMB_TENSOR_RULES


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and a final LayerNorm (`final_norm`).

  `posemb` is a key of `POSEMBS`, `posemb_where` of `POSEMB_WHERE` (posemb.py); `drop_path_rate` is
  the stochastic-depth rate of the last block (see `drop_path_rates`); `final_norm=False` leaves the
  normalisation to the model (after pooling, timm's `fc_norm`). `remat` names a
  `jax.checkpoint_policies` policy to rematerialise each block with (None: off); `scan` runs the blocks
  as one `nn.scan`; it initialises per-block parameters and applies with either layout (see the module
  docstring).
  """

  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'
  matmul: str = 'default'
  remat: Optional[str] = None
  scan: bool = False
  posemb: str = 'learn'
  posemb_where: str = 'input'
  drop_path_rate: float = 0.0
  final_norm: bool = True
  mlp_activation: str = 'gelu_tanh'
  layer_scale: Optional[float] = None
  layer_scale_mlp: bool = True
  # The attention's key and value heads: None (num_heads), one number, or each block's (Sapiens 2's
  # grouped-query attention in its middle blocks alone; scan=False, its blocks are not alike).
  num_kv_heads: Optional[Union[int, Sequence[int]]] = None
  layernorm_epsilon: float = 1e-6
  norm_layer: str = 'layernorm'  # A key of norms.NORM_LAYERS.
  qk_norm: bool = False
  key_bias: bool = True
  attn_norm: bool = False
  mlp_gated: bool = False
  mlp_norm: bool = False
  res_post_norm: bool = False
  parallel_block: bool = False
  diff_attention: bool = False  # Its blocks' indices set their lambda_init (differential.py).
  rope: bool = False
  rope_grid: Optional[tuple[int, int]] = None
  rope_style: str = 'eva02'
  pre_norm: bool = False  # A LayerNorm `pre_norm` before the first block (CLIP's).
  block: str = 'standard'  # A key of BLOCKS.
  lora: Optional[LoraSpec] = None  # Low-rank adapters of the blocks' layers (lora.py).

  @nn.compact
  def __call__(
      self,
      x: jnp.ndarray,
      *,
      grid: tuple[int, int],
      train: bool,
      keep: Optional[jnp.ndarray] = None,
  ) -> jnp.ndarray:
    """Tokens [b, prefix + h * w, D] of the patch grid `grid` = (h, w) -> encoded tokens, same shape.

    `keep` [b, k]: the indices of the patches that go on into the blocks once they have their position
    embeddings (a masked autoencoder's visible patches; the prefix tokens always go on): the encoded
    tokens are then [b, prefix + k, D]. Only position embeddings added at the input say where a
    kept patch was, so the other kinds, RoPE and axial blocks (which need the whole grid) refuse it.
    """
    kind, where, shared = self.posemb, self.posemb_where, None
    fields = dict(posemb_where=where, posemb=kind, rope=self.rope, block=self.block)
    if keep is not None and keep_refused_by(fields):
      raise ValueError(
          'masking patches needs position embeddings added at the input (posemb_where=input, not '
          'relative ones), no RoPE and standard blocks'
      )
    if where == 'input' and kind != 'relative':  # Relative ones enter each block's attention.
      x = POSEMBS[kind](name='posembed_input')(x, grid)
    elif where == 'shared_every_layer':
      # The embeddings themselves (added to zeros), made once: every block adds them to its input.
      shared = POSEMBS[kind](name='posembed_input')(
          jnp.zeros((1,) + x.shape[1:], jnp.float32), grid
      )
    if keep is not None:
      prefix = x.shape[1] - grid[0] * grid[1]
      chex.assert_shape(keep, (x.shape[0], None))
      patches = jnp.take_along_axis(x[:, prefix:], keep[..., None], axis=1)
      x = jnp.concatenate([x[:, :prefix], patches], axis=1)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    if self.pre_norm:
      x = norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'pre_norm')(x)
    block_kwargs = dict(
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype,
        attention=self.attention,
        matmul=self.matmul,
        mlp_activation=self.mlp_activation,
        layer_scale=self.layer_scale,
        layer_scale_mlp=self.layer_scale_mlp,
        layernorm_epsilon=self.layernorm_epsilon,
        norm_layer=self.norm_layer,
        qk_norm=self.qk_norm,
        key_bias=self.key_bias,
        attn_norm=self.attn_norm,
        mlp_gated=self.mlp_gated,
        mlp_norm=self.mlp_norm,
        res_post_norm=self.res_post_norm,
        parallel_block=self.parallel_block,
        diff_attention=self.diff_attention,
        rope=self.rope,
        rope_grid=self.rope_grid,
        rope_style=self.rope_style,
        grid=grid,
        lora=self.lora,
        posemb=kind if kind == 'relative' or where == 'every_layer' else None,
    )
    tokens = x.shape[1]
    # The fused attention kernel's token multiple, padded once here rather than in every block
    # (axial blocks attend over rows and columns of the grid: they pad their own).
    padding = token_padding(self.attention, tokens, self.dtype) if self.block == 'standard' else 0
    if padding:
      x = jnp.pad(x, ((0, 0), (0, padding), (0, 0)))
      shared = None if shared is None else jnp.pad(shared, ((0, 0), (0, padding), (0, 0)))
      block_kwargs['tokens'] = tokens
    rates = drop_path_rates(self.drop_path_rate, self.num_layers)
    kv_heads = blocks_kv_heads(self.num_kv_heads, self.num_layers)
    lambda_inits = None
    if self.diff_attention:
      lambda_inits = [differential.lambda_init(i) for i in range(self.num_layers)]
    if self.scan:
      if len(set(kv_heads)) > 1:
        raise ValueError('scanned blocks must be alike: not of other key heads')
      block_kwargs['num_kv_heads'] = kv_heads[0]
      # The scanned blocks read stacked parameters; per-block ones (from checkpoints) are stacked on
      # the way in, and `init` unstacks what the scan creates, so the stored tree is per-block.
      blocks = nn.map_variables(
          scanned.ScannedBlocks,
          'params',
          init=True,
          trans_in_fn=lambda v: {**v, 'params': stack_blocks(v.get('params', {}), self.num_layers)},
          trans_out_fn=lambda v: {**v, 'params': unstack_blocks(v.get('params', {}))},
      )(num_layers=self.num_layers, block_kwargs=block_kwargs, remat=self.remat)
      # The blocks live in this module's scope, so their parameters sit at Transformer/encoderblock_{i}
      # (or Transformer/encoderblock) as in the checkpoints, not one level down.
      nn.share_scope(self, blocks)
      x = blocks(
          x,
          not train,
          jnp.asarray(rates, jnp.float32) if self.drop_path_rate else None,
          shared,
          None if lambda_inits is None else jnp.asarray(lambda_inits),
      )
    else:
      block = BLOCKS[self.block]
      if self.remat:
        block = nn.remat(
            block, policy=getattr(jax.checkpoint_policies, self.remat), static_argnums=(2, 3)
        )  # deterministic, drop_path_rate (self is 0).
      for i in range(self.num_layers):
        differential_args = () if lambda_inits is None else (lambda_inits[i],)
        x = block(**block_kwargs, num_kv_heads=kv_heads[i], name=f'{BLOCK}_{i}')(
            x, not train, float(rates[i]), shared, *differential_args
        )
    x = x[:, :tokens]
    if not self.final_norm:
      return x
    return norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'encoder_norm')(x)
