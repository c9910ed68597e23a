"""The order in which a train stream visits its records: one seeded permutation of the split per epoch.

A source offers its records by index (`Records`: image folders are lists of paths, tfds datasets are
prepared as ArrayRecord, the digits are arrays). Epoch e of a stream is a full permutation of its
records drawn from (stream seed, e), so the record at stream position p is a pure function of
(seed, p): starting at any position costs one permutation, never a pass over what comes before it,
and resume is bit-exact.

The permutation is materialised (int32, 4 bytes a record: 5 MB for ImageNet-1k, 56 MB for
ImageNet-21k) once per epoch and process, in 0.05 s per million records on a 2-core VM; a keyed
cipher over the indices would need no memory but costs a Python call per record in a worker.

`split_indices` reads tensorflow_datasets' slice syntax ('train[:90%]', 'train[:800]+test[:100]')
for the sources that take it without being tfds datasets (the digits, Hugging Face datasets).
"""

import dataclasses
import functools
import types
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow_datasets as tfds

# Seeds are hashed as unsigned 64-bit words; config.seed may be negative.
_UINT64 = 2**64


@dataclasses.dataclass(frozen=True)
class Records:
  """`num_records` records; `read(k)` is record k (a path, serialized bytes, an example's arrays).

  `read` must pickle with its source: grain's worker processes call it."""

  num_records: int
  read: Callable[[int], Any]
  # What reading them needs made first (a Parquet split's copy of their rows): the pipeline calls it
  # in its own process, where its log is seen and a full disk is one line, before its workers read.
  prepare: Callable[[], None] | None = None


def words(*seed: int) -> list[int]:
  """`seed`'s integers as the unsigned words numpy's SeedSequence takes."""
  return [int(s) % _UINT64 for s in seed]


# The epoch being read and the next one, of each data shard a process reads (a batch's rows switch
# between its shards): 2 entries recomputed one for every few rows of 2 shards. The shards partition
# the split, so their permutations hold as many indices as two of the split's.
@functools.lru_cache(maxsize=64)
def _permutation(num_records: int, seed: tuple[int, ...], epoch: int) -> np.ndarray:
  permutation = np.random.default_rng(words(*seed, epoch)).permutation(num_records)
  return permutation.astype(np.int32 if num_records < 2**31 else np.int64)


def index_at(num_records: int, seed: Sequence[int], position: int) -> int:
  """The record at stream `position` of the endless stream of epochs of `num_records` records."""
  epoch, offset = divmod(position, num_records)
  return int(_permutation(num_records, tuple(seed), epoch)[offset])


def split_indices(split: str, sizes: dict[str, int]) -> list[tuple[str, np.ndarray]]:
  """(split name, indices) of each part of `split`, a tfds split spec over splits of `sizes`; a
  one-line ValueError for a bad one."""
  infos = {name: types.SimpleNamespace(num_examples=n) for name, n in sizes.items()}
  try:
    parts = tfds.core.ReadInstruction.from_spec(split).to_absolute(infos)
  except (ValueError, AssertionError) as e:
    first_line = str(e).strip().splitlines()[0]
    raise ValueError(f'Bad split {split!r}: {first_line}') from None
  return [(p.splitname, np.arange(sizes[p.splitname])[p.from_ : p.to]) for p in parts]
