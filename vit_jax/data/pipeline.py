"""From a config to this host's iterators of numpy batches.

Resumability: each data shard's train stream is a pure function of (config.seed, shard, stream
position). Epoch e is a seeded permutation of the shard (see order.py: a full one for image folders
and ArrayRecord datasets, windows of `config.shuffle_buffer` records over permuted file pieces for
TFRecord datasets); the augmentation of the example at stream position p is seeded from (seed, p).
So starting at step s skips to position s * batch arithmetically; nothing is decoded to be skipped.
"""
import dataclasses
import functools
import os
from typing import Callable, Iterator, Protocol

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf

from vit_jax.data import digits
from vit_jax.data.as_written import as_written
from vit_jax.data import folder
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data import tfds_source
from vit_jax.data import unreadable
from vit_jax.data import vtab


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What `get_info` reads of the config's splits; `num_examples` counts any other split."""
  num_classes: int
  num_train: int  # Examples in config.train_split, all hosts together.
  num_eval: int  # Examples in config.eval_split, all hosts together.
  class_names: tuple[str, ...]


class Source(Protocol):
  """Where examples come from: a tfds dataset or an image folder."""
  class_names: tuple[str, ...]

  def examples(self, split: str, shard: int = 0, num_shards: int = 1) -> order.Records:
    """Shard `shard` of `num_shards` of `split` (disjoint, sizes within one), nothing decoded yet:
    {'record': tf.string}, and 'label' (int32) where the record does not hold it."""

  def load(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Replaces each example's 'record' by its decoded 'image' (uint8 [h, w, 3]) and its int32
    'label', keeping the rest."""


def _digits(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  return tfds_source.TfdsSource(digits.prepared_builder(config.data_dir), label_feature)


def _folder(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  if label_feature != 'label':
    raise ValueError(f"An image folder has one class an image, not a label feature {label_feature!r}: "
                     'read it from a tensorflow_datasets dataset that has it')
  if not config.data_dir:
    raise ValueError("config.dataset='folder' needs config.data_dir: set it to a root with "
                     f'{config.train_split}/ and {config.eval_split}/ sub-folders of class folders')
  return _listed_folder(config.data_dir, config.train_split)


@functools.lru_cache(maxsize=8)
def _listed_folder(root: str, train_split: str) -> folder.FolderSource:
  """One FolderSource per folder for a run: it lists each split once (it keeps the listing), where the
  run's info, its train stream and every evaluation would each list the folder again; 1,000 class
  folders on cloud storage take seconds to list. `get_info` starts a run, and lists afresh."""
  return folder.FolderSource(root, train_split)


def _tfds(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  return tfds_source.TfdsSource(tfds_source.prepared_builder(config.dataset, config.data_dir),
                                label_feature)


# config.dataset -> its Source, reading the given label feature; any other name is a
# tensorflow_datasets name. 'vtab/<task>': VTAB-1k's tasks (vtab.py).
SOURCES: dict[str, Callable[[ml_collections.ConfigDict, str], Source]] = {
    'digits': _digits,
    'folder': _folder,
    **vtab.SOURCES,
}


def make_source(config: ml_collections.ConfigDict, label_feature: str | None = None) -> Source:
  """The source named by config.dataset, its labels read from `label_feature` (a tfds feature;
  None: the run's); raises a one-line ValueError that says what to fix."""
  return SOURCES.get(config.dataset, _tfds)(config, label_feature or config.label_feature)


def _checked_source(config: ml_collections.ConfigDict, label_feature: str | None = None) -> Source:
  """The source of a validated data config, reading `label_feature` (None: the run's)."""
  if config.image_size < 1:
    raise ValueError(f'config.image_size={config.image_size} must be a positive number of pixels')
  if config.shuffle_buffer < 1:
    raise ValueError(f'config.shuffle_buffer={config.shuffle_buffer} must be >= 1 records')
  preprocess.check_pp(config.pp)
  preprocess.check_pp_eval(config.pp_eval)
  return make_source(config, label_feature)


def _train_source(config: ml_collections.ConfigDict) -> Source:
  """The source of the run's label feature, which it trains on: one class an image."""
  source = _checked_source(config)
  if isinstance(source, tfds_source.TfdsSource) and source.multi_label:
    raise ValueError(f'config.label_feature={config.label_feature!r} of dataset '
                     f'{config.dataset!r} is a set of classes an image (a Sequence of ClassLabel), '
                     'which a run cannot train on: set --config.label_feature to one of '
                     f'{list(source.class_label_features)} (label sets are for evaluators of '
                     "type='real')")
  return source


def get_info(config: ml_collections.ConfigDict) -> DatasetInfo:
  """Sizes and class names of config.label_feature; validates the data config (and prepares the
  digits if needed). A run starts here: an image folder is listed anew (a notebook may have added
  images since the last run)."""
  _listed_folder.cache_clear()
  source = _train_source(config)
  if isinstance(source, tfds_source.TfdsRecords):  # A bad split name names the field to set.
    for field in ('train_split', 'eval_split'):
      source.check_split(config[field], f'--config.{field}')
  return DatasetInfo(num_classes=len(source.class_names),
                     num_train=source.examples(config.train_split).num_records,
                     num_eval=source.examples(config.eval_split).num_records,
                     class_names=source.class_names)


def class_names(config: ml_collections.ConfigDict,
                label_feature: str | None = None) -> tuple[str, ...]:
  """The classes of config.dataset's `label_feature` (None: the run's), in label order; validates the
  data config."""
  return _checked_source(config, label_feature).class_names


def is_label_set(config: ml_collections.ConfigDict, label_feature: str) -> bool:
  """Whether config.dataset's `label_feature` is a set of classes an image (a Sequence of ClassLabel,
  e.g. imagenet2012_real's real_label), not one class an image."""
  source = _checked_source(config, label_feature)
  return isinstance(source, tfds_source.TfdsSource) and source.multi_label


def num_examples(config: ml_collections.ConfigDict, split: str,
                 label_feature: str | None = None) -> int:
  """Examples in `split` (e.g. 'test', or a tfds slice such as 'train[90%:]'), all hosts together;
  validates the data config, the label feature (None: the run's) and the split name."""
  return _checked_source(config, label_feature).examples(split).num_records


def listed_labels(config: ml_collections.ConfigDict, split: str) -> np.ndarray | None:
  """The label (of config.label_feature) of every example of `split` where the source lists them
  without reading the examples (an image folder's class folders); None where that would mean reading
  the split (tfds)."""
  records = _checked_source(config).examples(split)
  # Reading no records tells what a read lists; tfds' records hold their labels.
  if (not isinstance(records, order.RandomAccess)
      or 'label' not in records.read(tf.zeros([0], tf.int64))):
    return None
  return records.read(tf.range(records.num_records, dtype=tf.int64))['label'].numpy()


def num_eval_batches(num_eval: int, *, local_batch_size: int, process_count: int = 1) -> int:
  """Batches that eval_iterator yields on every host: enough for the largest host's shard."""
  largest_shard = -(-num_eval // process_count)  # Shards differ in size by at most one example.
  return -(-largest_shard // local_batch_size)


def _iterator_options() -> tf.data.Options:
  """The options of every iterator this module makes."""
  options = tf.data.Options()
  # Parallel maps must keep the order, whatever a global TF setting says, or batches would not repeat.
  options.deterministic = True
  # No autotuning thread: destroying an iterator joins it, and it can miss the cancellation and sleep
  # out its optimisation period (up to 60 s) first, at the end of a run or of an evaluation (seen in
  # TF 2.21). Each AUTOTUNE parallelism is then fixed at the cores this process may use, which is
  # autotuning's own ceiling (its default start is min(16, cores)).
  options.autotune.enabled = False
  options.autotune.initial_parallelism = (len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity')
                                          else os.cpu_count() or 1)
  return options


def _as_numpy(ds: tf.data.Dataset) -> Iterator[dict[str, np.ndarray]]:
  return ds.with_options(_iterator_options()).as_numpy_iterator()


def num_data_shards(config: ml_collections.ConfigDict, process_count: int) -> int:
  """Streams the train split is cut into: `config.data_shards`, or one per process if unset."""
  shards = config.data_shards or process_count
  if shards % process_count:
    raise ValueError(f'config.data_shards={shards} is not a multiple of the {process_count} processes: '
                     f'use a multiple, e.g. --config.data_shards={process_count}')
  return shards


def train_iterator(config: ml_collections.ConfigDict, *, local_batch_size: int,
                   start_step: int = 0, process_index: int = 0,
                   process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """This host's endless train batches {'image': float32 [b, H, W, 3] in [-1, 1], 'label': int32 [b]},
  the labels of config.label_feature.

  The split is cut into `num_data_shards` disjoint streams; each global batch is the concatenation of
  one equal slice from every stream, and a host reads only the streams of its slices. So the global
  batches depend on `config.data_shards`, not on how many hosts share the work: 1 process and 2
  processes with data_shards=2 train on the same batches.

  Batch k with `start_step=s` is bitwise batch s + k with `start_step=0`. (In an image folder with
  unreadable files, which are skipped when met, a resumed run is still deterministic but shifted by
  the files skipped before `start_step`.)
  """
  source = _train_source(config)
  _warn_of_class_ordered_windows(config, source)
  num_shards = num_data_shards(config, process_count)
  shards_per_process = num_shards // process_count
  if local_batch_size % shards_per_process:
    raise ValueError(f'The per-host batch {local_batch_size} does not split into {shards_per_process} '
                     f'data shards: make config.batch_size a multiple of config.data_shards={num_shards}')
  first = process_index * shards_per_process
  streams = tuple(
      _shard_stream(config, source, shard, num_shards, local_batch_size // shards_per_process,
                    start_step) for shard in range(first, first + shards_per_process))
  ds = streams[0] if len(streams) == 1 else tf.data.Dataset.zip(streams).map(
      lambda *batches: {k: tf.concat([b[k] for b in batches], axis=0) for k in batches[0]})
  return _as_numpy(ds.prefetch(tf.data.AUTOTUNE))


def _warn_of_class_ordered_windows(config: ml_collections.ConfigDict, source: Source) -> None:
  """Files tfds wrote unshuffled are often in class order; read in file order (TFRecord) through
  windows smaller than the split, they give batches of few classes: the run trains badly, and nothing
  fails."""
  if not (isinstance(source, tfds_source.TfdsRecords) and source.reads_unshuffled_files()):
    return
  num_train = source.examples(config.train_split).num_records
  if config.shuffle_buffer < num_train:
    logging.warning(
        'Dataset %r was prepared without shuffling (disable_shuffling: its records are often in class '
        'order) as TFRecord files, which are read in file order through windows of '
        'config.shuffle_buffer=%d of its %d train records, so a batch may hold few classes: raise '
        "--config.shuffle_buffer to >= %d, or prepare it with file_format='array_record' (`tfds build "
        '%s --file_format=array_record`), which vit_jax reads in a global random order',
        config.dataset, config.shuffle_buffer, num_train, num_train, config.dataset)


def _shard_stream(config: ml_collections.ConfigDict, source: Source, shard: int, num_shards: int,
                  batch_size: int, start_step: int) -> tf.data.Dataset:
  """Batches of data shard `shard` of `num_shards`, from step `start_step` on."""
  records = source.examples(config.train_split, shard, num_shards)
  if records.num_records < 1:
    raise ValueError(f'Split {config.train_split!r} has no examples for data shard {shard} of '
                     f'{num_shards}: use a larger split or fewer data shards')
  # Separate seeds for the order and for the augmentation, both specific to this shard's stream.
  shuffle_seed, augment_seed = tf.unstack(tf.random.experimental.stateless_split(
      tf.constant([config.seed, shard], tf.int64), 2))

  def augment(example):
    seed = tf.random.experimental.stateless_fold_in(augment_seed, example['position'])
    image = preprocess.train_preprocess(example['image'], seed, pp=config.pp,
                                        image_size=config.image_size)
    return {'image': image, 'label': example['label'], 'position': example['position']}

  start = start_step * batch_size
  ds = order.shuffled_stream(records, start=start, window_size=config.shuffle_buffer,
                             seed=shuffle_seed)
  ds = source.load(ds).map(as_written(augment), num_parallel_calls=tf.data.AUTOTUNE)
  return _without_positions(ds.batch(batch_size, drop_remainder=True), records, start,
                            lambda positions: order.records_at(records, positions, shuffle_seed))


def _without_positions(ds: tf.data.Dataset, records: order.Records, first: int,
                       records_at: Callable[[tf.Tensor], dict[str, tf.Tensor]]) -> tf.data.Dataset:
  """`ds` without 'position'; where a source may drop examples (random access: image folders), each
  dropped one is named in a warning (unreadable.py)."""
  if isinstance(records, order.RandomAccess):
    return unreadable.name_dropped(ds, first, lambda positions: records_at(positions)['record'])
  return ds.map(lambda element: {k: v for k, v in element.items() if k != 'position'})


def eval_iterator(config: ml_collections.ConfigDict, split: str, *, local_batch_size: int,
                  process_index: int = 0, process_count: int = 1,
                  label_feature: str | None = None) -> Iterator[dict[str, np.ndarray]]:
  """One unaugmented pass over this host's shard of `split`: full batches {'image', 'label', 'mask'}.

  `split` is any split of the dataset (e.g. config.eval_split, or config.train_split for few-shot
  features). 'mask' (bool [b]) is False on padding rows. Every host yields `num_eval_batches(...)`
  batches, so hosts with a smaller shard (or skipped unreadable files) still join every collective.
  Labels are of `label_feature`, by default (None) config.label_feature: callers that pass none (the
  few-shot evaluator) follow the run. A multi-label `label_feature` (a tfds Sequence of ClassLabel, as
  ImageNet-ReaL's 'real_label') gives 'labels' (multi-hot bool [b, classes]) instead of 'label'.
  """
  source = _checked_source(config, label_feature)
  num_batches = num_eval_batches(source.examples(split).num_records,
                                 local_batch_size=local_batch_size, process_count=process_count)

  def prepare(example):
    image = preprocess.eval_preprocess(example['image'], pp_eval=config.pp_eval,
                                       image_size=config.image_size)
    labels = {k: example[k] for k in ('label', 'labels') if k in example}
    return {'image': image, **labels, 'mask': tf.constant(True), 'position': example['position']}

  records = source.examples(split, process_index, process_count)
  ds = order.in_order(records).enumerate().map(lambda i, example: {**example, 'position': i})
  ds = source.load(ds).map(as_written(prepare), num_parallel_calls=tf.data.AUTOTUNE)
  # Padding rows: zeros (no labels) and mask False; their positions run on after the last example's.
  zeros = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), ds.element_spec)
  rows = num_batches * local_batch_size
  padding = tf.data.Dataset.range(records.num_records, records.num_records + rows).map(
      lambda i: {**zeros, 'position': i})
  ds = ds.concatenate(padding).take(rows).batch(local_batch_size)
  ds = _without_positions(ds, records, 0, records.read)
  return _as_numpy(ds.prefetch(tf.data.AUTOTUNE))
