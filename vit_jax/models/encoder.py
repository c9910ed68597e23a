"""The transformer encoder of the ViT: position embeddings, pre-LayerNorm blocks, final LayerNorm.

Fast paths (none changes the parameter tree): `attention` picks the attention kernel (attention.py);
`remat=POLICY` recomputes each block's activations in the backward pass except what the
`jax.checkpoint_policies` policy saves; `scan=True` compiles one block and loops over `nn.scan`, so
compile time does not grow with depth. Stochastic depth (`drop_path_rate`) drops each block's residual
branches per sample at train time; it has no parameters either.

A scanned encoder reads its blocks stacked (scan_layout.py). `init` still returns the per-block tree of
the checkpoints, and `apply` takes either layout: per-block parameters are stacked inside the program,
which is cheap to run but not to compile (the gradient of the stacking is one slice per layer and
parameter), so training keeps them stacked (`stack_blocks`) and unstacks at the checkpoint boundary.
"""
import contextvars
import functools
from typing import Any, Callable, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models.attention import ATTENTION_FNS
from vit_jax.models.posemb import POSEMBS, TENSOR_RULES as POSEMB_TENSOR_RULES
from vit_jax.models.scan_layout import BLOCK, stack_blocks, unstack_blocks

Dtype = Any
# A block's stochastic-depth rate: a float, an array inside the scan, None for none.
Rate = Optional[Union[float, jax.Array]]
# The sharding of a [batch, tokens, D] activation while a step over a mesh is traced (set by
# sharding.with_activation_sharding); None elsewhere (init, export, the tools): see ScanBlock.
ACTIVATION_SHARDING: contextvars.ContextVar[Optional[jax.sharding.Sharding]] = contextvars.ContextVar(
    'activation_sharding', default=None)
# The MLP's nonlinearity (`mlp_activation`): the original code and checkpoints use the tanh
# approximation of GELU; timm, Hugging Face and PyTorch models the exact one (erf).
MLP_ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'gelu': functools.partial(nn.gelu, approximate=False),
}


def drop_path_rates(rate: float, num_layers: int) -> np.ndarray:
  """The stochastic-depth rate of each block: from 0 in the first to `rate` in the last, linearly
  (timm's `linspace(0, rate, depth)`)."""
  return np.linspace(0.0, rate, num_layers)


def drop_path(x: jnp.ndarray, rate: Union[float, jax.Array], key: jax.Array) -> jnp.ndarray:
  """Stochastic depth (timm's DropPath): each sample's `x` is zeros with probability `rate`, else
  `x / (1 - rate)`, so its expectation is `x`."""
  keep = 1.0 - rate
  mask = jax.random.bernoulli(key, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return x * (mask / keep).astype(x.dtype)


class MlpBlock(nn.Module):
  """Dense -> GELU -> dropout -> Dense -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  activation: str = 'gelu_tanh'  # A key of MLP_ACTIVATIONS.

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6), name=name)
    x = dense(self.mlp_dim, 'Dense_0')(inputs)
    x = MLP_ACTIVATIONS[self.activation](x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = dense(inputs.shape[-1], 'Dense_1')(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Submodule names are spelled out: they are the names in the original checkpoints (older Flax numbered
  submodules across types), and current Flax would number them per type. At train time each residual
  branch is dropped by `drop_path` at `drop_path_rate`, with keys from the 'dropout' stream.

  Position embeddings (posemb.py) of the block: `shared_posemb` [1, N, D] is added to its input
  ('shared_every_layer'); its own `posemb` of the patch grid `grid` is a kind added to its input
  ('every_layer', `posembed`) or 'relative', a bias of its attention logits (`relative_posemb`).
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.
  mlp_activation: str = 'gelu_tanh'  # A key of MLP_ACTIVATIONS.
  posemb: Optional[str] = None  # A key of POSEMBS: this block's own position embedding, or None.
  grid: Optional[tuple[int, int]] = None  # The patch grid (rows, columns), for `posemb`.

  # Arguments are positional: `nn.remat` needs `deterministic` (and a float rate) as static positions.
  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool, drop_path_rate: Rate = None,
               shared_posemb: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    if shared_posemb is not None:
      inputs = inputs + shared_posemb.astype(inputs.dtype)
    attention_fn = ATTENTION_FNS[self.attention]
    if self.posemb == 'relative':
      bias = POSEMBS['relative'](self.num_heads, name='relative_posemb')(inputs.shape[1], self.grid)
      attention_fn = functools.partial(attention_fn, bias=bias.astype(self.dtype))
    elif self.posemb is not None:
      inputs = POSEMBS[self.posemb](name='posembed')(inputs, self.grid)
    x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        dropout_rate=self.attention_dropout_rate, deterministic=deterministic,
        attention_fn=attention_fn, name='MultiHeadDotProductAttention_1')(
            # The weights land in 'intermediates' only when it is mutable (the pictures tool asks).
            x, x, sow_weights=self.attention == 'xla')
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = self._drop_path(x, drop_path_rate, deterministic) + inputs
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, self.mlp_activation, name='MlpBlock_3')(
        y, deterministic=deterministic)
    return x + self._drop_path(y, drop_path_rate, deterministic)

  def _drop_path(self, branch: jnp.ndarray, rate: Rate, deterministic: bool) -> jnp.ndarray:
    # A rate known to be zero draws no key: a model without stochastic depth needs no 'dropout' rng.
    if deterministic or rate is None or (isinstance(rate, float) and rate == 0.0):
      return branch
    return drop_path(branch, rate, self.make_rng('dropout'))


# Tensor parallelism (Megatron style): (regex over the '/'-joined parameter path, the dimension split over
# the mesh axis `tensor`) for the attention heads and MLP units of `Encoder1DBlock` and of the MAP head
# (pooling.py, `MAPHead_0/{MultiHeadDotProductAttention_0, MlpBlock_0}`), and the blocks' relative
# position biases (posemb.py). Paths of optimizer-state leaves end with the parameter path, so the same
# rules serve them.
TENSOR_RULES = (
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$', 1),  # (D, heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/bias$', 0),  # (heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/out/kernel$', 0),  # (heads, D/heads, D)
    (r'MlpBlock_\d+/Dense_0/kernel$', 1),  # (D, mlp)
    (r'MlpBlock_\d+/Dense_0/bias$', 0),  # (mlp,)
    (r'MlpBlock_\d+/Dense_1/kernel$', 0),  # (mlp, D)
) + POSEMB_TENSOR_RULES


class ScanBlock(Encoder1DBlock):
  """A block as an `nn.scan` body: (carry, deterministic, this layer's rate) -> (carry, no output).

  Its input is constrained to stay split over the batch (ACTIVATION_SHARDING, when set): XLA's
  sharding propagation into the scan's loop otherwise follows the fsdp-split parameters and has every
  device compute the whole global batch (8x the memory and FLOPs on 8 devices).
  """

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool, drop_path_rate: Rate = None,
               shared_posemb: Optional[jnp.ndarray] = None) -> tuple[jnp.ndarray, None]:
    if (activation_sharding := ACTIVATION_SHARDING.get()) is not None:
      inputs = jax.lax.with_sharding_constraint(inputs, activation_sharding)
    return super().__call__(inputs, deterministic, drop_path_rate, shared_posemb), None


class ScannedBlocks(nn.Module):
  """`num_layers` blocks as one `nn.scan`: parameters stacked under `encoderblock` (layer axis first)."""
  num_layers: int
  block_kwargs: dict[str, Any]
  remat: Optional[str] = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool, rates: Optional[jax.Array],
               shared_posemb: Optional[jnp.ndarray]) -> jnp.ndarray:
    """`rates`: each layer's stochastic-depth rate (scanned over), or None for none; `shared_posemb`:
    the position embeddings every block adds to its input, or None."""
    block = ScanBlock
    if self.remat:
      # prevent_cse=False: scan already keeps XLA from merging the recomputation into the forward pass.
      block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat), prevent_cse=False,
                       static_argnums=(2,))
    # Each layer gets its own initialisation and dropout keys (split, not broadcast).
    x, _ = nn.scan(block, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                   in_axes=(nn.broadcast, 0, nn.broadcast), length=self.num_layers)(
                       **self.block_kwargs, name=BLOCK)(x, deterministic, rates, shared_posemb)
    return x


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
  remat: Optional[str] = None
  scan: bool = False
  posemb: str = 'learn'
  posemb_where: str = 'input'
  drop_path_rate: float = 0.0
  final_norm: bool = True
  mlp_activation: str = 'gelu_tanh'

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, grid: tuple[int, int], train: bool) -> jnp.ndarray:
    """Tokens [b, prefix + h * w, D] of the patch grid `grid` = (h, w) -> encoded tokens, same shape."""
    kind, where, shared = self.posemb, self.posemb_where, None
    if where == 'input' and kind != 'relative':  # Relative ones enter each block's attention.
      x = POSEMBS[kind](name='posembed_input')(x, grid)
    elif where == 'shared_every_layer':
      # The embeddings themselves (added to zeros), made once: every block adds them to its input.
      shared = POSEMBS[kind](name='posembed_input')(jnp.zeros((1,) + x.shape[1:], jnp.float32), grid)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block_kwargs = dict(
        mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        attention=self.attention, mlp_activation=self.mlp_activation, grid=grid,
        posemb=kind if kind == 'relative' or where == 'every_layer' else None)
    rates = drop_path_rates(self.drop_path_rate, self.num_layers)
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
      x = blocks(x, not train, jnp.asarray(rates, jnp.float32) if self.drop_path_rate else None, shared)
    else:
      block = Encoder1DBlock
      if self.remat:
        block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat),
                         static_argnums=(2, 3))  # deterministic, drop_path_rate (self is 0).
      for i in range(self.num_layers):
        x = block(**block_kwargs, name=f'{BLOCK}_{i}')(x, not train, float(rates[i]), shared)
    if not self.final_norm:
      return x
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='encoder_norm')(x)
