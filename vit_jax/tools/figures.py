"""The plotting of vit_jax.tools.pictures: tiles laid out in a mosaic, a panel, a figure written as a
PNG (local or on cloud storage)."""

import io
from typing import Any

import matplotlib
import numpy as np
from etils import epath

matplotlib.use('Agg')  # Files only: no display needed.
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position


def mosaic(tiles: np.ndarray, columns: int, gap: float) -> np.ndarray:
  """Tiles [n, h, w, ...] laid out in rows of `columns`, `gap` (e.g. NaN or white) between them."""
  n, h, w = tiles.shape[:3]
  rows = -(-n // columns)
  out = np.full((rows * (h + 1) - 1, columns * (w + 1) - 1, *tiles.shape[3:]), gap, np.float64)
  for i, tile in enumerate(tiles):
    r, c = divmod(i, columns)
    out[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = tile
  return out


def show(ax: Any, picture: np.ndarray, title: str, **kwargs: Any) -> None:
  ax.imshow(picture, **kwargs)
  ax.set_title(title, fontsize=9)
  ax.axis('off')


def save_png(fig: Any, path: str) -> str:
  """Writes `fig` as a PNG to `path`, local or on cloud storage (matplotlib writes only local files)."""
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100, bbox_inches='tight')
  plt.close(fig)
  epath.Path(path).write_bytes(png.getvalue())
  return path
