"""The order in which a train stream visits its records: one seeded permutation of the split per epoch.

A source offers its records in one of two ways, and each gets its own epoch order:
- `RandomAccess` (image folders: a list of paths; tfds datasets prepared as ArrayRecord): record k is
  readable by index, so epoch e is a full permutation of the records, computed index by index with
  TensorFlow's index shuffle under a key drawn from (seed, e) (`_epoch_key`). Nothing is
  materialised, so starting at any stream position costs the same.
- `Blocks` (tfds datasets prepared as TFRecord): records are readable only in order, in blocks (a
  file, or the part of one in this shard). Blocks are cut into pieces of `window_size` records (or an
  eighth of the block, if that is more); epoch e visits the pieces in a permuted order, consecutive
  permuted pieces are grouped into windows of about `window_size` records, and each window is read
  (its pieces interleaved) and permuted as a whole. A window of at least the split's size is a full permutation. Starting
  mid-epoch skips whole windows without reading them and reads at most one window.

Both are stateless: the stream from position p is a pure function of (seed, p), so resume is bit-exact.
"""
import dataclasses
from typing import Callable

import numpy as np
import tensorflow as tf

# tf.data wants an end for a range of epochs; this one is never reached.
_MANY_EPOCHS = 2**62
# Pieces a block is cut into at most (see _Pieces.cut).
_MAX_PIECES = 8
# Indices permuted and read together: amortises the per-element cost of tf.data and of reads.
_READ_CHUNK = 256


@dataclasses.dataclass(frozen=True)
class RandomAccess:
  """`num_records` records; `read(indices)` maps int64 indices [k] to a dict of tensors [k, ...]."""
  num_records: int
  read: Callable[[tf.Tensor], dict[str, tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Blocks of `block_sizes[b]` records each; `read(b)` is a tf.data.Dataset of block b's records."""
  block_sizes: tuple[int, ...]
  read: Callable[[tf.Tensor], tf.data.Dataset]

  @property
  def num_records(self) -> int:
    return sum(self.block_sizes)


Records = RandomAccess | Blocks


def in_order(records: Records) -> tf.data.Dataset:
  """Every record once, in the source's fixed order (for evaluation)."""
  if isinstance(records, RandomAccess):
    indices = tf.data.Dataset.range(records.num_records).batch(_READ_CHUNK)
    return indices.map(records.read).unbatch()
  return tf.data.Dataset.range(len(records.block_sizes)).flat_map(records.read)


def _epoch_seed(seed: tf.Tensor, epoch: int | tf.Tensor) -> tf.Tensor:
  # fold_in's result depends on the dtype of its data: int64 here, whether `epoch` is a Python int.
  return tf.random.experimental.stateless_fold_in(seed, tf.cast(epoch, tf.int64))


def _epoch_key(epoch_seed: tf.Tensor) -> tf.Tensor:
  """The index shuffle's key for the epoch of seed `epoch_seed`: three random int64 words.

  The shuffle (a Simon cipher over blocks of 2W bits, the fewest that hold the split, W >= 8) reads
  only the low W bits of each key word: 8 bits below 65,536 records, 11 for ImageNet. Keyed as
  `tf.random.experimental.index_shuffle` keys it (a constant word, then the fold_in seed's two words:
  a hash of the run's seed, and the epoch itself), epoch e + 2^W repeated epoch e (e + 256 for a
  small split), and two seeds shared their order with chance 2^-W. Three random words drawn from
  the epoch's seed fill the key's 3W bits from both."""
  return tf.random.stateless_uniform([3], epoch_seed, minval=None, maxval=None, dtype=tf.int64,
                                     alg='philox')


def _indices_in_epoch(records: RandomAccess, offsets: tf.Tensor, epoch_key: tf.Tensor) -> tf.Tensor:
  """The record indices at `offsets` (int64, a scalar or a vector) into the epoch of key `epoch_key`."""
  last = tf.constant(records.num_records - 1, tf.int64)
  # The op itself: tf.random.experimental.index_shuffle would put a constant first in the key. 4 rounds,
  # as it uses.
  return tf.raw_ops.RandomIndexShuffle(index=offsets, seed=epoch_key,
                                       max_index=tf.fill(tf.shape(offsets), last), rounds=4)


def _permuted_epoch(records: RandomAccess, epoch: int | tf.Tensor, first: int | tf.Tensor,
                    seed: tf.Tensor) -> tf.data.Dataset:
  """Epoch `epoch` of a random-access source, from its `first` record on."""
  epoch_key = _epoch_key(_epoch_seed(seed, epoch))
  positions = tf.data.Dataset.range(tf.cast(first, tf.int64), records.num_records).batch(_READ_CHUNK)
  indices = positions.map(lambda p: _indices_in_epoch(records, p, epoch_key))
  return indices.map(records.read, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).unbatch()


def records_at(records: RandomAccess, positions: tf.Tensor, seed: tf.Tensor) -> dict[str, tf.Tensor]:
  """The records at stream `positions` (int64 [k]) of `shuffled_stream(records, seed=seed, ...)`."""
  indices = tf.map_fn(
      lambda p: _indices_in_epoch(records, p % records.num_records,
                                  _epoch_key(_epoch_seed(seed, p // records.num_records))),
      tf.cast(positions, tf.int64))
  return records.read(indices)


@dataclasses.dataclass(frozen=True)
class _Pieces:
  """The blocks cut into pieces: piece i is records [skip[i], skip[i] + take[i]) of block block[i]."""
  block: np.ndarray
  skip: np.ndarray
  take: np.ndarray
  per_window: int  # Consecutive pieces (in an epoch's order) that make a window.

  @classmethod
  def cut(cls, records: Blocks, window_size: int) -> '_Pieces':
    pieces = []
    for b, size in enumerate(records.block_sizes):
      # Reading a piece reads through the block up to it, so a block is cut into at most
      # _MAX_PIECES: an epoch then reads a block at most (_MAX_PIECES + 1) / 2 times.
      piece = max(window_size, -(-size // _MAX_PIECES))
      pieces += [(b, skip, min(piece, size - skip)) for skip in range(0, size, piece)]
    block, skip, take = (np.array(column, np.int64) for column in zip(*pieces))
    per_window = max(1, min(len(take), round(window_size / take.mean())))
    return cls(block, skip, take, per_window)

  @property
  def num_windows(self) -> int:
    return -(-len(self.take) // self.per_window)

  def order(self, epoch_seed: tf.Tensor) -> tf.Tensor:
    return tf.random.experimental.stateless_shuffle(tf.range(len(self.take), dtype=tf.int64),
                                                    epoch_seed)


def _permute(window: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, tf.Tensor]:
  size = tf.shape(next(iter(window.values())))[0]
  order = tf.random.experimental.stateless_shuffle(tf.range(size), seed)
  return {k: tf.gather(v, order) for k, v in window.items()}


def _windowed_epoch(records: Blocks, pieces: _Pieces, epoch: int | tf.Tensor, first_window: int,
                    seed: tf.Tensor) -> tf.data.Dataset:
  """Epoch `epoch` of a block source, from window `first_window` on."""
  epoch_seed = _epoch_seed(seed, epoch)
  block, skip, take = (tf.constant(column) for column in (pieces.block, pieces.skip, pieces.take))
  largest_window = pieces.per_window * int(pieces.take.max())
  piece_order = pieces.order(epoch_seed)  # Once per epoch, not once per window.

  def read_piece(i):
    return records.read(block[i]).skip(skip[i]).take(take[i])

  def window(w):
    in_window = piece_order[w * pieces.per_window:(w + 1) * pieces.per_window]
    read = tf.data.Dataset.from_tensor_slices(in_window).interleave(
        read_piece, cycle_length=pieces.per_window, num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True)
    window_seed = tf.random.experimental.stateless_fold_in(epoch_seed, w)
    return read.batch(largest_window).map(lambda examples: _permute(examples, window_seed))

  windows = tf.data.Dataset.range(first_window, pieces.num_windows).flat_map(window)
  # Reads the next window while this one is consumed, instead of stalling at each window's start.
  return windows.prefetch(1).unbatch()


def _first_window(pieces: _Pieces, epoch: int, offset: int, seed: tf.Tensor) -> tuple[int, int]:
  """(window of epoch `epoch` that holds its record `offset`, records of the epoch before it)."""
  sizes = pieces.take[pieces.order(_epoch_seed(seed, epoch)).numpy()]
  window_sizes = np.add.reduceat(sizes, np.arange(0, len(sizes), pieces.per_window))
  starts = np.concatenate([[0], np.cumsum(window_sizes)])
  window = int(np.searchsorted(starts, offset, side='right')) - 1
  return window, int(starts[window])


def shuffled_stream(records: Records, *, start: int, window_size: int,
                    seed: tf.Tensor) -> tf.data.Dataset:
  """The endless stream of epochs of `records` from stream position `start` on, each example with
  its stream 'position'."""
  epoch, offset = divmod(start, records.num_records)
  if isinstance(records, RandomAccess):
    first = _permuted_epoch(records, epoch, offset, seed)
    later = lambda e: _permuted_epoch(records, e, 0, seed)
  else:
    pieces = _Pieces.cut(records, window_size)
    window, skipped = _first_window(pieces, epoch, offset, seed)
    first = _windowed_epoch(records, pieces, epoch, window, seed).skip(offset - skipped)
    later = lambda e: _windowed_epoch(records, pieces, e, 0, seed)
  stream = first.concatenate(tf.data.Dataset.range(epoch + 1, _MANY_EPOCHS).flat_map(later))
  return stream.enumerate(start).map(lambda position, example: {**example, 'position': position})
