"""The blocks' self-attention layer and the attention kernels a ViT can use (`model.attention`); no
kernel changes the parameter tree.

`ATTENTION_FNS` is the one registry of the kernels' names: the encoder dispatches on it and the model
config (`variants.get_model_config`) validates `model.attention` against its keys.
"""

import re
from typing import Any, Callable, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from vit_jax.models import differential, lora, norms
from vit_jax.models.fp8 import MATMULS
from vit_jax.models.lora import Spec as LoraSpec

CUDNN_TOKEN_MULTIPLE = 8  # cuDNN's flash attention trains on token counts that are multiples of 8.


def fused_attention(
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    *,
    dropout_rate: float = 0.0,
    deterministic: bool = True,
    bias: Optional[jnp.ndarray] = None,
    tokens: Optional[int] = None,
    dropout_rng: Optional[jax.Array] = None,
) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` as an `attention_fn` of `SelfAttention` (or of flax's
  `nn.MultiHeadDotProductAttention`, which passes only the arguments a function names).

  Both take [batch, tokens, heads, head_dim]. On a GPU in bfloat16 or float16 it asks for cuDNN's
  flash attention, which JAX's default (`implementation=None`) never picks: that is XLA's attention
  everywhere. Where cuDNN cannot run it (an older GPU or cuDNN, a head size it lacks) it falls back to
  XLA's, with a warning. The fused kernel has no dropout on the attention weights, and takes no
  learned logit bias (`bias`, relative position embeddings): cuDNN's gives no gradient for it.
  `tokens`: how many leading tokens are real where the caller padded them (`token_padding`); the
  rest are masked out of the keys.
  """
  if bias is not None:
    raise ValueError(
        "model.posemb='relative' adds a learned bias to the attention logits, which "
        "attention='dot_product_attention' does not train: set --config.model.attention=xla"
    )
  del dropout_rng  # Taken as head_major_attention takes it; the kernel has no dropout.
  if dropout_rate > 0.0 and not deterministic:
    raise ValueError(
        f"attention='dot_product_attention' has no dropout on the attention weights "
        f"(attention_dropout_rate={dropout_rate}): set it to 0 or use attention='xla'"
    )
  if _cudnn_may_run(query.dtype):
    try:
      return padded_attention(query, key, value, tokens=tokens, implementation='cudnn')
    except (
        NotImplementedError,
        RuntimeError,
    ) as e:  # What JAX raises where cuDNN's kernel cannot run.
      logging.log_first_n(
          logging.WARNING,
          'cuDNN flash attention cannot run here (%s): XLA computes ' 'the attention',
          1,
          e,
      )  # Once, not once per block.
  return padded_attention(query, key, value, tokens=tokens, implementation='xla', multiple=1)


def _cudnn_may_run(dtype: Any) -> bool:
  return jax.default_backend() == 'gpu' and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)


def token_padding(attention: str, tokens: int, dtype: Any) -> int:
  """How many tokens the kernel of `attention` in `dtype` needs added to `tokens`.

  cuDNN's kernel refuses a ViT's odd token counts (197 = 14x14 patches and a class token) when
  training. The encoder pads its tokens once for all its blocks (encoder.py); padding each block's
  normalized input, or each attention's queries, keys and values, costs the step more (ViT-B/16 bf16
  batch 256 on an H100 and an H200: benchmarks/RESULTS.md).
  """
  if attention != 'dot_product_attention' or not _cudnn_may_run(dtype):
    return 0
  return -tokens % CUDNN_TOKEN_MULTIPLE


def cudnn_attention_calls(compiled_hlo: str) -> int:
  """How many calls of cuDNN's fused attention kernels (forward or backward) a compiled program's HLO
  text holds: whether `fused_attention` got cuDNN's kernel or fell back to XLA's."""
  return len(re.findall(r'custom_call_target="__cudnn\$fmha', compiled_hlo))


def padded_attention(
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    *,
    implementation: str,
    tokens: Optional[int] = None,
    multiple: int = CUDNN_TOKEN_MULTIPLE,
) -> jnp.ndarray:
  """`jax.nn.dot_product_attention` over the tokens padded to a multiple of `multiple`, keys past the
  first `tokens` (default: all the given ones) masked out, the result cut back to the given tokens.
  """
  given = query.shape[1]
  tokens = given if tokens is None else tokens
  padding = -given % multiple
  if not padding and tokens == given:
    return jax.nn.dot_product_attention(query, key, value, implementation=implementation)
  if padding:
    query, key, value = (
        jnp.pad(x, ((0, 0), (0, padding), (0, 0), (0, 0))) for x in (query, key, value)
    )
  lengths = jnp.full((query.shape[0],), tokens, jnp.int32)
  out = jax.nn.dot_product_attention(
      query,
      key,
      value,
      query_seq_lengths=lengths,
      key_value_seq_lengths=lengths,
      implementation=implementation,
  )
  return out[:, :given]


def head_major_attention(
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    *,
    dropout_rng: Optional[jax.Array] = None,
    dropout_rate: float = 0.0,
    deterministic: bool = True,
    precision: Any = None,
    module: Optional[nn.Module] = None,
    bias: Optional[jnp.ndarray] = None,
) -> jnp.ndarray:
  """`nn.dot_product_attention` with the heads moved in front of the tokens for the two matmuls.

  Takes and returns [batch, tokens, heads, head_dim] like it, with the same dropout masks; its batched
  matmuls have their batch dimensions leading, which XLA:CPU runs several times faster (flax's
  `...qhd,...khd` layout makes the forward pass of a ViT-Ti 1.8x slower on CPU). Like flax, it sows
  the weights into `intermediates` when the attention module is called with `sow_weights=True`.
  `bias` [heads, q, k] is added to the logits (relative position embeddings, posemb.py).
  """
  query = query / jnp.sqrt(query.shape[-1]).astype(query.dtype)
  query, key, value = (jnp.swapaxes(x, -3, -2) for x in (query, key, value))
  logits = jnp.einsum('...qd,...kd->...qk', query, key, precision=precision)
  weights = jax.nn.softmax(logits if bias is None else logits + bias)
  if module is not None:
    module.sow('intermediates', 'attention_weights', weights)
  if not deterministic and dropout_rate > 0.0:
    keep_prob = 1.0 - dropout_rate
    keep = jax.random.bernoulli(dropout_rng, keep_prob, weights.shape)
    weights = weights * (keep.astype(weights.dtype) / jnp.asarray(keep_prob, weights.dtype))
  return jnp.swapaxes(jnp.einsum('...qk,...kd->...qd', weights, value, precision=precision), -3, -2)


ATTENTION_FNS = {'xla': head_major_attention, 'dot_product_attention': fused_attention}
# (queries, keys) [b, tokens, heads, head_dim] -> the same, changed before their product.
QueryKeyTransform = Callable[[jnp.ndarray, jnp.ndarray], tuple[jnp.ndarray, jnp.ndarray]]


class SelfAttention(nn.Module):
  """Multi-head self-attention with the parameters of flax's `nn.MultiHeadDotProductAttention` (the
  original checkpoints' `query`, `key`, `value`, `out`: kernels (D, heads, D/heads) and
  (heads, D/heads, D)), computed as it computes them, and two options it lacks: no key bias
  (`key_bias=False`: EVA's attention, whose rotary embeddings would turn a key bias into a
  position-dependent term) and a change of the queries and keys between their projection and product
  (`transform_qk`: normalisation, rotary embeddings), which the caller owns the parameters of; and
  a LayerNorm `norm` of the heads' outputs, concatenated, before the output projection (`out_norm`:
  EVA-02 CLIP's, timm's scale_attn_inner / scale_attn_norm); and grouped-query attention
  (`num_kv_heads` < num_heads: Sapiens 2's): fewer key and value heads, kernels (D, kv_heads,
  D/heads), each shared by num_heads / num_kv_heads consecutive query heads (query head h reads key
  head h // groups, timm's and transformers' `repeat_interleave`); and differential attention
  (`differential`, of the block's `lambda_init`, a call argument: differential.py); and low-rank
  adapters of the projections (`lora`: lora.py).
  """

  num_heads: int
  attention_fn: Callable[..., jnp.ndarray]
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0  # Of the attention weights.
  key_bias: bool = True
  matmul: str = 'default'  # A key of fp8.MATMULS: how the four projections multiply.
  out_norm: bool = False
  layernorm_epsilon: float = 1e-6  # `norm`'s.
  norm_layer: str = 'layernorm'  # `norm`'s kind, a key of norms.NORM_LAYERS.
  num_kv_heads: Optional[int] = None  # None: num_heads.
  differential: bool = False  # Differential attention (differential.py).
  lora: Optional[LoraSpec] = None  # Low-rank adapters of the projections it targets (lora.py).

  @nn.compact
  def __call__(
      self,
      x: jnp.ndarray,
      *,
      deterministic: bool,
      transform_qk: Optional[QueryKeyTransform] = None,
      sow_weights: bool = False,
      lambda_init: Optional[Union[float, jax.Array]] = None,
      **kernel_kwargs: Any,
  ) -> jnp.ndarray:
    """Tokens [b, n, D] -> [b, n, D]; `kernel_kwargs` go to `attention_fn` (bias, tokens);
    `lambda_init`: differential attention's (differential.lambda_init of the block's index)."""
    width = x.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'{width} channels do not split into {self.num_heads} heads')
    kv_heads = self.num_kv_heads or self.num_heads
    if self.num_heads % kv_heads:
      raise ValueError(f'{self.num_heads} query heads do not share {kv_heads} key heads evenly')
    projection = lambda name, heads, use_bias=True: lora.adapted(
        self.lora,
        nn.DenseGeneral(
            (heads, width // self.num_heads),
            dtype=self.dtype,
            kernel_init=nn.initializers.xavier_uniform(),
            use_bias=use_bias,
            dot_general=MATMULS[self.matmul],
            name=name,
        ),
        x,
        deterministic=deterministic,
    )
    query = projection('query', self.num_heads)
    key = projection('key', kv_heads, self.key_bias)
    value = projection('value', kv_heads)
    if kv_heads != self.num_heads:  # Before transform_qk, whose tables may differ per head.
      key, value = (jnp.repeat(t, self.num_heads // kv_heads, axis=-2) for t in (key, value))
    if transform_qk is not None:
      query, key = transform_qk(query, key)
    kernel_kwargs.update(dropout_rate=self.dropout_rate, deterministic=deterministic)
    if self.dropout_rate > 0.0 and not deterministic:
      kernel_kwargs['dropout_rng'] = self.make_rng('dropout')
    if sow_weights:
      kernel_kwargs['module'] = self
    if self.differential:
      if lambda_init is None:
        raise ValueError("differential attention needs its block's lambda_init")
      x = differential.attend(
          self, self.attention_fn, query, key, value, lambda_init, **kernel_kwargs
      )
    else:
      x = self.attention_fn(query, key, value, **kernel_kwargs)
    if self.out_norm:
      heads = x.shape
      x = norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'norm')(
          x.reshape(heads[:-2] + (width,))
      ).reshape(heads)
    out = nn.DenseGeneral(
        width,
        axis=(-2, -1),
        dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(),
        dot_general=MATMULS[self.matmul],
        name='out',
    )
    return lora.adapted(self.lora, out, x, deterministic=deterministic)
