"""Hugging Face datasets on disk as a source: `--config.dataset=huggingface --config.data_dir=DIR`.

DIR is a dataset repository downloaded from the hub (its Parquet, Arrow or WebDataset tar files, or
its image files; on local disk or cloud storage, gs://...), a folder of such files, or a local
`save_to_disk` directory; hf_layout.py finds its splits, format and features, and the format's
reader (hf_arrow.py, hf_webdataset.py, hf_imagefolder.py) reads its rows by index, as every
source's.

The image column is the Image feature (the one named 'image' where there are several); the label
column is config.label_feature: a ClassLabel (its names), integers (classes 0..the train split's
largest, named by number) or strings (the train split's, sorted); or a list of them an example (a set
of classes: multi-label).
"""

from typing import Any, Sequence

import numpy as np

from vit_jax.data import hf_arrow
from vit_jax.data import hf_imagefolder
from vit_jax.data import hf_features
from vit_jax.data import hf_layout
from vit_jax.data import hf_webdataset
from vit_jax.data import images
from vit_jax.data import label_sets
from vit_jax.data import order

# A record: ((split, row), label (a set's classes: a tuple), the reader of its image), the label at
# [1] as an image folder's (path, label).
Record = tuple[tuple[str, int], int | tuple[int, ...], Any]
# A format (hf_data_files.FORMATS) -> its reader: column_kinds(layout), and Rows(layout, image, label)
# (sizes, labels(split), image(split, row), describe(split, row); where it copies what it reads,
# reading(chosen), the Rows of those rows only, and their prepare()).
READERS = {
    'parquet': hf_arrow,
    'arrow': hf_arrow,
    'webdataset': hf_webdataset,
    'imagefolder': hf_imagefolder,
}


class HuggingFaceSource:
  """A Hugging Face dataset on disk (sources.Source): records are ((split, row), label)."""

  def __init__(self, root: str, train_split: str, label_feature: str):
    layout = hf_layout.read(root)
    # Not the layout, which pickles to every worker process: an image folder's lists each image.
    self._root = layout.root
    reader = READERS[layout.format]
    kinds = reader.column_kinds(layout)
    found = [n for n, kind in kinds.items() if kind == 'image']
    if not found:
      raise ValueError(f'Dataset {root} has no Image column (its columns: {list(kinds)})')
    self._image_column = 'image' if 'image' in found else found[0]
    self._label_kind = kinds.get(label_feature, '').removesuffix(hf_features.SET)
    # A list of labels an example: a set of classes ('labels', multi-hot).
    self.multi_label = kinds.get(label_feature, '').endswith(hf_features.SET)
    if self._label_kind not in hf_features.LABEL_KINDS:
      labels = [
          n
          for n, kind in kinds.items()
          if kind.removesuffix(hf_features.SET) in hf_features.LABEL_KINDS
      ]
      if not labels and layout.format == 'imagefolder':
        raise ValueError(
            f'Image folder {root} has no labels: datasets labels images by their folders only '
            'where they lie at one depth in two or more folders; put each class in '
            "<split>/<class>/, or give each image's label in a metadata.csv (file_name,label)"
        )
      raise ValueError(
          f'Dataset {root} has no label column {label_feature!r} (a ClassLabel, integers or '
          f"strings, or a list of them): set --config.label_feature (or the evaluator's "
          f'label_feature) to one of {labels}'
      )
    self._label_column = label_feature
    self._rows = reader.Rows(layout, self._image_column, label_feature)
    self._checked_labels = {}  # Split -> its int32 labels (label_sets.LabelSets of a set's).
    self.check_split(train_split, '--config.train_split')
    if self._label_kind == 'class_label':
      feature = _feature(layout.features, label_feature)
      self.class_names = tuple((hf_features.element_feature(feature) or feature)['names'])
    else:
      train = [self._rows.labels(name) for name, _ in self._parts(train_split)]
      train = np.concatenate([getattr(labels, 'values', labels) for labels in train])
      if self._label_kind == 'integer':
        self.class_names = tuple(str(i) for i in range(int(train.max(initial=-1)) + 1))
      else:
        self.class_names = tuple(sorted(set(train.tolist())))
    if not self.class_names:
      raise ValueError(f'Split {train_split!r} of dataset {root} has no labelled example')

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, '_checked_labels': {}}  # Records carry their labels.

  def _parts(self, split: str) -> list[tuple[str, np.ndarray]]:
    return order.split_indices(split, self._rows.sizes)

  def check_split(self, split: str, field: str) -> None:
    """A one-line ValueError naming the config `field` to set where `split` is not a split of the
    dataset or a slice of one."""
    try:
      self._parts(split)
    except ValueError as e:
      raise ValueError(
          f"{str(e).rstrip('.')}; set {field} to one of {list(self._rows.sizes)} or a "
          "slice of one, e.g. 'train[:90%]'"
      ) from None

  def _labels(self, split: str) -> np.ndarray | label_sets.LabelSets:
    """The int32 labels of every row of `split` (of a set's, each row's), checked to be classes of
    the train split."""
    if split not in self._checked_labels:
      raw = self._rows.labels(split)
      if isinstance(raw, label_sets.LabelSets):
        self._checked_labels[split] = raw.with_values(self._check_labels(split, raw.values))
      else:
        self._checked_labels[split] = self._check_labels(split, raw)
    return self._checked_labels[split]

  def _check_labels(self, split: str, raw: np.ndarray) -> np.ndarray:
    if self._label_kind == 'string':
      index = {name: label for label, name in enumerate(self.class_names)}
      unknown = sorted(set(raw.tolist()) - set(index))
      if unknown:
        raise ValueError(
            f'Split {split!r} of dataset {self._root} has labels that no train example '
            f'has: {unknown[:5]}; train on a split with every class'
        )
      return np.array([index[name] for name in raw.tolist()], np.int32)
    bad = raw[(raw < 0) | (raw >= len(self.class_names))]
    if bad.size:
      raise ValueError(
          f'Split {split!r} of dataset {self._root} has {bad.size} labels that are not '
          f'one of its {len(self.class_names)} classes (e.g. {int(bad[0])}; -1 marks an '
          'unlabelled example): use a labelled split, or drop those rows'
      )
    return raw.astype(np.int32)

  def split_labels(self, split: str) -> np.ndarray | label_sets.LabelSets:
    """The int32 label (of a set's, the classes) of every example of `split` (a slice too), read
    without an image."""
    return _concatenate([self._labels(name)[rows] for name, rows in self._parts(split)])

  def examples(
      self, split: str, shard: int = 0, num_shards: int = 1, with_shards: Sequence[int] = ()
  ) -> order.Records:
    """Shard `shard` of `num_shards` of `split` (strided, so each holds every class); a Parquet
    split's copy is of the rows of it and of `with_shards` (sources.Source)."""
    parts = self._parts(split)
    names = tuple(name for name, _ in parts)
    # Each worker process gets a copy of these arrays: 2 + 4 + 4 bytes a record of the shard.
    part = np.concatenate([np.full(len(rows), i, np.uint16) for i, (_, rows) in enumerate(parts)])
    rows = np.concatenate([rows for _, rows in parts]).astype(np.int32)
    reader = self._rows
    if hasattr(reader, 'reading'):
      # The images of the shards read together are all the records read: one copy of them.
      read = np.sort(
          np.concatenate([np.arange(s, len(rows), num_shards) for s in {shard, *with_shards}])
      )
      read_part, read_rows = part[read], rows[read]
      ends = np.searchsorted(read_part, np.arange(len(parts)), 'right')  # Each part's, in turn.
      chosen = {}
      for name, start, end in zip(names, (0, *ends[:-1]), ends):
        chosen[name] = np.concatenate([chosen.get(name, rows[:0]), read_rows[start:end]])
      reader = reader.reading(chosen)
    labels = _concatenate([self._labels(name)[rows] for name, rows in parts])
    part, rows, labels = part[shard::num_shards], rows[shard::num_shards], labels[shard::num_shards]
    prepare = getattr(reader, 'prepare', None)
    return order.Records(len(rows), _Rows(names, part, rows, labels, reader), prepare)

  def load(self, record: Record) -> dict[str, np.ndarray]:
    """The record's image (to be decoded upright, as datasets turns an image with an EXIF
    orientation), and its label; `images.UnreadableImage` if it has none."""
    (split, row), label, reader = record
    image = images.Encoded(reader.image(split, row), exif_orientation=True)
    if self.multi_label:
      return {'image': image, 'labels': label_sets.multi_hot(list(label), len(self.class_names))}
    return {'image': image, 'label': np.int32(label)}

  def describe(self, record: Record) -> str:
    (split, row), _, _ = record
    return self._rows.describe(split, row)


def _concatenate(parts: list) -> np.ndarray | label_sets.LabelSets:
  if isinstance(parts[0], label_sets.LabelSets):
    return label_sets.concatenate(parts)
  return np.concatenate(parts)


def _feature(features: dict[str, Any], name: str) -> dict[str, Any]:
  """The feature `name` of `features`: a column's, or a struct's field's ('column.field')."""
  if name in features or '.' not in name:
    return features[name]
  column, _, field = name.partition('.')
  return _feature(features[column], field)


class _Rows:
  """Record k of a shard. A class, not a closure, so that it pickles by value."""

  def __init__(
      self,
      names: tuple[str, ...],
      part: np.ndarray,
      rows: np.ndarray,
      labels: np.ndarray | label_sets.LabelSets,
      reader: Any,
  ):
    self._names = names
    self._part = part
    self._rows = rows
    self._labels = labels
    self._reader = reader

  def __call__(self, k: int) -> Record:
    label = self._labels[k]
    label = tuple(label.tolist()) if isinstance(label, np.ndarray) else int(label)
    return (self._names[self._part[k]], int(self._rows[k])), label, self._reader
