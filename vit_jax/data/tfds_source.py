"""Datasets prepared by tensorflow_datasets as ArrayRecord, read without TensorFlow.

Examples are read by index from the prepared ArrayRecord files (`builder.as_data_source`), parsed
with tfds' numpy parser, and their images decoded by PIL where the crop needs them. A dataset prepared
as TFRecord (tfds' default file format) is readable in order only, and only by TensorFlow:
`to_array_record` converts it once, with TensorFlow (`pip install '.[tfrecord]'`), writing the
ArrayRecord files beside the TFRecord ones.
"""

import functools
import os
from typing import Any, NamedTuple, Sequence

from array_record.python import array_record_module
from etils import epath
from google.protobuf import json_format
import numpy as np
import tensorflow_datasets as tfds

from vit_jax.runtime import cli
from vit_jax.data import images
from vit_jax.data import order

# tfds reads a dataset it has no builder for (imagenet21k, one's own) from the folder it was prepared
# in, so an unknown name may only be a data_dir away.
UNKNOWN_DATASET = (
    'Unknown dataset {name!r}: tensorflow_datasets has no builder of that name and none is prepared '
    "in {root}: set config.data_dir to where it is prepared, or use 'digits' (bundled, offline), "
    "'folder' (set config.data_dir to a root with train/ and test/ sub-folders of class folders), "
    "'huggingface' (set config.data_dir to a Hugging Face dataset on disk), or a tensorflow_datasets "
    'name such as cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012 '
    '(see tfds.list_builders())'
)

# The command that runs `convert_main` (vit_jax/tools/to_array_record.py).
CONVERT_COMMAND = 'python -m vit_jax.tools.to_array_record'
CONVERT_USAGE = (
    f'{CONVERT_COMMAND} DATASET_DIR (a prepared version folder, e.g. ' 'DATA_DIR/cifar10/3.0.2)'
)
_ARRAY_RECORD = tfds.core.FileFormat.ARRAY_RECORD


def prepared_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """The builder of tfds dataset `name` (e.g. 'cifar10', 'imagenet2012:5.1.0') already prepared in
  `data_dir`; raises a one-line ValueError saying how to fix it otherwise. Never downloads."""
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    root = data_dir or tfds.core.constants.DATA_DIR
    raise ValueError(UNKNOWN_DATASET.format(name=name, root=root)) from None
  except (AssertionError, ValueError) as e:  # A version or config tfds does not know.
    first_line = str(e).strip().splitlines()[0]
    raise ValueError(f'Cannot load tensorflow_datasets dataset {name!r}: {first_line}') from None
  if not builder.is_prepared():
    root = builder.data_dir_root
    raise ValueError(
        f'tensorflow_datasets dataset {name!r} is not prepared in {root}: run '
        f'`tfds build {name} --data_dir={root} --file_format=array_record` on a machine with '
        f'internet (some datasets, e.g. imagenet2012, need a manual download first) and copy '
        f'{root}/{builder.name} here, or set config.data_dir to where it is prepared'
    )
  return builder


class Example(NamedTuple):
  """A record: example `index` of `split` (the split as the source was asked for it, a slice or a
  sum of them), serialized as tfds wrote it."""

  split: str
  index: int
  serialized: bytes


class TfdsRecords:
  """The serialized examples of a dataset prepared as ArrayRecord, by split and data shard.

  A split may be a tfds slice, e.g. 'train[:90%]' to train on and 'train[90%:]' as a held-out
  minival, or a sum of them ('train[:800]+validation[:200]'). tfds shuffles the examples when it
  prepares a dataset (unless its builder disables that), so a slice is a random sample of the split.
  Shards are strided (record k of shard s is example s + k * num_shards of the split), so each holds
  every class even where the files are in class order.

  Pickles without its open files (grain's worker processes reopen them on their first read).
  """

  def __init__(self, builder: tfds.core.DatasetBuilder):
    # A format added by a conversion (`to_array_record`, `tfds convert_format`) is listed in
    # dataset_info.json's alternative formats, which a registered builder (tfds.builder('cifar10'))
    # reads into its proto only, not into available_file_formats().
    formats = {f.value for f in builder.info.available_file_formats()}
    formats |= set(builder.info.as_proto.alternative_file_formats)
    if _ARRAY_RECORD.value not in formats:
      prepared_as = ', '.join(sorted(formats)) or 'no known file format'
      raise ValueError(
          f'tensorflow_datasets dataset {builder.name!r} in {builder.data_dir} is prepared as '
          f'{prepared_as}, and vit_jax reads only ArrayRecord: convert it once (the ArrayRecord '
          f"files go beside the others) with `pip install '.[tfrecord]'` (TensorFlow, to read "
          f'them) and `{CONVERT_COMMAND} {builder.data_dir}`'
      )
    self._builder = builder
    self._data_sources = {}

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, '_data_sources': {}}

  def _split_info(self, split: str, field: str | None = None) -> tfds.core.SplitInfo:
    try:
      return self._builder.info.splits[split]
    except ValueError as e:  # tfds: "Unknown split 'x'. Should be one of [...]." or a bad slice.
      first_line = str(e).strip().splitlines()[0]
      error = f'Bad split {split!r} for dataset {self._builder.name!r}: {first_line}'
      if field is None:
        raise ValueError(error) from None
      names = list(self._builder.info.splits)
      raise ValueError(
          f"{error.rstrip('.')}; set {field} to one of {names} or a slice of one, e.g. "
          f"'{names[0]}[:90%]'"
      ) from None

  def check_split(self, split: str, field: str) -> None:
    """A one-line ValueError naming the config `field` to set (e.g. '--config.eval_split') where
    `split` is not a split of the dataset or a slice of one."""
    self._split_info(split, field)

  def _data_source(self, split: str):
    """The split's ArrayRecord files, opened on the first read (counting examples opens nothing)."""
    if split not in self._data_sources:
      info = self._builder.info
      if info.file_format != _ARRAY_RECORD:  # A converted dataset (see __init__).
        # As as_data_source itself switches to a random-access format that it sees.
        info.set_file_format(_ARRAY_RECORD, override=True, override_if_initialized=True)
      self._data_sources[split] = self._builder.as_data_source(
          split=split,
          deserialize_method=tfds.decode.DeserializeMethod.RAW_BYTES,
          file_format=_ARRAY_RECORD,
      )
    return self._data_sources[split]

  def _read(self, split: str, shard: int, num_shards: int, k: int) -> Example:
    index = shard + k * num_shards
    return Example(split, index, self._data_source(split)[index])

  def examples(
      self, split: str, shard: int = 0, num_shards: int = 1, with_shards: Sequence[int] = ()
  ) -> order.Records:
    """Shard `shard` of `num_shards` (disjoint, sizes within one) of `split`, as `Example`s."""
    del with_shards  # Each record is read where it is.
    num_examples = self._split_info(split).num_examples
    return order.Records(
        len(range(shard, num_examples, num_shards)),
        functools.partial(self._read, split, shard, num_shards),
    )

  def describe(self, record: Example) -> str:
    """The record as a warning names it."""
    return f'example {record.index} of split {record.split} of {self._builder.name}'

  def _deserialize(self, record: Example) -> dict[str, Any]:
    """The record's features as numpy values, with every image feature left as its encoded bytes:
    only 'image' is decoded, by PIL (smallNORB's second camera and Pets' masks are never looked
    at)."""
    features = self._builder.info.features
    undecoded = {
        name: tfds.decode.SkipDecoding()
        for name, feature in features.items()
        if isinstance(feature, tfds.features.Image)
    }
    return features.deserialize_example_np(record.serialized, decoders=undecoded)


class TfdsSource(TfdsRecords):
  """A prepared tfds dataset with an 'image' feature and a label feature, by default 'label'.

  The label feature is a ClassLabel (one class an image: 'label', int32) or a Sequence of ClassLabel
  (a set of classes an image, as ImageNet-ReaL's 'real_label': 'labels', multi-hot bool [classes]).
  """

  def __init__(self, builder: tfds.core.DatasetBuilder, label_feature: str = 'label'):
    features = dict(builder.info.features)
    if not isinstance(features.get('image'), tfds.features.Image):
      raise ValueError(
          f'Dataset {builder.name!r} has features {sorted(features)}: vit_jax needs an '
          "Image feature 'image'"
      )
    # One class an image, and label sets (a run trains on them with sigmoid_xent; evaluators of type
    # 'real').
    self.class_label_features = tuple(
        sorted(k for k, f in features.items() if isinstance(f, tfds.features.ClassLabel))
    )
    label_sets = sorted(
        k
        for k, f in features.items()
        if isinstance(f, tfds.features.Sequence) and isinstance(f.feature, tfds.features.ClassLabel)
    )
    if label_feature not in self.class_label_features + tuple(label_sets):
      raise ValueError(
          f'Dataset {builder.name!r} has no ClassLabel (or Sequence of ClassLabel) feature '
          f"{label_feature!r}: set --config.label_feature (or the evaluator's label_feature) to one "
          f'of its ClassLabel features {list(self.class_label_features)}'
          + (f' or label sets {label_sets}' if label_sets else '')
      )
    super().__init__(builder)
    self._label_feature = label_feature
    self.multi_label = label_feature in label_sets  # 'labels' (multi-hot), not 'label'.
    label = features[label_feature]
    self.class_names = tuple((label.feature if self.multi_label else label).names)

  def load(self, record: Example) -> dict[str, np.ndarray]:
    """The record's 'image' (`images.Encoded`) and its 'label' (int32), or for a Sequence label
    feature its 'labels' (multi-hot bool [classes]; none set for an image without labels)."""
    parsed = self._deserialize(record)
    label = parsed[self._label_feature]
    if self.multi_label:
      labels = np.zeros(len(self.class_names), bool)
      labels[np.asarray(label, np.int64)] = True
      return {'image': images.Encoded(parsed['image']), 'labels': labels}
    return {'image': images.Encoded(parsed['image']), 'label': np.int32(label)}


def to_array_record(dataset_dir: str) -> bool:
  """Writes an ArrayRecord copy of the TFRecord files of the dataset prepared in `dataset_dir` (a
  version folder, e.g. DATA_DIR/cifar10/3.0.2) beside them, and adds the format to its
  dataset_info.json, as `tfds convert_format` does (which needs apache-beam even without Beam).

  Returns False where the dataset has ArrayRecord files already. Reading TFRecord files needs
  TensorFlow (`pip install '.[tfrecord]'`); raises a one-line ValueError without it, or where
  `dataset_dir` holds no prepared dataset.
  """
  # A wrong path is said before a missing TensorFlow: installing it would not help.
  if not (epath.Path(dataset_dir) / 'dataset_info.json').exists():
    raise ValueError(
        f'No prepared tensorflow_datasets dataset in {dataset_dir}: give its version '
        'folder, the one with dataset_info.json (e.g. DATA_DIR/cifar10/3.0.2)'
    )
  try:  # A vit_jax workdir, a Hugging Face save_to_disk folder: a dataset_info.json of their own.
    info = tfds.builder_from_directory(dataset_dir).info
  except json_format.ParseError as e:
    raise ValueError(
        f'{dataset_dir}/dataset_info.json is not the one tensorflow_datasets writes ('
        f'{str(e).splitlines()[0]}): give the version folder of a dataset tfds prepared'
    ) from None
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top: only this conversion needs it.
  except ImportError:
    raise ValueError("Reading TFRecord files needs TensorFlow: pip install '.[tfrecord]'") from None
  if _ARRAY_RECORD in info.available_file_formats():
    return False
  for split in info.splits.values():
    template = split.filename_template
    for shard in range(split.num_shards):
      source = template.sharded_filepath(shard_index=shard, num_shards=split.num_shards)
      target = template.replace(filetype_suffix=_ARRAY_RECORD.file_suffix).sharded_filepath(
          shard_index=shard, num_shards=split.num_shards
      )
      # Written under another name and renamed once whole: an interrupted conversion leaves no file
      # that reads as a shard.
      partial = f'{target}.incomplete'
      writer = array_record_module.ArrayRecordWriter(partial, 'group_size:1')  # As tfds writes it.
      for serialized in tf.data.TFRecordDataset(os.fspath(source)).as_numpy_iterator():
        writer.write(serialized)
      writer.close()
      os.replace(partial, target)
  info.add_alternative_file_format(_ARRAY_RECORD)
  info.write_dataset_info_json(dataset_dir)
  return True


def convert_main(argv: list[str]) -> None:
  """`CONVERT_USAGE`: to_array_record as a command (for vit_jax.runtime.cli.run)."""
  if len(argv) != 2:
    cli.fail(f'give one dataset folder: use {CONVERT_USAGE}')
  try:
    written = to_array_record(argv[1])
  except ValueError as e:
    cli.fail(str(e))
  print(f'{argv[1]}: {"ArrayRecord files written" if written else "has ArrayRecord files already"}')
