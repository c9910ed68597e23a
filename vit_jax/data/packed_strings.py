"""A split's image paths, packed: their common prefix once, then the rest of each path's UTF-8 bytes
end to end and where each ends. Held as a Python list, ImageNet-1k's 1.28 million train paths are
141 MB of objects in every process that holds them, each of a run's worker processes among them,
which unpickles them object by object; packed, they are 44 MB (with their labels) and unpickle 30x
faster, as two buffers (benchmarks/worker_paths.py).
"""

import collections.abc
import os
from typing import Iterable

import numpy as np


class PackedStrings(collections.abc.Sequence):
  """An immutable sequence of strings, as the list of them: `packed[k]` is a str, `packed[a:b:c]` a
  PackedStrings of those strings."""

  def __init__(self, strings: Iterable[str]):
    strings = list(strings)
    self._prefix = os.path.commonprefix(strings) if strings else ''
    rests = [s[len(self._prefix) :].encode('utf-8', 'surrogateescape') for s in strings]
    self._ends = np.cumsum([len(r) for r in rests], dtype=np.int64)
    self._bytes = b''.join(rests)

  def __len__(self) -> int:
    return len(self._ends)

  def _start(self, k: int) -> int:
    return int(self._ends[k - 1]) if k else 0

  def __getitem__(self, k):
    if isinstance(k, slice):
      indices = range(len(self))[k]
      taken = PackedStrings(())
      taken._prefix = self._prefix
      taken._ends = np.cumsum([self._ends[i] - self._start(i) for i in indices], dtype=np.int64)
      taken._bytes = b''.join(self._bytes[self._start(i) : self._ends[i]] for i in indices)
      return taken
    k = range(len(self))[k]  # An int's index, negative ones from the end; IndexError beyond.
    rest = self._bytes[self._start(k) : int(self._ends[k])].decode('utf-8', 'surrogateescape')
    return self._prefix + rest

  def __repr__(self) -> str:
    return f'PackedStrings({len(self)} strings, prefix {self._prefix!r})'
