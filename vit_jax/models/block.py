"""The ViT's pre-LayerNorm transformer block and its MLP, as in the original checkpoints.

Stochastic depth (`drop_path`) drops each residual branch per sample at train time; the blocks' own
position embeddings (posemb.py) enter here when the model adds them at every layer.
"""

import functools
from typing import Any, Callable, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import differential, lora, norms, rope
from vit_jax.models.attention import ATTENTION_FNS, SelfAttention, token_padding
from vit_jax.models.fp8 import MATMULS
from vit_jax.models.lora import Spec as LoraSpec
from vit_jax.models.posemb import POSEMBS

Dtype = Any
# A block's stochastic-depth rate: a float, an array inside the scan, None for none.
Rate = Optional[Union[float, jax.Array]]


# The MLP's nonlinearity (`mlp_activation`): the original code and checkpoints use the tanh
# approximation of GELU; timm, Hugging Face and PyTorch models the exact one (erf); OpenAI's CLIP
# x * sigmoid(1.702 x); SwiGLU MLPs (`mlp_gated`: EVA-02's, DINOv2 giant's) x * sigmoid(x).
MLP_ACTIVATIONS: dict[str, Callable[[jnp.ndarray], jnp.ndarray]] = {
    'gelu_tanh': functools.partial(nn.gelu, approximate=True),
    'gelu': functools.partial(nn.gelu, approximate=False),
    'quick_gelu': lambda x: x * jax.nn.sigmoid(1.702 * x),  # OpenAI CLIP's.
    'silu': nn.silu,
}


def drop_path(x: jnp.ndarray, rate: Union[float, jax.Array], key: jax.Array) -> jnp.ndarray:
  """Stochastic depth (timm's DropPath): each sample's `x` is zeros with probability `rate`, else
  `x / (1 - rate)`, so its expectation is `x`."""
  keep = 1.0 - rate
  mask = jax.random.bernoulli(key, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
  return x * (mask / keep).astype(x.dtype)


class MlpBlock(nn.Module):
  """Dense -> activation -> dropout -> Dense -> dropout.

  `gated` (GLU; with activation 'silu' SwiGLU, EVA-02's): the activated `Dense_0` multiplies a
  second linear projection `Dense_linear` of the input (timm's `fc1_g` and `fc1_x`, or the two halves
  of its packed `fc1`); `norm`: a LayerNorm `norm` of the hidden units before `Dense_1` (EVA-02 B/L's
  scale_mlp, NormFormer's); `lora`: low-rank adapters of its layers (lora.py).
  """

  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  activation: str = 'gelu_tanh'  # A key of MLP_ACTIVATIONS.
  gated: bool = False
  norm: bool = False
  layernorm_epsilon: float = 1e-6
  norm_layer: str = 'layernorm'  # A key of norms.NORM_LAYERS: `norm`'s kind.
  matmul: str = 'default'  # A key of fp8.MATMULS: how its layers multiply.
  lora: Optional[LoraSpec] = None  # Low-rank adapters of the layers it targets (lora.py).

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    dense = lambda features, name, y: lora.adapted(
        self.lora,
        nn.Dense(
            features,
            dtype=self.dtype,
            dot_general=MATMULS[self.matmul],
            kernel_init=nn.initializers.xavier_uniform(),
            bias_init=nn.initializers.normal(stddev=1e-6),
            name=name,
        ),
        y,
        deterministic=deterministic,
    )
    x = MLP_ACTIVATIONS[self.activation](dense(self.mlp_dim, 'Dense_0', inputs))
    if self.gated:
      x = x * dense(self.mlp_dim, 'Dense_linear', inputs)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    if self.norm:
      x = norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'norm')(x)
    x = dense(inputs.shape[-1], 'Dense_1', x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm transformer block: x + MSA(LN(x)), then x + MLP(LN(x)) (`res_post_norm`: the
  norms after the branches; `parallel_block`: x + MSA(LN(x)) + MLP(LN(x)), both branches of one
  norm, ViT-22B's parallel layers, timm's ParallelScalingBlock, layer scale `ls1` of their sum).

  Submodule names are spelled out: they are the names in the original checkpoints (older Flax numbered
  submodules across types), and current Flax would number them per type. At train time each residual
  branch is dropped by `drop_path` at `drop_path_rate`, with keys from the 'dropout' stream.

  Position embeddings (posemb.py) of the block: `shared_posemb` [1, N, D] is added to its input
  ('shared_every_layer'); its own `posemb` of the patch grid `grid` is a kind added to its input
  ('every_layer', `posembed`) or 'relative', a bias of its attention logits (`relative_posemb`).
  With `layer_scale` each branch is multiplied by a learned per-channel scale before the residual add
  (`ls1` after the attention, `ls2` after the MLP: timm's `ls1.gamma`, `ls2.gamma`), initialised to
  it; `layer_scale_mlp=False` scales the attention's branch alone (timm's attn_only_layer_scale,
  Sapiens 2's). `num_kv_heads`: the attention's key and value heads (SelfAttention's).
  With `qk_norm` the queries and keys are each LayerNormed over a head's channels (`q_norm`, `k_norm`,
  shared by the heads; over each half of a head with `diff_attention`, as timm's DiffAttention)
  before their product: ViT-22B's stabiliser, timm's `qk_norm`; with `rope` the
  patches' ones are then rotated by their position (rope.py, of `rope_style`; RoPE-Mixed's learned
  frequencies are the block's `rope_freqs`).
  """

  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.
  matmul: str = 'default'  # A key of fp8.MATMULS: the projections' and the MLP's products.
  mlp_activation: str = 'gelu_tanh'  # A key of MLP_ACTIVATIONS.
  layer_scale: Optional[float] = None  # The initial value of `ls1` and `ls2`; None: no layer scale.
  layer_scale_mlp: bool = True  # False: no `ls2`, the MLP's branch unscaled.
  num_kv_heads: Optional[int] = None  # None: num_heads.
  diff_attention: bool = False  # SelfAttention's `differential`, of the call's `lambda_init`.
  layernorm_epsilon: float = 1e-6
  norm_layer: str = 'layernorm'  # A key of norms.NORM_LAYERS: every norm's kind.
  qk_norm: bool = False
  key_bias: bool = True  # False: the attention's keys have no bias (EVA's).
  attn_norm: bool = False  # SelfAttention's `out_norm`.
  mlp_gated: bool = False  # MlpBlock's `gated`.
  mlp_norm: bool = False  # MlpBlock's `norm`.
  # Each branch normalised after it, before the residual add: x + LN(MSA(x)), then x + LN(MLP(x))
  # (Swin V2's res-post-norm, timm's ResPostBlock and Eva's use_post_norm: EVA-02-CLIP-E's), the
  # norms of the same names.
  res_post_norm: bool = False
  parallel_block: bool = False  # The attention and the MLP side by side, of `LayerNorm_0`'s output.
  rope: bool = False  # Rotary embeddings of the patches' queries and keys (rope.py), over `grid`.
  rope_grid: Optional[tuple[int, int]] = None  # rope.tables' `ref_grid`.
  rope_style: str = 'eva02'  # A key of rope.STYLES.
  posemb: Optional[str] = None  # A key of POSEMBS: this block's own position embedding, or None.
  grid: Optional[tuple[int, int]] = None  # The patch grid (rows, columns), for `posemb`.
  # Where the encoder padded the tokens for the fused attention kernel: how many are real (the rest
  # are masked out of the keys). None: the block pads its attention's input itself where it must.
  tokens: Optional[int] = None
  lora: Optional[LoraSpec] = None  # Low-rank adapters of the projections and MLPs (lora.py).

  # Arguments are positional: `nn.remat` needs `deterministic` (and a float rate) as static positions.
  # `lambda_init`: differential attention's, of the block's index (a float32, or the scanned block's).
  @nn.compact
  def __call__(
      self,
      inputs: jnp.ndarray,
      deterministic: bool,
      drop_path_rate: Rate = None,
      shared_posemb: Optional[jnp.ndarray] = None,
      lambda_init: Rate = None,
  ) -> jnp.ndarray:
    if shared_posemb is not None:
      inputs = inputs + shared_posemb.astype(inputs.dtype)
    given = inputs.shape[1]
    real = self.tokens or given
    attention_fn = ATTENTION_FNS[self.attention]
    if self.posemb == 'relative':
      bias = POSEMBS['relative'](self.num_heads, name='relative_posemb')(real, self.grid)
      attention_fn = functools.partial(attention_fn, bias=bias.astype(self.dtype))
    elif self.posemb is not None:
      embedded = POSEMBS[self.posemb](name='posembed')(inputs[:, :real], self.grid)
      inputs = jnp.concatenate([embedded, inputs[:, real:]], axis=1)
    norm_0, norm_2 = (
        norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, name)
        for name in ('LayerNorm_0', 'LayerNorm_2')
    )
    normed = x = inputs if self.res_post_norm else norm_0(inputs)
    padding = 0 if self.tokens else token_padding(self.attention, given, self.dtype)
    if padding:  # For the fused kernel, where the encoder did not pad (Axial-ViT's rows, columns).
      x = jnp.pad(x, ((0, 0), (0, padding), (0, 0)))
    if real < x.shape[1]:  # The padded tokens are masked out of the keys (and cut off below).
      attention_fn = functools.partial(attention_fn, tokens=real)
    x = SelfAttention(
        num_heads=self.num_heads,
        attention_fn=attention_fn,
        dtype=self.dtype,
        dropout_rate=self.attention_dropout_rate,
        key_bias=self.key_bias,
        matmul=self.matmul,
        out_norm=self.attn_norm,
        layernorm_epsilon=self.layernorm_epsilon,
        norm_layer=self.norm_layer,
        num_kv_heads=self.num_kv_heads,
        differential=self.diff_attention,
        lora=self.lora,
        name='MultiHeadDotProductAttention_1',
    )(
        x,
        deterministic=deterministic,
        lambda_init=lambda_init,
        transform_qk=self._transform_qk(real, inputs.shape[-1]),
        # The weights land in 'intermediates' only when it is mutable (the pictures tool asks).
        sow_weights=self.attention == 'xla',
    )[
        :, :given
    ]
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    if self.parallel_block:
      x = x + self._mlp(normed, deterministic)
      return inputs + self._drop_path(self._scale('ls1', x), drop_path_rate, deterministic)
    if self.res_post_norm:
      x = norm_0(x)
    x = self._drop_path(self._scale('ls1', x), drop_path_rate, deterministic) + inputs
    y = self._mlp(x if self.res_post_norm else norm_2(x), deterministic)
    if self.res_post_norm:
      y = norm_2(y)
    if self.layer_scale_mlp:
      y = self._scale('ls2', y)
    return x + self._drop_path(y, drop_path_rate, deterministic)

  def _mlp(self, y: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    return MlpBlock(
        self.mlp_dim,
        self.dropout_rate,
        self.dtype,
        self.mlp_activation,
        gated=self.mlp_gated,
        norm=self.mlp_norm,
        layernorm_epsilon=self.layernorm_epsilon,
        norm_layer=self.norm_layer,
        matmul=self.matmul,
        lora=self.lora,
        name='MlpBlock_3',
    )(y, deterministic=deterministic)

  def _transform_qk(self, real: int, width: int) -> Optional[Callable[..., Any]]:
    """The queries' and keys' change before their product: LayerNorms (`qk_norm`), then the rotary
    embeddings of the patches, the last h * w of the `real` tokens (timm's order); None for none.
    `width`: the tokens' channels, `num_heads` heads' worth."""
    if not (self.qk_norm or self.rope):
      return None
    qk_norms = None
    if self.qk_norm:  # Created here, so that they sit in this block's scope: `{q,k}_norm`.
      qk_norms = tuple(
          norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, name)
          for name in ('q_norm', 'k_norm')
      )
    if self.rope:
      head_dim, init = width // self.num_heads, rope.STYLES[self.rope_style].init
      frequencies = None
      if init is not None:  # Learned per head (RoPE-Mixed's): this block's own, in float32.
        frequencies = self.param(
            'rope_freqs', init, (2, self.num_heads, head_dim // 2), jnp.float32
        )
      sin, cos = rope.tables(self.grid, head_dim, self.rope_grid, self.rope_style, frequencies)
      start = real - self.grid[0] * self.grid[1]

    def transform(query: jnp.ndarray, key: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
      if qk_norms is not None and self.diff_attention:  # Each half of a head, as timm's.
        query, key = (differential.halves_normed(n, t) for n, t in zip(qk_norms, (query, key)))
      elif qk_norms is not None:
        query, key = qk_norms[0](query), qk_norms[1](key)
      if self.rope:
        query, key = (rope.apply(t, sin, cos, start, self.rope_style) for t in (query, key))
      return query, key

    return transform

  def _scale(self, name: str, branch: jnp.ndarray) -> jnp.ndarray:
    if self.layer_scale is None:
      return branch
    gamma = self.param(
        name, nn.initializers.constant(self.layer_scale), branch.shape[-1:], jnp.float32
    )
    return branch * gamma.astype(branch.dtype)

  def _drop_path(self, branch: jnp.ndarray, rate: Rate, deterministic: bool) -> jnp.ndarray:
    # A rate known to be zero draws no key: a model without stochastic depth needs no 'dropout' rng.
    if deterministic or rate is None or (isinstance(rate, float) and rate == 0.0):
      return branch
    return drop_path(branch, rate, self.make_rng('dropout'))
