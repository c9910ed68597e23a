"""The numbers behind the pictures of vit_jax.tools.pictures (the paper's Figures 6 and 7), from a
model and its parameters: attention weights, attention rollout, mean attention distance,
position-embedding similarity, the principal components of the patch-embedding filters. NumPy and
JAX, no matplotlib: pictures draws them.

Attention rollout (Abnar & Zuidema, 2020): each layer's attention averaged over heads, plus the identity
for the residual connection, rows renormalised; the product over layers 1..l says how much each token
after layer l draws on each input token. The map weighs those rows as the model pools its tokens into
its representation: the class token's row (classifier 'token'), the mean of all rows (GAP), the MAP
head's probe attention averaged over heads (MAP). The attention weights are those the model's
attention modules sow into its 'intermediates' collection.
"""

import math
from typing import Any, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from vit_jax.models import pooling

NUM_COMPONENTS = 28  # As the paper's Figure 7 (left).


def _sow_probe_weights(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
  """A flax method interceptor: the MAP head's attention sows its weights as the blocks' do (MAPHead
  calls it without `sow_weights`, which the tool needs only here)."""
  if (
      context.method_name == '__call__'
      and isinstance(context.module, nn.MultiHeadDotProductAttention)
      and isinstance(context.module.parent, pooling.MAPHead)
  ):
    kwargs = {**kwargs, 'sow_weights': True}
  return next_fun(*args, **kwargs)


def _intermediates(model: nn.Module, params: Any, images: jax.Array) -> tuple[nn.Module, Any]:
  """The float32 clone of `model` the weights are measured on, and what its attention sows."""
  # Measurements in float32, whatever the run computed in; the fused attention kernel sows no weights,
  # and blocks under one nn.scan hide their intermediates.
  model = model.clone(dtype=jnp.float32, attention='xla', scan=False)
  with nn.intercept_methods(_sow_probe_weights):
    _, state = model.apply({'params': params}, images, train=False, mutable=['intermediates'])
  return model, state['intermediates']


def attention_weights(model: nn.Module, params: Any, images: jax.Array) -> np.ndarray:
  """Every block's attention weights for `images` [b, h, w, 3]: [layers, b, heads, tokens, tokens]."""
  model, intermediates = _intermediates(model, params, images)
  blocks = intermediates['Transformer']
  # encoderblock_10 sorts before encoderblock_2 as a string.
  names = sorted(blocks, key=lambda name: int(name.rsplit('_', 1)[1]))
  weights = np.stack(
      [blocks[name]['MultiHeadDotProductAttention_1']['attention_weights'][0] for name in names]
  )
  chex.assert_shape(weights, (model.num_layers, len(images), model.num_heads, None, None))
  return weights


def probe_weights(model: nn.Module, params: Any, images: jax.Array) -> np.ndarray:
  """[b, tokens]: a MAP model's (classifier 'map') pooling, the probe's attention over the encoded
  tokens, averaged over its heads as the rollout averages each layer's."""
  _, intermediates = _intermediates(model, params, images)
  probe = intermediates[pooling.MAP_HEAD]['MultiHeadDotProductAttention_0']['attention_weights'][0]
  return np.asarray(probe)[:, :, 0].mean(axis=1)  # [b, heads, 1 probe, tokens].


def attention_rollout(attention: np.ndarray) -> np.ndarray:
  """The rollout up to each layer [layers, tokens, tokens] of attention [layers, heads, tokens, tokens]."""
  tokens = attention.shape[-1]
  mixed = attention.mean(axis=1) + np.eye(
      tokens
  )  # The identity stands for the residual connection.
  mixed /= mixed.sum(axis=-1, keepdims=True)
  joint, rollout = np.eye(tokens), []
  for layer in mixed:
    joint = layer @ joint
    rollout.append(joint)
  return np.stack(rollout)


def rollout_maps(
    rollout: np.ndarray,
    num_prefix_tokens: int,
    class_token: bool,
    pooled: Optional[np.ndarray] = None,
) -> np.ndarray:
  """[layers, gh, gw]: how much the image's representation draws on each patch, up to each layer.

  `pooled` [tokens]: each token's weight in the representation (a MAP model's `probe_weights`); by
  default the class token's row of the rollout (`class_token`), or without one (GAP: the
  representation is the mean of the patch tokens) the mean of the patches' rows.
  """
  if pooled is None:
    rows = rollout[:, 0] if class_token else rollout[:, num_prefix_tokens:].mean(axis=1)
  else:
    rows = pooled @ rollout
  return rows[:, num_prefix_tokens:].reshape(len(rows), *_grid(rows.shape[-1] - num_prefix_tokens))


def _grid(num_patches: int) -> tuple[int, int]:
  side = math.isqrt(num_patches)
  if side * side != num_patches:
    raise ValueError(
        f'{num_patches} patches are not a square grid: only square images are supported'
    )
  return side, side


def patch_distances(grid: tuple[int, int], patch_pixels: float) -> np.ndarray:
  """[patches, patches] distances in pixels between the patch centres of a grid (row-major order)."""
  rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  return patch_pixels * np.hypot(rows[:, None] - rows[None], cols[:, None] - cols[None])


def mean_attention_distance(
    attention: np.ndarray, patch_pixels: float, num_prefix_tokens: int
) -> np.ndarray:
  """[..., heads]: for attention [..., heads, tokens, tokens], the attention-weighted mean distance in
  pixels from each query patch to the patches it attends to, averaged over the query patches."""
  patches = attention[..., num_prefix_tokens:, num_prefix_tokens:]
  # A class token has no position: the weights are renormalised over the patches.
  patches = patches / patches.sum(axis=-1, keepdims=True)
  distances = patch_distances(_grid(patches.shape[-1]), patch_pixels)
  return (patches * distances).sum(axis=-1).mean(axis=-1)


def position_similarity(pos_embedding: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
  """[gh, gw, gh, gw]: cosine similarity of each patch position's embedding to every position's."""
  grid = pos_embedding.reshape(-1, pos_embedding.shape[-1])[num_prefix_tokens:]
  grid = grid / np.linalg.norm(grid, axis=-1, keepdims=True)
  gh, gw = _grid(len(grid))
  return (grid @ grid.T).reshape(gh, gw, gh, gw)


def embedding_components(kernel: np.ndarray, count: int = NUM_COMPONENTS) -> np.ndarray:
  """[count, P, P, 3]: the top principal components of the patch-embedding filters, kernel [P, P, 3, D]
  (each of the D filters is one sample of P*P*3 values)."""
  p, _, channels, features = kernel.shape
  filters = kernel.reshape(p * p * channels, features).T
  _, _, components = np.linalg.svd(filters - filters.mean(axis=0), full_matrices=False)
  return components[:count].reshape(-1, p, p, channels)
