"""The bundled offline dataset: scikit-learn's 8x8 handwritten digits, served from memory.

scikit-learn ships the 1,797 images inside its package, so this dataset needs no network and no
preparation. The split is the seeded, stratified 80/20 one used for the baselines in DESIGN.md: 1,437
train and 360 test images. Splits take tensorflow_datasets' slice syntax ('train[:90%]',
'train[:800]+test[:100]'), as a prepared tfds dataset's do.
"""

import functools
from typing import Sequence
import importlib.util
import os

import numpy as np

from vit_jax.data import order

CLASS_NAMES = tuple(str(d) for d in range(10))


def _sklearn_digits_file() -> str:
  """scikit-learn's digits.csv.gz, what `sklearn.datasets.load_digits` reads, found without importing
  scikit-learn: that import (scipy.stats and more) would be a second of every digits run's start."""
  spec = importlib.util.find_spec('sklearn')
  if spec is None or not spec.submodule_search_locations:
    raise ValueError('The bundled digits come with scikit-learn: pip install scikit-learn')
  return os.path.join(spec.submodule_search_locations[0], 'datasets', 'data', 'digits.csv.gz')


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 digits as uint8 RGB images [n, 8, 8, 3] and int64 labels [n], in scikit-learn's order."""
  rows = np.loadtxt(_sklearn_digits_file(), delimiter=',')  # 64 pixels, then the label.
  # scikit-learn's pixels are counts in 0..16 (of a 4x4 block of a 32x32 bitmap); spread them to 0..255.
  grey = np.round(rows[:, :-1].reshape(-1, 8, 8) * 255 / 16).astype(np.uint8)
  return np.repeat(grey[..., None], 3, axis=-1), rows[:, -1].astype(np.int64)


@functools.cache
def split_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{'train': (images, labels), 'test': (images, labels)}: the fixed stratified split, scikit-learn's
  `train_test_split(test_size=0.2, random_state=0, stratify=labels)`, whose indices (in its order)
  digits_split.npz holds (tests/data/test_data.py checks them against scikit-learn's)."""
  images, labels = digits_arrays()
  with np.load(os.path.join(os.path.dirname(__file__), 'digits_split.npz')) as split:
    return {name: (images[split[name]], labels[split[name]]) for name in ('train', 'test')}


class DigitsSource:
  """The digits as a source (sources.Source): records are (image, label) pairs."""

  class_names = CLASS_NAMES

  def __init__(self):
    # Served greyscale, [8, 8, 1]: preprocessing crops and resizes a third of the pixels (the
    # images are the same to the bit: images.rgb).
    self._splits = {
        name: (np.ascontiguousarray(images[..., :1]), labels)
        for name, (images, labels) in split_arrays().items()
    }

  def examples(
      self, split: str, shard: int = 0, num_shards: int = 1, with_shards: Sequence[int] = ()
  ) -> order.Records:
    """Shard `shard` of `num_shards` of `split` (strided, so each holds every class)."""
    del with_shards  # In memory.
    parts = order.split_indices(
        split, {name: len(labels) for name, (_, labels) in self._splits.items()}
    )
    images = np.concatenate([self._splits[name][0][i] for name, i in parts])[shard::num_shards]
    labels = np.concatenate([self._splits[name][1][i] for name, i in parts])[shard::num_shards]
    return order.Records(len(labels), functools.partial(_pair, images, labels))

  def check_split(self, split: str, field: str) -> None:
    """A one-line ValueError naming the config `field` to set (e.g. '--config.eval_split') where
    `split` is not a split of the digits or a slice of one."""
    try:
      order.split_indices(split, {name: len(labels) for name, (_, labels) in self._splits.items()})
    except ValueError as e:
      raise ValueError(
          f"{str(e).rstrip('.')}; set {field} to one of {list(self._splits)} or a slice "
          "of one, e.g. 'train[:90%]'"
      ) from None

  def load(self, record: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    image, label = record
    return {'image': image, 'label': np.int32(label)}

  def describe(self, record: tuple[np.ndarray, np.ndarray]) -> str:
    return f'a digit {record[1]}'


def _pair(images: np.ndarray, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  return images[k], labels[k]
