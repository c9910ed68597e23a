"""Differential attention (Ye et al. 2024, "Differential Transformer"; timm's `DiffAttention`,
`model.diff_attention`): each head's queries and keys split in halves, two softmax maps of them over
the same values, the second subtracted at a learned weight lambda, the heads then RMSNormed
(`sub_norm`) and scaled by 1 - lambda_init.

lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, of four learned
vectors of half a head's width shared by the heads; lambda_init = 0.8 - 0.6 exp(-0.3 l) grows with
the block's index l (the paper's, timm's `depth`). The two maps are any kernel's (`model.attention`):
(A1 - lambda A2) V is A1 V - lambda A2 V.
"""

import math
from typing import Any, Callable, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

LAMBDAS = ('lambda_q1', 'lambda_k1', 'lambda_q2', 'lambda_k2')
SUB_NORM_EPSILON = 1e-5  # timm's RmsNorm of the heads, whatever the model's norms.


def lambda_init(layer: int) -> np.float32:
  """The paper's lambda_init of block `layer` (counted from 0), in float32: a looped block's and a
  scanned one's (an element of an array of them) are the same number."""
  return np.float32(0.8 - 0.6 * math.exp(-0.3 * layer))


def halves_normed(norm: nn.Module, x: jnp.ndarray) -> jnp.ndarray:
  """`norm` of each half of each head of x [..., heads, head_dim] (timm's DiffAttention's q_norm and
  k_norm, of half a head's width: model.qk_norm)."""
  halves = x.reshape(x.shape[:-1] + (2, x.shape[-1] // 2))
  return norm(halves).reshape(x.shape)


class _Captured:
  """Stands for the attention module where a kernel sows its weights: keeps them, to sow their
  difference."""

  def __init__(self):
    self.weights = []

  def sow(self, collection: str, name: str, value: jnp.ndarray) -> None:
    del collection, name
    self.weights.append(value)


def _halves(x: jnp.ndarray, scaled: bool = False) -> tuple[jnp.ndarray, jnp.ndarray]:
  """The two halves of each head [b, n, heads, head_dim], each padded with zeros to the head's
  width: a kernel then takes them with the values (the fused one wants one width), and their products
  are the halves'. `scaled`: times sqrt(2), so that the kernel's 1 / sqrt(head_dim) is 1 / sqrt(half).
  """
  zeros = jnp.zeros(x.shape[:-1] + (x.shape[-1] // 2,), x.dtype)
  factor = jnp.asarray(math.sqrt(2.0) if scaled else 1.0, x.dtype)
  return tuple(jnp.concatenate([h * factor, zeros], axis=-1) for h in jnp.split(x, 2, axis=-1))


def attend(
    parent: nn.Module,
    attention_fn: Callable[..., jnp.ndarray],
    query: jnp.ndarray,
    key: jnp.ndarray,
    value: jnp.ndarray,
    start: Union[float, jax.Array],
    /,
    **kernel_kwargs: Any,
) -> jnp.ndarray:
  """The heads [b, n, heads, head_dim] of differential attention, inside the attention `parent`'s
  compact call (its parameters `LAMBDAS` and `sub_norm`), of lambda_init `start` (a float32, or a
  scanned block's); `kernel_kwargs` as `attention_fn` takes them, their `module` (to sow the
  weights) given the difference of the two maps."""
  half = query.shape[-1] // 2
  q1, k1, q2, k2 = (
      parent.param(name, nn.initializers.normal(0.1), (half,), jnp.float32) for name in LAMBDAS
  )
  weight = jnp.exp(jnp.sum(q1 * k1)) - jnp.exp(jnp.sum(q2 * k2)) + start
  owner = kernel_kwargs.pop('module', None)
  rng = kernel_kwargs.pop('dropout_rng', None)
  rngs = (None, None) if rng is None else jax.random.split(rng)
  captured = _Captured()
  maps = []
  for (q, k), map_rng in zip(zip(_halves(query, scaled=True), _halves(key)), rngs):
    extra = {} if map_rng is None else {'dropout_rng': map_rng}
    if owner is not None:
      extra['module'] = captured
    maps.append(attention_fn(q, k, value, **kernel_kwargs, **extra))
  if owner is not None:
    first, second = captured.weights
    owner.sow('intermediates', 'attention_weights', first - weight.astype(first.dtype) * second)
  heads = maps[0] - weight.astype(maps[0].dtype) * maps[1]
  normed = nn.RMSNorm(epsilon=SUB_NORM_EPSILON, dtype=parent.dtype, name='sub_norm')(heads)
  return normed * jnp.asarray(1.0 - start, normed.dtype)
