"""Position embeddings: their kind `model.posemb` (registry `POSEMBS`) and where they enter
`model.posemb_where` (registry `POSEMB_WHERE`), the paper's ablation (Appendix D.4, Table 8).

Kinds. Each added one is a module called with the tokens [b, prefix + h * w, D] and the patch grid
(h, w), returning the tokens with their embeddings added:
  'learn'     learned 1-D, one per token, class token included: `pos_embedding` (1, N, D), the original
              checkpoints' `Transformer/posembed_input/pos_embedding`.
  'learn2d'   learned 2-D: `x_embedding` (w, D/2) and `y_embedding` (h, D/2); the patch at row r,
              column c gets concat(X[c], Y[r]). The class token gets its own learned `prefix_embedding`
              (1, D), as in 1-D: at every layer it is not redundant with the learned `cls`.
  'sincos2d'  fixed 2-D sin-cos (big_vision's), no parameters.
  'sincos2d_mae'  the same with MAE's frequencies (MAE's, I-JEPA's, a native-resolution AIMv2's;
              transformers' ViTMAE): no parameters.
  'none'      nothing: the encoder sees the patches as a set.
  'relative'  a learned bias per head for each relative offset (dy, dx) between query and key patches,
              added to every block's attention logits (each block has its own `relative_posemb`; the
              paper's variant computes the bias from the query, this is the query-independent one of
              Swin and BEiT). Pairs involving the class token get three learned biases of their own.

Where (an added kind): 'input' once before the first block (the original); 'every_layer' each block
adds its own embedding (`encoderblock_{i}/posembed`) to its input; 'shared_every_layer' one embedding
(`posembed_input`, the input one's tree) added at every block's input. 'none' and 'relative' only
take 'input' (Table 8's N/A cells).
"""

import contextlib
import functools
from typing import Callable, Iterator, Optional

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from vit_jax.checkpoints import posemb_resizing

_INIT = nn.initializers.normal(stddev=0.02)


def posemb_sincos_2d(
    h: int, w: int, width: int, temperature: float = 10_000.0, *, mae: bool = False
) -> jnp.ndarray:
  """big_vision's fixed 2-D position embeddings (MoCo v3): float32 (1, h * w, width), rows first.

  A quarter of the channels each is sin(x w_k), cos(x w_k), sin(y w_k), cos(y w_k), for the column x,
  the row y and w_k = temperature^(-k / (width / 4 - 1)), k < width / 4; `mae`: MAE's
  temperature^(-k / (width / 4)), which its code lays out the same way (its "h" half is the columns').
  """
  quarter = width // 4
  if width % 4 or quarter < (1 if mae else 2):
    raise ValueError(
        f'sin-cos position embeddings need a width that is a multiple of 4 (at least '
        f'{4 if mae else 8}), got {width}'
    )
  y, x = jnp.mgrid[:h, :w]
  omega = 1.0 / temperature ** (jnp.arange(quarter) / (quarter if mae else quarter - 1))
  y = jnp.einsum('m,d->md', y.flatten(), omega)
  x = jnp.einsum('m,d->md', x.flatten(), omega)
  return jnp.concatenate([jnp.sin(x), jnp.cos(x), jnp.sin(y), jnp.cos(y)], axis=1)[None]


_FITTING: list[str] = []  # The methods of the `fitted_to_grid` contexts entered, innermost last.


@contextlib.contextmanager
def fitted_to_grid(method: str) -> Iterator[None]:
  """Within it, a model traced on images of another size than its parameters' resizes its learned
  position embeddings (1-D, 2-D, relative biases; at the input or in every block) to the images' grid
  by `method` (a config.posemb_interpolation), in the traced computation, as fine-tuning at a new
  resolution resizes them once on the host (checkpoints/posemb_resizing.py): timm's
  `dynamic_img_size`. The evaluators at another image size trace their step in it."""
  posemb_resizing.check_posemb_method(method)
  _FITTING.append(method)
  try:
    yield
  finally:
    _FITTING.pop()


def _grid_param(
    module: nn.Module,
    name: str,
    shape: tuple[int, ...],
    grid_axes: dict[int, str],
    init: Callable = _INIT,
    fit: Optional[Callable[[jnp.ndarray, str], jnp.ndarray]] = None,
) -> jnp.ndarray:
  """`module`'s float32 parameter `name` of `shape`, whose `grid_axes` (axis: unit) follow the grid.

  Stored parameters of another grid are `fit(stored, method)` inside `fitted_to_grid`, else a
  one-line error: Flax would only say that the initializer's shape differs from the stored one.
  """
  if module.has_variable('params', name):
    stored = tuple(module.get_variable('params', name).shape)
    for axis, unit in grid_axes.items():
      if len(stored) == len(shape) and stored[axis] != shape[axis]:
        if _FITTING and fit is not None:
          return fit(module.get_variable('params', name), _FITTING[-1])
        raise ValueError(
            f'the position embeddings {stored} are for {stored[axis]} {unit}, but the images '
            f'give {shape[axis]}: the parameters are for another image size; fit them to '
            'this one with vit_jax.checkpoints.adapting.adapt_params (as config.init_from does)'
        )
  return module.param(name, init, shape, jnp.float32)


class AddPositionEmbs(nn.Module):
  """Adds learned 1D position embeddings, one per token (class token included)."""

  posemb_init: Callable = _INIT

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    pos_embedding = _grid_param(
        self,
        'pos_embedding',
        (1, inputs.shape[1], inputs.shape[2]),
        {1: 'tokens'},
        self.posemb_init,
        lambda stored, method: posemb_resizing.interpolate_posemb(
            stored, grid, num_prefix_tokens=inputs.shape[1] - grid[0] * grid[1], method=method
        ),
    )
    return inputs + pos_embedding.astype(inputs.dtype)


class Add2DPositionEmbs(nn.Module):
  """Adds learned 2-D position embeddings: concat(X[column], Y[row]) for a patch, its own for a class
  token. The width must be even."""

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    (h, w), (_, n, d) = grid, inputs.shape
    x = _grid_param(
        self,
        'x_embedding',
        (w, d // 2),
        {0: 'columns'},
        fit=lambda stored, method: posemb_resizing.resize_leading(stored, (w,), method),
    )
    y = _grid_param(
        self,
        'y_embedding',
        (h, d // 2),
        {0: 'rows'},
        fit=lambda stored, method: posemb_resizing.resize_leading(stored, (h,), method),
    )
    posemb = jnp.concatenate(
        [jnp.broadcast_to(x[None], (h, w, d // 2)), jnp.broadcast_to(y[:, None], (h, w, d // 2))],
        axis=-1,
    ).reshape(h * w, d)
    if n > h * w:
      posemb = jnp.concatenate(
          [self.param('prefix_embedding', _INIT, (n - h * w, d), jnp.float32), posemb]
      )
    return inputs + posemb[None].astype(inputs.dtype)


class AddSincosPositionEmbs(nn.Module):
  """Adds `posemb_sincos_2d` (of MAE's frequencies with `mae`) to the patch tokens.

  A class token gets a zero embedding (as MAE and timm do): big_vision adds the embeddings before
  prepending its class token, which is the same.
  """

  mae: bool = False

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    h, w = grid
    posemb = posemb_sincos_2d(h, w, inputs.shape[-1], mae=self.mae)
    posemb = jnp.pad(posemb, ((0, 0), (inputs.shape[1] - h * w, 0), (0, 0)))
    return inputs + posemb.astype(inputs.dtype)


class NoPositionEmbs(nn.Module):
  """Adds nothing (Table 8's first row): permuting the patches permutes the encoded patch tokens."""

  def __call__(self, inputs: jnp.ndarray, grid: tuple[int, int]) -> jnp.ndarray:
    del grid
    return inputs


def relative_index(h: int, w: int, num_prefix: int) -> np.ndarray:
  """[N, N] rows of the flattened bias table for each (query, key) pair of N = num_prefix + h * w tokens.

  Patches (query row, col) and (key row, col) read the offset (dy, dx) = query - key at row
  (dy + h - 1) * (2w - 1) + dx + w - 1; after the (2h - 1)(2w - 1) offsets come the three biases of the
  prefix tokens: prefix query (any key), patch query to prefix key, prefix to prefix.
  """
  rows, cols = np.divmod(np.arange(h * w), w)
  offsets = (2 * h - 1) * (2 * w - 1)
  index = np.empty((num_prefix + h * w,) * 2, np.int32)
  index[num_prefix:, num_prefix:] = (
      (rows[:, None] - rows[None] + h - 1) * (2 * w - 1) + cols[:, None] - cols[None] + w - 1
  )
  index[:num_prefix] = offsets
  index[num_prefix:, :num_prefix] = offsets + 1
  index[:num_prefix, :num_prefix] = offsets + 2
  return index


class RelativePositionBias(nn.Module):
  """A block's learned relative position bias: `relative_bias` (2h - 1, 2w - 1, heads), one per offset
  (dy, dx) in [-(h-1), h-1] x [-(w-1), w-1], and `prefix_bias` (3, heads) for the class token's pairs.

  Called with the number of tokens and the grid; returns the float32 bias [heads, N, N] of the
  attention logits (query, key).
  """

  num_heads: int

  @nn.compact
  def __call__(self, num_tokens: int, grid: tuple[int, int]) -> jnp.ndarray:
    h, w = grid
    table = _grid_param(
        self,
        'relative_bias',
        (2 * h - 1, 2 * w - 1, self.num_heads),
        {0: 'row offsets', 1: 'column offsets'},
        fit=lambda stored, method: posemb_resizing.resize_relative(
            stored, (2 * h - 1, 2 * w - 1), method
        ),
    ).reshape(-1, self.num_heads)
    if num_tokens > h * w:
      table = jnp.concatenate(
          [table, self.param('prefix_bias', _INIT, (3, self.num_heads), jnp.float32)]
      )
    return jnp.moveaxis(table[relative_index(h, w, num_tokens - h * w)], -1, 0)


POSEMBS = {
    'learn': AddPositionEmbs,
    'sincos2d': AddSincosPositionEmbs,
    'sincos2d_mae': functools.partial(AddSincosPositionEmbs, mae=True),
    'none': NoPositionEmbs,
    'learn2d': Add2DPositionEmbs,
    'relative': RelativePositionBias,
}
# model.posemb_where -> the kinds that can enter there: only added embeddings enter at every layer.
_ADDED = ('learn', 'sincos2d', 'sincos2d_mae', 'learn2d')
SINCOS = ('sincos2d', 'sincos2d_mae')  # Fixed: no parameters, any grid.
POSEMB_WHERE = {'input': tuple(POSEMBS), 'every_layer': _ADDED, 'shared_every_layer': _ADDED}
# Tensor parallelism (see encoder.TENSOR_RULES): the relative biases split over heads like the
# attention whose logits they join.
TENSOR_RULES = (
    (r'relative_posemb/relative_bias$', 2),  # (2h - 1, 2w - 1, heads)
    (r'relative_posemb/prefix_bias$', 1),  # (3, heads)
)
