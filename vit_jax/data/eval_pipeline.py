"""This host's evaluation batches of a split: every example once, unaugmented, padded to batches that
every host yields as many of (so each joins every collective); the examples come from the config's
source (sources.py)."""

from typing import Iterator

import ml_collections
import numpy as np

from vit_jax.data import batching
from vit_jax.data import images
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data import sources
from vit_jax.data import unreadable


def num_eval_batches(num_eval: int, *, local_batch_size: int, process_count: int = 1) -> int:
  """Batches that eval_iterator yields on every host: enough for the largest host's shard."""
  largest_shard = -(-num_eval // process_count)  # Shards differ in size by at most one example.
  return -(-largest_shard // local_batch_size)


class _EvalRows:
  """Row i of this host's evaluation batches: example i of its shard, or a padding row (zeros, mask
  False) past the shard's end or where an example cannot be decoded (named once a process)."""

  def __init__(
      self, config: ml_collections.ConfigDict, source: sources.Source, records: order.Records
  ):
    self._source = source
    self._records = records
    if records.prepare:
      records.prepare()
    self._pp_eval = config.pp_eval
    self._image_size = config.image_size
    size = config.image_size
    self.padding = {
        'image': np.zeros([size, size, 3], preprocess.eval_dtype(config.pp_eval)),
        'mask': np.False_,
    }
    for name, (shape, dtype) in sources.label_spec(source).items():
      self.padding[name] = np.zeros(shape, dtype)

  def __call__(self, i: int) -> dict[str, np.ndarray]:
    if i >= self._records.num_records:
      return self.padding
    record = self._records.read(i)
    try:
      example = self._source.load(record)
      image = preprocess.eval_preprocess(
          example['image'], pp_eval=self._pp_eval, image_size=self._image_size
      )
    except images.UnreadableImage as e:
      unreadable.name_once(self._source.describe(record), str(e))
      return self.padding
    return {'image': image, **sources.labels_of(example), 'mask': np.True_}


def _eval_batches(
    config: ml_collections.ConfigDict,
    split: str,
    local_batch_size: int,
    process_index: int,
    process_count: int,
    label_feature: str | None,
) -> tuple[_EvalRows, dict, int, int]:
  """(rows, spec, batches, workers) of this host's evaluation batches; no more workers than
  batches (a worker with none would only start and stop)."""
  source = sources.checked_source(config, label_feature)
  num_batches = num_eval_batches(
      source.examples(split).num_records,
      local_batch_size=local_batch_size,
      process_count=process_count,
  )
  rows = _EvalRows(config, source, source.examples(split, process_index, process_count))
  spec = {name: (value.shape, value.dtype) for name, value in rows.padding.items()}
  return rows, spec, num_batches, min(sources.num_workers(config, source), num_batches)


def eval_iterator(
    config: ml_collections.ConfigDict,
    split: str,
    *,
    local_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
    label_feature: str | None = None,
) -> Iterator[dict[str, np.ndarray]]:
  """One unaugmented pass over this host's shard of `split`: full batches {'image', 'label', 'mask'},
  the images of `preprocess.eval_dtype` (as the train iterator's: for `on_device.model_input`).

  `split` is any split of the dataset (e.g. config.eval_split, or config.train_split for few-shot
  features). 'mask' (bool [b]) is False on padding rows. Every host yields `num_eval_batches(...)`
  batches, so hosts with a smaller shard (or unreadable files) still join every collective.
  Labels are of `label_feature`, by default (None) config.label_feature: callers that pass none (the
  few-shot evaluator) follow the run. A `label_feature` that is a set of classes an image (a tfds
  Sequence of ClassLabel, as ImageNet-ReaL's 'real_label'; a Hugging Face list column) gives 'labels'
  (multi-hot bool [b, classes]) instead of 'label'.
  `eval_passes` gives the same batches pass after pass.
  """
  rows, spec, num_batches, workers = _eval_batches(
      config, split, local_batch_size, process_index, process_count, label_feature
  )
  return batching.iterate(
      rows, spec, batch_size=local_batch_size, first=0, end=num_batches, workers=workers
  )


def eval_passes(
    config: ml_collections.ConfigDict,
    split: str,
    *,
    local_batch_size: int,
    process_index: int = 0,
    process_count: int = 1,
    label_feature: str | None = None,
) -> batching.Passes:
  """`eval_iterator`'s batches at every call of the result (one pass each), from worker processes
  that start at the first pass and wait between passes (`batching.Passes`): an evaluator's data.
  Its `close()` ends them."""
  rows, spec, num_batches, workers = _eval_batches(
      config, split, local_batch_size, process_index, process_count, label_feature
  )
  return batching.Passes(
      rows, spec, batch_size=local_batch_size, num_batches=num_batches, workers=workers
  )
