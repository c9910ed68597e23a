"""2-D rotary position embeddings of the patches' queries and keys (`model.rope`), in the styles of
the models that have them (`model.rope_style`, the keys of STYLES).

'eva02': EVA-02's, timm's `RotaryEmbeddingCat` (rope_type 'cat', interleaved pairs, 'ij' grid, no
offset). A head's channels form pairs (2i, 2i + 1), each rotated by the angle position x frequency:
the first half of the pairs by the patch's row, the second half by its column, at the frequencies
temperature^(-k / bands), k < bands = head_dim / 4, temperature 10000. With `ref_grid` (timm's
ref_feat_shape, EVA-02's pretraining grid) the positions of a grid of another size are rescaled to
span the reference one, row index r of h becoming r / h * ref_h: fine-tuning at a new resolution
needs no change of parameters.

'rope_vit': RoPE-ViT's axial embeddings (Heo et al. 2024; timm's `vit_*_patch16_rope_224`: 'xy'
grid, temperature 100): EVA-02's, but the first half of the pairs turned by the column, the second
by the row, at temperature 100.

'pe': Perception Encoder's (timm's `vit_pe_core_*`: 'xy' grid, offset 1): EVA-02's, column first,
the positions counted from 1 (its class token sat at 0), then rescaled to `ref_grid`.

'eva02_xy': Perception Encoder G's (timm's `vit_pe_core_gigantic_*`: 'xy' grid, no offset):
EVA-02's, column first.

'rope_mixed': RoPE-Mixed (Heo et al. 2024; timm's `vit_*_patch16_rope_mixed_224`, rope_type
'mixed'): frequencies learned per block and head, `rope_freqs` [2, heads, head_dim / 2] of each
block (timm's `rope.freqs`, all blocks'), pair m of a head turned by column x fx[m] + row x fy[m]
(timm's 'xy' grid, no offset, indices at any resolution: no reference grid). They start as timm's
`init_random_2d_freqs`: magnitudes temperature^(-k / bands) at temperature 10, each head's pairs
at a random angle, the second half's a quarter turn on.

'dinov3': DINOv3's, timm's `RotaryEmbeddingDinoV3` (rope_type 'dinov3', rope_rotate_half, 'ij' grid,
no offset, no coordinate augmentations). Row r of h sits at 2 (r + 0.5) / h - 1 in [-1, 1], the
columns alike: the same span at any resolution, so no reference grid. The angles are
2 pi position / period at the periods temperature^(2k / (head_dim / 2)), k < bands, temperature 100;
channel i is paired with channel i + head_dim / 2 (the rotated halves), the first bands of each half
turned by the row, the next ones by the column.

Only the patches' queries and keys turn; the tokens before them (class token, registers) and any
padding after them do not.
"""

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

TEMPERATURE = 10_000.0  # EVA-02's, Perception Encoder's.
DINOV3_TEMPERATURE = 100.0  # DINOv3's, RoPE-ViT's.
MIXED_TEMPERATURE = 10.0  # RoPE-Mixed's initial frequencies'.

Tables = tuple[np.ndarray, np.ndarray]


def check_head_dim(head_dim: int) -> None:
  """A one-line error for a head width the embeddings do not fill: 2 axes x sin, cos per band."""
  if head_dim % 4:
    raise ValueError(
        f'model.rope=True rotates pairs of channels by the row and the column: the head width '
        f'hidden_size / num_heads = {head_dim} must be a multiple of 4; change model.num_heads or '
        'hidden_size, or set --config.model.rope=False'
    )


def check(model: Mapping[str, Any]) -> None:
  """One-line ValueErrors for the rotary fields of a resolved ViT model config (rope, rope_grid,
  rope_style) that the embeddings would fail on or silently ignore."""
  if model['rope']:
    check_head_dim(model['hidden_size'] // model['num_heads'])
  grid = model['rope_grid']
  if grid is not None and not (
      model['rope'] and len(grid) == 2 and all(isinstance(n, int) and n > 0 for n in grid)
  ):
    raise ValueError(
        f'model.rope_grid={grid} must be the (rows, columns) of patches that rotary embeddings '
        "span (EVA-02's pretraining grid, e.g. (16, 16)), with model.rope=True; or unset"
    )
  style = model['rope_style']
  if style not in STYLES or (style != 'eva02' and not model['rope']):
    raise ValueError(
        f'model.rope_style={style!r} must be one of {", ".join(STYLES)}, with '
        'model.rope=True for any but eva02 (the default)'
    )
  if style == 'dinov3' and grid is not None:
    raise ValueError(
        f"model.rope_grid={grid} rescales positions, which model.rope_style='dinov3' normalises to "
        '[-1, 1] at any grid: unset model.rope_grid'
    )
  if style == 'rope_mixed' and grid is not None:
    raise ValueError(
        f"model.rope_grid={grid} rescales positions, which model.rope_style='rope_mixed' counts "
        "at any grid (its learned frequencies' scale): unset model.rope_grid"
    )


def _cat_tables(
    temperature: float, columns_first: bool, offset: float
) -> Callable[[tuple[int, int], int, Optional[tuple[int, int]]], Tables]:
  """The tables of timm's `build_rotary_pos_embed` with in_pixels=False, at this temperature, grid
  indexing ('xy': columns first) and grid offset: each frequency's value repeated for both channels
  of its pair."""

  def tables(grid: tuple[int, int], head_dim: int, ref_grid: Optional[tuple[int, int]]) -> Tables:
    bands = head_dim // 4
    exponents = np.arange(bands, dtype=np.float32) / np.float32(bands)
    frequencies = np.float32(1.0) / np.float32(temperature) ** exponents
    positions = [np.arange(n, dtype=np.float32) + np.float32(offset) for n in grid]
    if ref_grid is not None:  # timm's order of operations, for its float32 values: t / n * ref.
      positions = [t / np.float32(n) * np.float32(r) for t, n, r in zip(positions, grid, ref_grid)]
    rows, columns = np.meshgrid(*positions, indexing='ij')
    axes = [columns, rows] if columns_first else [rows, columns]
    angles = np.stack(axes, axis=-1)[..., None] * frequencies  # [h, w, 2, bands]
    angles = angles.reshape(grid[0] * grid[1], 2 * bands).astype(np.float32)
    return tuple(np.repeat(f(angles), 2, axis=-1).astype(np.float32) for f in (np.sin, np.cos))

  return tables


def dinov3_periods(head_dim: int) -> np.ndarray:
  """DINOv3's periods of a head's head_dim / 4 bands, float32: temperature^(2k / (head_dim / 2))."""
  exponents = (
      np.float32(2.0) * np.arange(head_dim // 4, dtype=np.float32) / np.float32(head_dim // 2)
  )
  return np.float32(DINOV3_TEMPERATURE) ** exponents


def _dinov3_tables(
    grid: tuple[int, int], head_dim: int, ref_grid: Optional[tuple[int, int]]
) -> Tables:
  """timm's `RotaryEmbeddingDinoV3` in float32, in its order of operations: the 'half' layout, the
  angles of the row then the column bands, twice."""
  if ref_grid is not None:
    raise ValueError("rope_style 'dinov3' spans [-1, 1] at any grid: it takes no ref_grid")
  bands = head_dim // 4
  periods = dinov3_periods(head_dim)
  positions = [np.arange(0.5, n, dtype=np.float32) / np.float32(n) for n in grid]
  rows, columns = np.meshgrid(*positions, indexing='ij')
  coordinates = np.float32(2.0) * np.stack([rows, columns], axis=-1) - np.float32(1.0)  # [h, w, 2]
  angles = np.float32(2 * math.pi) * coordinates[..., None] / periods  # [h, w, 2, bands]
  angles = angles.reshape(grid[0] * grid[1], 2 * bands).astype(np.float32)
  return tuple(
      np.concatenate([f(angles)] * 2, axis=-1).astype(np.float32) for f in (np.sin, np.cos)
  )


def _rotate_pairs(x: jnp.ndarray) -> jnp.ndarray:
  """(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...) over the last axis."""
  pairs = x.reshape(x.shape[:-1] + (-1, 2))
  return jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)


def _rotate_half(x: jnp.ndarray) -> jnp.ndarray:
  """(x1, x2), the halves of the last axis -> (-x2, x1)."""
  first, second = jnp.split(x, 2, axis=-1)
  return jnp.concatenate([-second, first], axis=-1)


def _mixed_tables(grid: tuple[int, int], frequencies: jnp.ndarray) -> tuple[jnp.ndarray, ...]:
  """timm's `get_mixed_freqs` in float32: per head, [h * w, heads, head_dim] of the learned
  `frequencies` [2, heads, head_dim / 2] (of the column, of the row), each pair's value twice."""
  rows, columns = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in grid), indexing='ij')
  frequencies = frequencies.astype(jnp.float32)
  angles = (
      columns.reshape(-1, 1, 1) * frequencies[0] + rows.reshape(-1, 1, 1) * frequencies[1]
  )  # [h * w, heads, head_dim / 2]
  return tuple(jnp.repeat(f(angles), 2, axis=-1) for f in (jnp.sin, jnp.cos))


def init_mixed_frequencies(
    key: jnp.ndarray, shape: tuple[int, ...], dtype: Any = jnp.float32
) -> jnp.ndarray:
  """timm's `init_random_2d_freqs` for one block: `shape` [2, heads, head_dim / 2]."""
  _, heads, half = shape
  magnitudes = 1.0 / MIXED_TEMPERATURE ** (
      jnp.arange(0, 2 * half, 4, dtype=jnp.float32) / (2 * half)
  )
  angles = jax.random.uniform(key, (heads, 1), jnp.float32, 0.0, 2 * math.pi)
  turns = jnp.concatenate([angles, angles + math.pi / 2], axis=-1)  # [heads, 2]
  # [heads, 2 (the halves), bands] -> [heads, head_dim / 2], for the column (cos) and the row (sin).
  along = lambda f: (magnitudes * f(turns)[..., None]).reshape(heads, half)
  return jnp.stack([along(jnp.cos), along(jnp.sin)]).astype(dtype)


class Style(NamedTuple):
  """A style's (sin, cos) tables, of (grid, head_dim, ref_grid) or, for a style whose blocks learn
  their frequencies (`init`, their initializer), of (grid, frequencies); and the turn of the
  channels that the sines multiply."""

  tables: Callable[..., Tables]
  rotate: Callable[[jnp.ndarray], jnp.ndarray]
  init: Optional[Callable[..., jnp.ndarray]] = None


STYLES = {
    'eva02': Style(_cat_tables(TEMPERATURE, columns_first=False, offset=0.0), _rotate_pairs),
    'rope_vit': Style(
        _cat_tables(DINOV3_TEMPERATURE, columns_first=True, offset=0.0), _rotate_pairs
    ),
    'pe': Style(_cat_tables(TEMPERATURE, columns_first=True, offset=1.0), _rotate_pairs),
    'eva02_xy': Style(_cat_tables(TEMPERATURE, columns_first=True, offset=0.0), _rotate_pairs),
    'rope_mixed': Style(_mixed_tables, _rotate_pairs, init_mixed_frequencies),
    'dinov3': Style(_dinov3_tables, _rotate_half),
}


def tables(
    grid: tuple[int, int],
    head_dim: int,
    ref_grid: Optional[tuple[int, int]] = None,
    style: str = 'eva02',
    frequencies: Optional[jnp.ndarray] = None,
) -> Tables:
  """(sin, cos), each float32 [h * w, head_dim], the patches in row-major order; of a learned
  style, of its `frequencies` [2, heads, head_dim / 2], [h * w, heads, head_dim]."""
  check_head_dim(head_dim)
  if STYLES[style].init is None:
    if frequencies is not None:
      raise ValueError(f'rope_style {style!r} has fixed frequencies: it takes none')
    return STYLES[style].tables(grid, head_dim, ref_grid)
  if frequencies is None or ref_grid is not None:
    raise ValueError(f'rope_style {style!r} counts positions with its learned frequencies alone')
  return STYLES[style].tables(grid, frequencies)


def apply(
    x: jnp.ndarray, sin: np.ndarray, cos: np.ndarray, start: int, style: str = 'eva02'
) -> jnp.ndarray:
  """Queries or keys [b, tokens, heads, head_dim] with the patches' (tokens start .. start + h * w)
  rotated by tables [h * w, head_dim] (or [h * w, heads, head_dim]: a learned style's); computed in
  float32 and returned in x's dtype, as timm's `apply_rot_embed`."""
  end = start + sin.shape[0]
  patches = x[:, start:end].astype(jnp.float32)
  if sin.ndim == 2:  # Broadcast over the heads.
    sin, cos = (jnp.asarray(t)[:, None, :] for t in (sin, cos))
  rotated = (patches * cos + STYLES[style].rotate(patches) * sin).astype(x.dtype)
  return jnp.concatenate([x[:, :start], rotated, x[:, end:]], axis=1)
