"""Each example's set of classes (a multi-label column), held ragged: one array of every example's
classes in turn and where each example's start, so a split of millions costs a few bytes an example
(a multi-hot row would cost a bit a class: 2.7 KB for ImageNet-21k's)."""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class LabelSets:
  """Example i's classes are values[offsets[i]:offsets[i + 1]]; indexed as a numpy array of examples
  is (an int: that example's classes; a slice or an index array: a LabelSets of those examples)."""

  offsets: np.ndarray  # int64 [examples + 1], from 0.
  # [offsets[-1]]: class indices (or the labels as written, before they are checked).
  values: np.ndarray

  def __len__(self) -> int:
    return len(self.offsets) - 1

  def __getitem__(self, index: int | slice | np.ndarray) -> 'np.ndarray | LabelSets':
    if isinstance(index, (int, np.integer)):
      return self.values[self.offsets[index] : self.offsets[index + 1]]
    chosen = np.arange(len(self))[index]
    starts, lengths = self.offsets[chosen], np.diff(self.offsets)[chosen]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    # Position j of the result is value starts[i] + (j - offsets[i]) of example i's.
    positions = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return LabelSets(offsets, self.values[positions])

  def with_values(self, values: np.ndarray) -> 'LabelSets':
    """The same sets of `values` (e.g. the labels as written, made class indices)."""
    return LabelSets(self.offsets, values)


def from_lengths(lengths: np.ndarray, values: np.ndarray) -> LabelSets:
  """The sets of `lengths[i]` values each, in turn."""
  return LabelSets(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), values)


def concatenate(parts: list[LabelSets]) -> LabelSets:
  return from_lengths(
      np.concatenate([np.diff(p.offsets) for p in parts]),
      np.concatenate([p.values for p in parts]),
  )


def multi_hot(classes: np.ndarray, num_classes: int) -> np.ndarray:
  """One example's classes as a multi-hot bool row [num_classes]."""
  row = np.zeros(num_classes, bool)
  row[classes] = True
  return row
