"""How a ViT's parameters are first drawn (`model.weight_init`): the original code's way, or timm's.

'original': what the modules' own initialisers draw, as the original vit_jax code: Xavier-uniform
matrices, MLP biases ~N(0, 1e-6), other biases 0, position embeddings ~N(0, 0.02), the patch embedding
LeCun-normal, a zero class token and a zero head.

'timm': timm's `VisionTransformer.init_weights()` (its default mode, the one `timm.create_model` and
timm's train.py use): every Dense and attention matrix, the head included, ~N(0, 0.02) truncated to
[-2, 2], their biases 0; the patch embedding as PyTorch's Conv2d draws it, weights and bias
~U(+-1/sqrt(fan_in)); the class token ~N(0, 1e-6); a MAP head's probe ~N(0, 1/width) truncated as
timm's latent; position embeddings and LayerNorms as 'original' (the same distributions as timm's).
Width-64 matrices are drawn with a standard deviation of 0.02 instead of Xavier's 0.125 there, and the
head starts random instead of zero: on small models and short schedules the two train differently.
"""

from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import traverse_util

from vit_jax.models import scan_layout
from vit_jax.models.vit import HEADS

Params = Any
_STD = 0.02


def _truncated_normal(key: jax.Array, shape: tuple[int, ...], std: float) -> jnp.ndarray:
  """timm's trunc_normal_(std=std): N(0, std) cut at the absolute bounds -2 and 2."""
  return std * jax.random.truncated_normal(key, -2.0 / std, 2.0 / std, shape, jnp.float32)


def _conv_default(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jnp.ndarray:
  """PyTorch's Conv2d.reset_parameters: weight (kaiming_uniform_ with a=sqrt(5)) and bias both
  ~U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
  bound = 1.0 / fan_in**0.5
  return jax.random.uniform(key, shape, jnp.float32, -bound, bound)


def _timm_leaf(
    path: tuple[str, ...], value: jnp.ndarray, embedding_fan_in: int
) -> Optional[Callable[[jax.Array], jnp.ndarray]]:
  """The draw of one parameter under timm's scheme (a function of a key), or None to keep it."""
  *parents, name = path
  parent = parents[-1] if parents else ''
  if parent == 'embedding':
    return lambda key: _conv_default(key, value.shape, embedding_fan_in)
  if name == 'cls':
    return lambda key: 1e-6 * jax.random.normal(key, value.shape, jnp.float32)
  if name == 'dist':  # timm's VisionTransformerDistilled.
    return lambda key: _truncated_normal(key, value.shape, _STD)
  if name == 'probe':
    return lambda key: _truncated_normal(key, value.shape, value.shape[-1] ** -0.5)
  if 'norm' in parent.lower():  # LayerNorm_*, encoder_norm, fc_norm: ones and zeros on both sides.
    return None
  if name == 'kernel':
    return lambda key: _truncated_normal(key, value.shape, _STD)
  if name == 'bias' and parent in HEADS:  # timm's 0, or model.head_bias_init where set.
    return None
  if name == 'bias':
    return lambda key: jnp.zeros(value.shape, jnp.float32)
  return None  # Position embeddings (already ~N(0, 0.02)), MPP's mask token.


def timm_init(params: Params, key: jax.Array) -> Params:
  """`params` of a pure ViT (per-block layout) re-drawn as timm's VisionTransformer draws its own."""
  flat = traverse_util.flatten_dict(params)
  kernel = flat[('embedding', 'kernel')]
  fan_in = (
      kernel.shape[0] * kernel.shape[1] * kernel.shape[2]
  )  # [p, p, 3, D]: PyTorch's in * p * p.
  paths = sorted(flat)  # One key per parameter, in a fixed order.
  keys = jax.random.split(key, len(paths))
  for path, leaf_key in zip(paths, keys):
    draw = _timm_leaf(path, flat[path], fan_in)
    if draw is not None:
      flat[path] = draw(leaf_key)
  return traverse_util.unflatten_dict(flat)


# model.weight_init -> params, key -> the parameters to start from (None: as the modules drew them).
WEIGHT_INITS: dict[str, Optional[Callable[[Params, jax.Array], Params]]] = {
    'original': None,
    'timm': timm_init,
}


def redraw(weight_init: str, params: Params, key: jax.Array) -> Params:
  """The freshly initialised `params` under the scheme `weight_init` (a key of WEIGHT_INITS)."""
  draw = WEIGHT_INITS[weight_init]
  return params if draw is None else draw(params, jax.random.fold_in(key, 1))


def fresh_params(model: nn.Module, image_size: int, key: jax.Array) -> Params:
  """The parameters a run from scratch starts from (`key`: jax.random.key(config.seed)), in the
  checkpoints' per-block layout: the modules' initialisers, then the model's weight_init (`redraw`).
  """
  # Initialised as a loop of blocks even when scanned (a scan splits the key its own way): the fast
  # paths change the speed of a run, never its results.
  params = scan_layout.per_block(model).init(
      {'params': key, 'mpp': key}, jnp.zeros((1, image_size, image_size, 3)), train=False
  )['params']
  return redraw(getattr(model, 'weight_init', 'original'), params, key)  # BiT has one way.
