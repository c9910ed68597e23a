"""Datasets prepared by tensorflow_datasets (and the bundled digits, which is one)."""
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import order
from vit_jax.data.as_written import as_written
from vit_jax.data import preprocess

UNKNOWN_DATASET = (
    "Unknown dataset {name!r}: use 'digits' (bundled, offline), 'folder' (set config.data_dir to a "
    "root with train/ and test/ sub-folders of class folders), or a tensorflow_datasets name such as "
    "cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012, imagenet21k "
    "(see tfds.list_builders())")


def prepared_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """The builder of tfds dataset `name` (e.g. 'cifar10', 'imagenet2012:5.1.0') already prepared in
  `data_dir`; raises a one-line ValueError saying how to fix it otherwise. Never downloads."""
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    raise ValueError(UNKNOWN_DATASET.format(name=name)) from None
  except (AssertionError, ValueError) as e:  # A version or config tfds does not know.
    first_line = str(e).strip().splitlines()[0]
    raise ValueError(f'Cannot load tensorflow_datasets dataset {name!r}: {first_line}') from None
  if not builder.is_prepared():
    root = builder.data_dir_root
    raise ValueError(
        f'tensorflow_datasets dataset {name!r} is not prepared in {root}: run '
        f'`tfds build {name} --data_dir={root}` on a machine with internet (some datasets, e.g. '
        f'imagenet2012, need a manual download first) and copy {root}/{builder.name} here, or set '
        f'config.data_dir to where it is prepared')
  return builder


class TfdsRecords:
  """The serialized examples of a prepared tfds dataset, by split and data shard.

  Records are read from the prepared files directly: by index where the dataset was prepared as
  ArrayRecord (random access: train shards are strided, so each holds every class even when the files
  are in class order), in file order where it was prepared as TFRecord (shards are contiguous ranges,
  the `tfds.split_for_jax_process` layout).

  A split may be a tfds slice, e.g. 'train[:90%]' to train on and 'train[90%:]' as a held-out
  minival, or a sum of them ('train[:800]+validation[:200]'). tfds shuffles the examples when it
  prepares a dataset (unless its builder disables that), so a slice is a random sample of the split.
  """

  def __init__(self, builder: tfds.core.DatasetBuilder):
    self._builder = builder
    self._random_access = builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD
    self._data_sources = {}

  def _split_info(self, split: str, field: str | None = None) -> tfds.core.SplitInfo:
    try:
      return self._builder.info.splits[split]
    except ValueError as e:  # tfds: "Unknown split 'x'. Should be one of [...]." or a bad slice.
      first_line = str(e).strip().splitlines()[0]
      error = f'Bad split {split!r} for dataset {self._builder.name!r}: {first_line}'
      if field is None:
        raise ValueError(error) from None
      names = list(self._builder.info.splits)
      raise ValueError(f"{error.rstrip('.')}; set {field} to one of {names} or a slice of one, e.g. "
                       f"'{names[0]}[:90%]'") from None

  def check_split(self, split: str, field: str) -> None:
    """A one-line ValueError naming the config `field` to set (e.g. '--config.eval_split') where
    `split` is not a split of the dataset or a slice of one."""
    self._split_info(split, field)

  def reads_unshuffled_files(self) -> bool:
    """Whether splits are read in file order from files tfds wrote without shuffling them
    (builder.info.disable_shuffling): their records are often in class order."""
    return not self._random_access and self._builder.info.disable_shuffling

  def _data_source(self, split: str):
    """The split's ArrayRecord files, opened on the first read (counting examples opens nothing)."""
    if split not in self._data_sources:
      self._data_sources[split] = self._builder.as_data_source(
          split=split, deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES)
    return self._data_sources[split]

  def _indexed(self, split: str, shard: int, num_shards: int) -> order.RandomAccess:
    num_examples = self._split_info(split).num_examples

    def read_serialized(indices: np.ndarray) -> np.ndarray:
      return np.array(self._data_source(split).__getitems__(indices.tolist()), dtype=object)

    def read(indices: tf.Tensor) -> dict[str, tf.Tensor]:
      records = tf.numpy_function(read_serialized, [shard + num_shards * indices], tf.string,
                                  stateful=False)
      return {'record': tf.ensure_shape(records, indices.shape)}

    return order.RandomAccess(len(range(shard, num_examples, num_shards)), read)

  def _files(self, split: str, shard: int, num_shards: int) -> order.Records:
    # Shard `shard` is a contiguous range of the split's records in file order, the ranges' sizes
    # within one (the first ones larger): tfds.split_for_jax_process's layout for a split or one slice
    # of it. tfds.even_splits cuts each part of a sum ('train[:801]+validation[:201]') on its own, so
    # its shards could differ by one example a part, and eval_iterator, which pads every host to the
    # largest shard of an even cut, would drop the examples beyond it.
    instructions = [i for i in self._split_info(split).file_instructions if i.take > 0]
    total = sum(i.take for i in instructions)
    size, larger = divmod(total, num_shards)
    start = shard * size + min(shard, larger)
    end = start + size + (shard < larger)
    blocks = []  # (filename, skip, take) of each file's part in [start, end).
    first_of_file = 0  # Position in the split of the file instruction's first record.
    for i in instructions:
      lo, hi = max(start, first_of_file), min(end, first_of_file + i.take)
      if lo < hi:
        blocks.append((i.filename, i.skip + lo - first_of_file, hi - lo))
      first_of_file += i.take
    if not blocks:
      return order.RandomAccess(0, lambda indices: {'record': tf.fill(tf.shape(indices), '')})
    filenames, skips, takes = (tf.constant(column) for column in zip(*blocks))

    def read(block: tf.Tensor) -> tf.data.Dataset:
      ds = tf.data.TFRecordDataset(filenames[block]).skip(tf.cast(skips[block], tf.int64))
      return ds.take(tf.cast(takes[block], tf.int64)).map(lambda record: {'record': record})

    return order.Blocks(tuple(take for _, _, take in blocks), read)

  def examples(self, split: str, shard: int = 0, num_shards: int = 1) -> order.Records:
    """Shard `shard` of `num_shards` (disjoint, sizes within one) of `split`, as serialized examples."""
    self._split_info(split)  # A one-line error for a bad split name, before it is sharded.
    if self._random_access:
      return self._indexed(split, shard, num_shards)
    return self._files(split, shard, num_shards)


class TfdsSource(TfdsRecords):
  """A prepared tfds dataset with an 'image' feature and a label feature, by default 'label'.

  The label feature is a ClassLabel (one class an image: 'label', int32) or a Sequence of ClassLabel
  (a set of classes an image, as ImageNet-ReaL's 'real_label': 'labels', multi-hot bool [classes]).
  """

  def __init__(self, builder: tfds.core.DatasetBuilder, label_feature: str = 'label'):
    features = dict(builder.info.features)
    if not isinstance(features.get('image'), tfds.features.Image):
      raise ValueError(f'Dataset {builder.name!r} has features {sorted(features)}: vit_jax needs an '
                       "Image feature 'image'")
    # The features a run can train on (one class an image), and label sets (evaluators only).
    self.class_label_features = tuple(sorted(
        k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel)))
    label_sets = sorted(k for k, f in features.items() if isinstance(f, tfds.features.Sequence)
                        and isinstance(f.feature, tfds.features.ClassLabel))
    if label_feature not in self.class_label_features + tuple(label_sets):
      raise ValueError(
          f'Dataset {builder.name!r} has no ClassLabel (or Sequence of ClassLabel) feature '
          f'{label_feature!r}: set --config.label_feature (or the evaluator\'s label_feature) to one '
          f'of its ClassLabel features {list(self.class_label_features)}'
          + (f' or label sets {label_sets}' if label_sets else ''))
    super().__init__(builder)
    self._label_feature = label_feature
    self.multi_label = label_feature in label_sets  # 'labels' (multi-hot), not 'label'.
    label = features[label_feature]
    self.class_names = tuple((label.feature if self.multi_label else label).names)

  def load(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Parses each 'record' into its decoded 'image' (uint8 [h, w, 3]) and its 'label' (int32), or
    for a Sequence label feature its 'labels' (multi-hot bool [classes]; none set for an image
    without labels)."""
    features = self._builder.info.features
    num_classes = len(self.class_names)

    def parse(example):
      rest = {k: v for k, v in example.items() if k != 'record'}
      parsed = features.deserialize_example(
          example['record'], decoders={'image': tfds.decode.SkipDecoding()})
      label = tf.cast(parsed[self._label_feature], tf.int32)
      if self.multi_label:
        counts = tf.math.bincount(label, minlength=num_classes, maxlength=num_classes)
        labels = {'labels': tf.ensure_shape(counts, [num_classes]) > 0}
      else:
        labels = {'label': label}
      return {**rest, 'image': preprocess.decode(parsed['image']), **labels}
    return ds.map(as_written(parse), num_parallel_calls=tf.data.AUTOTUNE)
