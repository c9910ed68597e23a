"""From a config to this host's train batches, on grain (no TensorFlow); the examples come from the
config's source (sources.py), evaluation's batches from eval_pipeline.py.

Resumability: each data shard's train stream is a pure function of (config.seed, shard, stream
position). Epoch e is a seeded permutation of the shard (order.py), each record of it at
`config.aug_repeats` positions in a row (repeated augmentation); the augmentation of the example at
stream position p is seeded from (seed, shard, p), so each copy is augmented apart. So the batch of
step s is a pure function of s: starting at step s reads nothing before it, and every batch is the
same whether it is built in this process or in any of grain's worker processes
(`config.data_workers`).
"""

from typing import Sequence

import ml_collections
import numpy as np

from vit_jax.data import batching
from vit_jax.data import images
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data import sources
from vit_jax.data import unreadable

# The end of the range of train steps; never reached.
_MANY = 2**62
# Seed streams of a train shard: its epochs' order and its examples' augmentation.
_ORDER, _AUGMENT = 0, 1


class UnreadableSplit(ValueError):
  """No example of a train split's epoch can be read (its files gone, a mount lost)."""


def num_data_shards(config: ml_collections.ConfigDict, process_count: int) -> int:
  """Streams the train split is cut into: `config.data_shards`, or one per process if unset."""
  shards = config.data_shards or process_count
  if shards % process_count:
    raise ValueError(
        f'config.data_shards={shards} is not a multiple of the {process_count} processes: '
        f'use a multiple, e.g. --config.data_shards={process_count}'
    )
  return shards


def _process_shards(num_shards: int, process_index: int, process_count: int) -> range:
  """The data shards of process `process_index`'s train stream."""
  per_process = num_shards // process_count
  return range(process_index * per_process, (process_index + 1) * per_process)


def prepare(
    config: ml_collections.ConfigDict, process_index: int, process_count: int, train: bool = True
) -> None:
  """Makes what this process's train stream (unless not `train`: a run that only evaluates) and
  evaluation of config.eval_split read first (a Parquet split's copy of their rows;
  `order.Records.prepare`) now, before a run compiles or writes anything: a cache without room is a
  one-line error then."""
  source = sources.checked_source(config)
  num_shards = num_data_shards(config, process_count)
  shards = _process_shards(num_shards, process_index, process_count) if train else ()
  records = [
      *(source.examples(config.train_split, shard, num_shards, shards) for shard in shards),
      source.examples(config.eval_split, process_index, process_count),
  ]
  for shard_records in records:
    if shard_records.prepare:
      shard_records.prepare()


class _TrainStream:
  """Data shard `shard`'s stream: the augmented example at each stream position."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      source: sources.Source,
      shard: int,
      num_shards: int,
      with_shards: Sequence[int],
  ):
    self._source = source
    self._records = source.examples(config.train_split, shard, num_shards, with_shards)
    if self._records.num_records < 1:
      raise ValueError(
          f'Split {config.train_split!r} has no examples for data shard {shard} of '
          f'{num_shards}: use a larger split or fewer data shards'
      )
    if self._records.prepare:
      self._records.prepare()
    self._order_seed = (config.seed, shard, _ORDER)
    self._augment_seed = (config.seed, shard, _AUGMENT)
    self._pp = config.pp
    self._image_size = config.image_size
    self._repeats = config.aug_repeats

  def __call__(self, position: int) -> dict[str, np.ndarray]:
    """The example at stream `position`. A record that cannot be decoded is named (once a process)
    and replaced by the next one of the epoch's order, so a stream with unreadable files is still a
    pure function of the position."""
    n = self._records.num_records
    epoch, offset = divmod(position // self._repeats, n)
    for skipped in range(n):
      record = self._records.read(
          order.index_at(n, self._order_seed, epoch * n + (offset + skipped) % n)
      )
      try:
        example = self._source.load(record)
        image = preprocess.train_preprocess(
            example['image'],
            (*order.words(*self._augment_seed), position),
            pp=self._pp,
            image_size=self._image_size,
        )
        break
      except images.UnreadableImage as e:
        unreadable.name_once(self._source.describe(record), str(e))
    else:
      raise UnreadableSplit(
          f'No example of the train split could be read (e.g. '
          f'{self._source.describe(record)}): check that the files are images'
      )
    return {'image': image, **sources.labels_of(example)}


class _HostExamples:
  """Example j of this host's train examples from step 0 on: each local batch is an equal slice of
  every one of the host's shard streams, in shard order."""

  def __init__(self, streams: tuple[_TrainStream, ...], local_batch_size: int):
    self._streams = streams
    self._local_batch_size = local_batch_size
    self._per_shard = local_batch_size // len(streams)

  def __call__(self, j: int) -> dict[str, np.ndarray]:
    step, i = divmod(j, self._local_batch_size)
    shard, row = divmod(i, self._per_shard)
    return self._streams[shard](step * self._per_shard + row)


def train_iterator(
    config: ml_collections.ConfigDict,
    *,
    local_batch_size: int,
    start_step: int = 0,
    process_index: int = 0,
    process_count: int = 1,
) -> batching.BatchIterator:
  """This host's endless train batches {'image': [b, H, W, 3], 'label': int32 [b]}, the labels of
  config.label_feature ('labels', multi-hot bool [b, classes], where it is a set of classes an
  image). The images are uint8 pixels or float32 in [-1, 1] (`preprocess.train_dtype`);
  `on_device.model_input` in the step makes either the model's float32.

  The split is cut into `num_data_shards` disjoint streams; each global batch is the concatenation of
  one equal slice from every stream, and a host reads only the streams of its slices. So the global
  batches depend on `config.data_shards`, not on how many hosts share the work: 1 process and 2
  processes with data_shards=2 train on the same batches.

  Batch k with `start_step=s` is bitwise batch s + k with `start_step=0`, unreadable files included
  (each is replaced by the next record of its epoch's order). `close()` ends its worker processes.
  """
  source = sources.checked_source(config)
  num_shards = num_data_shards(config, process_count)
  shards = _process_shards(num_shards, process_index, process_count)
  if local_batch_size % len(shards):
    raise ValueError(
        f'The per-host batch {local_batch_size} does not split into {len(shards)} '
        f'data shards: make config.batch_size a multiple of config.data_shards={num_shards}'
    )
  streams = tuple(_TrainStream(config, source, shard, num_shards, shards) for shard in shards)
  size = config.image_size
  spec = {
      'image': ((size, size, 3), preprocess.train_dtype(config.pp)),
      **sources.label_spec(source),
  }
  return batching.iterate(
      _HostExamples(streams, local_batch_size),
      spec,
      batch_size=local_batch_size,
      first=start_step,
      end=_MANY,
      workers=sources.num_workers(config, source),
  )
