"""The blocks' matmuls (`model.matmul`): in the compute dtype, or in FP8 ('fp8').

'fp8' quantizes both operands of every projection and MLP layer of the transformer blocks to
float8_e4m3fn, and in the backward pass the incoming gradient to float8_e5m2 (more range, less
precision: gradients need the range), each tensor with one scale from its own absolute maximum in
this step (the "tensorwise" dynamic recipe of torchao's float8 training; Transformer Engine's current
scaling). Nothing is stored between steps, so checkpoints, resumption, scans and meshes are as
without it. The maximum is over the whole tensor, so no scale depends on the mesh; float32's sums
do, in their last bit, which now and then moves a value into the next FP8 bin: runs on two meshes
agree to FP8's rounding, not float32's (a run on one mesh repeats to the bit). With `accum_steps`
each micro-batch's activations have their own scales. The scale is a power of two: scaling and
unscaling are exact, and the largest value lands in the top binade of the format, never past it.
The patch embedding, the pooling and the head stay in the compute dtype (the usual exclusions: they
are a small share of the FLOPs and the most sensitive to precision).

The products are written as dot(convert(fp8) * scale, ...), the pattern XLA's GPU compiler rewrites
into cuBLASLt's FP8 matmul on GPUs with FP8 tensor cores (compute capability 8.9 and up: Ada, Hopper,
Blackwell). Elsewhere XLA multiplies the dequantized operands in the compute dtype: the same rounding
of the operands, no speed-up (`runs_natively` says which). The backward pass keeps the quantized
operands (one byte a value) for its two products instead of the compute-dtype activations.
"""

import functools
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp

FORWARD_DTYPE = jnp.float8_e4m3fn  # Activations and weights.
GRADIENT_DTYPE = jnp.float8_e5m2  # The gradient flowing back into a product.


def scale_of(x: jax.Array, fp8_dtype: Any) -> jax.Array:
  """The smallest power of two s (float32 scalar) with max|x| / s <= the format's largest finite
  value; 1 for a tensor of zeros."""
  amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
  # frexp: amax / fmax = m * 2^e with 0.5 <= m < 1, so amax / 2^e < fmax, and 2^(e - 1) is too small
  # unless m is 0.5 (a quotient of exactly 2^(e - 1): that scale fits). Rounding the quotient is
  # monotonic and powers of two are representable, so rounding never moves e below the true one.
  mantissa, exponent = jnp.frexp(amax / float(jnp.finfo(fp8_dtype).max))
  exponent = exponent - (mantissa == 0.5)
  return jnp.where(amax > 0, jnp.ldexp(jnp.float32(1), exponent), jnp.float32(1))


def quantize(x: jax.Array, fp8_dtype: Any) -> tuple[jax.Array, jax.Array]:
  """(x / s in `fp8_dtype`, s) with s = `scale_of(x)`: x is the product of the two, rounded."""
  scale = scale_of(x, fp8_dtype)
  return (x.astype(jnp.float32) / scale).astype(fp8_dtype), scale


def dequantize(q: jax.Array, scale: jax.Array, dtype: Any) -> jax.Array:
  # XLA's FP8 matmul pattern: the upcast to the dot's dtype, times a broadcast scalar of that dtype.
  return q.astype(dtype) * scale.astype(dtype)


def fp8_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: Any,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
  """`jax.lax.dot_general` of the FP8-quantized operands (e4m3), with the gradient quantized to e5m2
  in the backward pass; a drop-in `dot_general` for flax's `Dense` and `DenseGeneral`."""
  product = functools.partial(
      jax.lax.dot_general,
      dimension_numbers=dimension_numbers,
      precision=precision,
      preferred_element_type=preferred_element_type,
  )
  dtypes = (lhs.dtype, rhs.dtype)

  @jax.custom_vjp
  def quantized_product(lhs, rhs):
    return forward(lhs, rhs)[0]

  def forward(lhs, rhs):
    (q_lhs, s_lhs), (q_rhs, s_rhs) = quantize(lhs, FORWARD_DTYPE), quantize(rhs, FORWARD_DTYPE)
    out = product(dequantize(q_lhs, s_lhs, dtypes[0]), dequantize(q_rhs, s_rhs, dtypes[1]))
    return out, (q_lhs, s_lhs, q_rhs, s_rhs)

  def backward(residuals, grad):
    q_lhs, s_lhs, q_rhs, s_rhs = residuals
    _, transpose = jax.vjp(
        product, dequantize(q_lhs, s_lhs, dtypes[0]), dequantize(q_rhs, s_rhs, dtypes[1])
    )
    q_grad, s_grad = quantize(grad, GRADIENT_DTYPE)
    return transpose(dequantize(q_grad, s_grad, grad.dtype))

  quantized_product.defvjp(forward, backward)
  return quantized_product(lhs, rhs)


# model.matmul: the dot_general of the blocks' Dense layers.
MATMULS: dict[str, Callable[..., jax.Array]] = {
    'default': jax.lax.dot_general,
    'fp8': fp8_dot_general,
}


def fp8_matmul_calls(compiled_hlo: str) -> int:
  """How many cuBLASLt FP8 matmuls a compiled program's HLO text calls: whether XLA rewrote the 'fp8'
  products for the tensor cores."""
  return len(re.findall(r'custom_call_target="__cublas\$lt\$matmul\$f8"', compiled_hlo))


def runs_natively(device: Any) -> bool:
  """Whether XLA can give 'fp8' products to FP8 tensor cores on `device` (a CUDA GPU of compute
  capability 8.9 or higher); elsewhere they are computed from the dequantized operands."""
  capability = getattr(device, 'compute_capability', None)
  if device.platform != 'gpu' or not capability:
    return False
  major, minor = (int(part) for part in str(capability).split('.')[:2])
  return (major, minor) >= (8, 9)
