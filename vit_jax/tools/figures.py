"""The tools' plotting: tiles laid out in a mosaic, a panel (pictures), a figure as a PNG's bytes
(report, scaling, confusion) or written as a PNG, local or on cloud storage."""

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


def png(fig: Any, dpi: int = 100, tight: bool = False) -> bytes:
  """`fig` as a PNG's bytes (`tight`: cropped to what it draws), and closed: what the tools write, to
  cloud storage too (matplotlib writes only local files), and embed in their HTML."""
  buffer = io.BytesIO()
  fig.savefig(buffer, format='png', dpi=dpi, bbox_inches='tight' if tight else None)
  plt.close(fig)
  return buffer.getvalue()


def save_png(fig: Any, path: str) -> str:
  """Writes `fig`, cropped, as a PNG to `path`, local or on cloud storage."""
  epath.Path(path).write_bytes(png(fig, tight=True))
  return path
