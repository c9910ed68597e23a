"""Learned position embeddings resized to another patch grid, the arrays alone: the 1-D ones of a
square grid (the class, distillation and register tokens before it kept), the first one or two axes
of the others (2-D embeddings, relative biases). 'bilinear' as the original ViT code, 'bicubic' as
timm, 'bilinear_antialiased' as big_vision's NaFlex ViT, or 'bicubic_torch' as Hugging Face
transformers' models at another image size (`interpolate_pos_encoding`); relative biases by
'bicubic' as timm resizes BEiT's (`resize_relative`).
`resize_param` tells them apart by their names in a flat tree (posemb.py's); which trees are fitted
to which model is vit_jax/checkpoints/adapting.py's.
"""

import math
import re
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

POSEMB = 'Transformer/posembed_input/pos_embedding'
# Learned position embeddings (posemb.py) at the input or in a block, and the blocks' relative biases.
POSEMB_PARAM = re.compile(r'(^|/)(posembed_input|posembed|relative_posemb)/')
_POSEMB_1D = re.compile(r'(^|/)(posembed_input|posembed)/pos_embedding$')
POSEMB_AXIS = re.compile(r'(^|/)(posembed_input|posembed)/(?P<axis>x|y)_embedding$')
_RELATIVE = re.compile(r'(^|/)relative_posemb/relative_bias$')
# The methods jax.image.resize computes (pixel centres, antialiased when shrinking: PIL's kernels),
# by their names there.
_RESIZED_BY_JAX = {'bicubic': 'bicubic', 'bilinear_antialiased': 'linear'}
POSEMB_METHODS = ('bilinear', *_RESIZED_BY_JAX, 'bicubic_torch')
_KEYS_A_TORCH = -0.75  # torch's bicubic kernel (PIL's and jax.image.resize's: -0.5).


def _linear_weights(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) linear interpolation weights with the corner samples aligned.

  Output i samples input position i * (size_in - 1) / (size_out - 1): the convention of
  `scipy.ndimage.zoom(order=1)`, which the original ViT code used.
  """
  scale = (size_in - 1) / (size_out - 1) if size_out > 1 else 0.0
  positions = np.arange(size_out) * scale
  left = np.clip(np.floor(positions).astype(int), 0, max(size_in - 2, 0))
  frac = positions - left
  weights = np.zeros((size_out, size_in))
  weights[np.arange(size_out), left] += 1 - frac
  weights[np.arange(size_out), np.minimum(left + 1, size_in - 1)] += frac
  return weights


def _torch_bicubic_weights(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) weights of torch.nn.functional.interpolate's bicubic (align_corners=False,
  no antialiasing): output i samples input position (i + 0.5) * size_in / size_out - 0.5 with Keys'
  cubic of a=-0.75 over its 4 nearest inputs, those past an edge read as the edge's (torch clamps
  their indices)."""
  positions = (np.arange(size_out) + 0.5) * size_in / size_out - 0.5
  left = np.floor(positions).astype(int)
  t = positions - left
  a = _KEYS_A_TORCH
  near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
  far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
  weights = np.zeros((size_out, size_in))
  for offset, w in zip((-1, 0, 1, 2), (far(t + 1), near(t), near(1 - t), far(2 - t))):
    np.add.at(weights, (np.arange(size_out), np.clip(left + offset, 0, size_in - 1)), w)
  return weights


def _geometric_positions(size_in: int, size_out: int) -> np.ndarray:
  """Where BEiT's fine-tuning code places the `size_in` offsets of a relative bias table to resize it
  to `size_out` (unilm's run_class_finetuning.py, timm's resize_rel_pos_bias_table): 0 and, on each
  side, steps 1, q, q^2... whose sum reaches the new table's last offset, q found by bisection (1.01
  when shrinking: the old offsets about where they were)."""
  steps, reach = size_in // 2, size_out // 2
  low, high = 1.01, 1.5
  while high - low > 1e-6:
    q = (low + high) / 2.0
    if (1.0 - q**steps) / (1.0 - q) > reach:
      high = q
    else:
      low = q
  side = np.cumsum([q**i for i in range(steps)])
  return np.concatenate([-side[::-1], [0.0], side])


def _geometric_weights(size_in: int, size_out: int) -> np.ndarray:
  """(size_out, size_in) weights that read offsets -(size_out // 2) .. size_out // 2 off a relative
  bias table of `size_in` offsets at `_geometric_positions`, linearly, the table's edges beyond its
  last (timm's resize_rel_pos_bias_table without scipy, its default)."""
  if size_in == 1:  # One offset (a grid of one patch): every offset reads it.
    return np.ones((size_out, 1))
  positions = _geometric_positions(size_in, size_out)
  targets = np.arange(size_out, dtype=np.float64) - size_out // 2
  weights = np.zeros((size_out, size_in))
  right = np.clip(np.searchsorted(positions, targets), 1, size_in - 1)
  frac = np.clip((targets - positions[right - 1]) / (positions[right] - positions[right - 1]), 0, 1)
  weights[np.arange(size_out), right - 1] = 1 - frac
  weights[np.arange(size_out), right] += frac
  return weights


def resize_relative(
    table: np.ndarray | jax.Array, sizes: tuple[int, int], method: str
) -> np.ndarray | jax.Array:
  """A relative bias table (2h - 1, 2w - 1, heads) resized to `sizes` offsets: by `method` as
  `resize_leading` resizes, but with 'bicubic' (timm's) as timm resizes BEiT's, linearly on its
  geometric positions (a table of offsets is no image: bicubic resizing put its logits 4% off timm's).
  """
  if method != 'bicubic':
    return resize_leading(table, sizes, method)
  if tuple(table.shape[:2]) == tuple(sizes):  # The positions would not be the offsets.
    return table
  weights = [_geometric_weights(n, size) for n, size in zip(table.shape, sizes)]
  if isinstance(table, jax.Array):
    return jnp.einsum('aA,bB,AB...->ab...', *(w.astype(np.float32) for w in weights), table)
  return np.einsum('aA,bB,AB...->ab...', *weights, table.astype(np.float64))


def check_posemb_method(method: str) -> None:
  if method not in POSEMB_METHODS:
    raise ValueError(
        f'Unknown config.posemb_interpolation {method!r} (how position embeddings are resized): '
        f'use one of {", ".join(POSEMB_METHODS)}, e.g. --config.posemb_interpolation=bilinear'
    )


def resize_leading(
    array: np.ndarray | jax.Array, sizes: tuple[int, ...], method: str = 'bilinear'
) -> np.ndarray | jax.Array:
  """`array` with its first one or two axes resized to `sizes`, the others kept (the embedding width,
  the heads); float64 for 'bilinear' and 'bicubic_torch' (see `interpolate_posemb` for the methods).
  A jax array (in a traced model: models/posemb.py's `fitted_to_grid`) is resized in float32, into a
  jax array."""
  check_posemb_method(method)
  traced = isinstance(array, jax.Array)
  if method in _RESIZED_BY_JAX:
    resized = jax.image.resize(
        array.astype(np.float32),
        tuple(sizes) + array.shape[len(sizes) :],
        _RESIZED_BY_JAX[method],
    )
    return resized if traced else np.asarray(resized)
  weigh = _torch_bicubic_weights if method == 'bicubic_torch' else _linear_weights
  weights = [weigh(n, size) for n, size in zip(array.shape, sizes)]
  spec = {1: 'aA,A...->a...', 2: 'aA,bB,AB...->ab...'}[len(sizes)]
  if traced:
    return jnp.einsum(spec, *(w.astype(np.float32) for w in weights), array.astype(jnp.float32))
  return np.einsum(spec, *weights, array.astype(np.float64))


def interpolate_posemb(
    posemb: np.ndarray,
    new_grid: tuple[int, int],
    *,
    num_prefix_tokens: int,
    method: str = 'bilinear',
) -> np.ndarray:
  """Resizes position embeddings (1, prefix + gs * gs, D) to the grid `new_grid` = (gh, gw).

  The prefix (class token) embeddings are kept as they are; the square grid of the others is resized.
  'bilinear' aligns the corner samples, exactly as the original code's `scipy.ndimage.zoom(order=1)`;
  'bicubic' is `jax.image.resize` (half-pixel centres, Keys cubic a=-0.5, antialiased when shrinking;
  the same as PIL's bicubic resize), 'bilinear_antialiased' its linear one (PIL's bilinear resize;
  big_vision's NaFlex ViT resizes its position embeddings so to each image's grid), 'bicubic_torch'
  torch's bicubic (half-pixel centres, a=-0.75, never antialiased), which Hugging Face transformers'
  `interpolate_pos_encoding` applies (ViT, DeiT, DINOv2, CLIP, SigLIP).
  """
  check_posemb_method(method)
  prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
  size = math.isqrt(grid.shape[0])
  if size * size != grid.shape[0]:
    raise ValueError(
        f'{POSEMB}: {grid.shape[0]} grid tokens are not a square grid: the checkpoint '
        'is not a ViT of square images'
    )
  gh, gw = new_grid
  grid = resize_leading(grid.reshape(size, size, -1), (gh, gw), method)
  xp = jnp if isinstance(posemb, jax.Array) else np
  return xp.concatenate([prefix, grid.reshape(1, gh * gw, -1).astype(posemb.dtype)], axis=1)


def resize_param(
    params: dict[str, Any], key: str, new: tuple[int, ...], num_prefix_tokens: int, method: str
) -> Optional[str]:
  """Resizes the learned position embedding `params[key]` to the shape `new` of the model's grid, in
  place; returns the log's note, or None when `key` is none or its shape is not one of a new grid.
  """
  old = params[key].shape
  if old == new or len(old) != len(new) or old[-1] != new[-1]:
    return None
  name = 'pos_embedding' if key == POSEMB else key
  if _POSEMB_1D.search(key):
    prefix = num_prefix_tokens
    old_size, new_size = math.isqrt(old[1] - prefix), math.isqrt(new[1] - prefix)
    if old_size**2 != old[1] - prefix or new_size**2 != new[1] - prefix:
      return None  # Not square grids: the shape check names it.
    params[key] = interpolate_posemb(
        params[key], (new_size, new_size), num_prefix_tokens=prefix, method=method
    )
    return f'resized {name} {old_size}x{old_size} -> {new_size}x{new_size} ({method})'
  if (axis := POSEMB_AXIS.search(key)) is not None:
    params[key] = resize_leading(params[key], new[:1], method).astype(params[key].dtype)
    unit = 'columns' if axis['axis'] == 'x' else 'rows'
    return f'resized {name} {old[0]} -> {new[0]} {unit} ({method})'
  if _RELATIVE.search(key):
    params[key] = resize_relative(params[key], new[:2], method).astype(params[key].dtype)
    return f'resized {name} {old[0]}x{old[1]} -> {new[0]}x{new[1]} offsets ({method})'
  return None
