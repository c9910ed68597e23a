"""Hugging Face datasets on disk as a source: `--config.dataset=huggingface --config.data_dir=DIR`.

DIR is a dataset repository downloaded from the hub (its Parquet files; on local disk or cloud
storage, gs://...) or a local `save_to_disk` directory; hf_layout.py finds its splits and features.
Records are read by index, as every source's: Arrow files are memory-mapped (one copy in the page
cache for every worker process), and a split's Parquet files, whose rows are compressed in groups,
are copied once into one uncompressed Arrow file of the image and label columns in
$VIT_JAX_DATASETS_CACHE (default $XDG_CACHE_HOME/vit_jax/datasets, ~/.cache/...), as
`datasets.load_dataset` copies them into its cache; a changed Parquet file (size or modification
time) is copied again.

The image column is the Image feature (the one named 'image' where there are several); the label
column is config.label_feature: a ClassLabel (its names), integers (classes 0..the train split's
largest, named by number) or strings (the train split's, sorted).
"""

import hashlib
import json
import os
import shutil
import uuid
from typing import Any

from absl import logging
from etils import epath
import numpy as np

from vit_jax.data import hf_layout
from vit_jax.data import images
from vit_jax.data import order
from vit_jax.runtime import paths

# A record: ((split, row), label), the label at [1] as an image folder's (path, label).
Record = tuple[tuple[str, int], int]
# Where converted Parquet splits go; the tests set theirs.
CACHE_VARIABLE = 'VIT_JAX_DATASETS_CACHE'
_ROWS_PER_BATCH = 256  # Rows a record batch of a converted file: the images of one Parquet read.


def _cache_dir() -> str:
  return os.environ.get(CACHE_VARIABLE) or paths.user_cache('datasets')


def _open_arrow(path: str):
  """The table of an Arrow file (datasets writes the stream format), memory-mapped."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  # Only these datasets need it.

  try:
    source = pa.memory_map(path)
    try:
      return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
      return pa.ipc.open_file(source).read_all()
  except (pa.ArrowException, OSError) as e:
    raise ValueError(
        f'{path} is not a readable Arrow file ({str(e).strip().splitlines()[0]}): write the '
        'dataset again with save_to_disk'
    ) from None


def _size_and_time(path: str) -> tuple[int, float]:
  """A file's size in bytes and its modification time, on local disk or cloud storage."""
  if paths.is_url(path):
    stat = epath.Path(path).stat()
    return stat.length, stat.mtime
  stat = os.stat(path)
  return stat.st_size, stat.st_mtime_ns


def cache_path(files: tuple[str, ...], columns: list[str]) -> str:
  """Where the copy of `columns` of Parquet `files` goes: named by their paths, sizes and times."""
  stats = [(paths.absolute(f), *_size_and_time(f)) for f in files]
  key = hashlib.sha256(json.dumps([stats, columns]).encode()).hexdigest()[:24]
  return os.path.join(_cache_dir(), f'{key}.arrow')


def _converted(files: tuple[str, ...], columns: list[str], what: str) -> str:
  """The cached Arrow file of `columns` of Parquet `files`; written on the first call. The processes
  of a run on one machine (launch/local.py) take turns: one copies, the others then find its copy.
  """
  import filelock  # pylint: disable=g-import-not-at-top

  path = cache_path(files, columns)
  if os.path.exists(path):
    return path
  os.makedirs(_cache_dir(), exist_ok=True)
  with filelock.FileLock(os.path.join(_cache_dir(), '.lock')):
    if not os.path.exists(path):
      needed = sum(_size_and_time(f)[0] for f in files)
      free = shutil.disk_usage(_cache_dir()).free
      if needed > free:  # The copy is uncompressed: at least the Parquet files' size.
        raise ValueError(
            f'Reading {what} needs a copy of its {needed / 1e9:.1f} GB of Parquet files in '
            f'{_cache_dir()}, which has {free / 1e9:.1f} GB free: set {CACHE_VARIABLE} to a '
            'folder on a disk with room'
        )
      logging.info(
          'Copying %s (%d Parquet files, %.1f MB) into one Arrow file in %s, once, to read it '
          'by row',
          what,
          len(files),
          needed / 1e6,
          _cache_dir(),
      )
      _copy(files, columns, path)
  return path


def _copy(files: tuple[str, ...], columns: list[str], path: str) -> None:
  """`columns` of Parquet `files` into Arrow file `path`, which exists only once it is whole."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  partial = f'{path}.{os.getpid()}-{uuid.uuid4().hex}.partial'
  schema = hf_layout.parquet_file(files[0]).schema_arrow
  schema = pa.schema([schema.field(c) for c in columns])
  try:
    with pa.OSFile(partial, 'wb') as sink, pa.ipc.new_stream(sink, schema) as writer:
      for f in files:
        try:
          for batch in hf_layout.parquet_file(f).iter_batches(_ROWS_PER_BATCH, columns=columns):
            # A shard may have written its labels narrower (int32 for int64): one schema a file.
            writer.write_batch(batch if batch.schema == schema else batch.cast(schema))
        except (pa.ArrowException, OSError) as e:  # A file damaged past its footer.
          raise hf_layout.unreadable_parquet(f, e) from None
    os.replace(partial, path)
  finally:
    if os.path.exists(partial):
      os.remove(partial)


def _column_type(feature: dict[str, Any] | None, arrow_type) -> str:
  """'image', 'class_label', 'integer', 'string', or '' for a column no run reads."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  kind = (feature or {}).get('_type')
  if kind == 'Image':
    return 'image'
  if kind == 'ClassLabel':
    return 'class_label'
  if pa.types.is_integer(arrow_type):
    return 'integer'
  if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
    return 'string'
  if kind is None and pa.types.is_struct(arrow_type):
    names = {arrow_type.field(i).name for i in range(arrow_type.num_fields)}
    return 'image' if names == {'bytes', 'path'} else ''
  return ''


class HuggingFaceSource:
  """A Hugging Face dataset on disk (sources.Source): records are ((split, row), label)."""

  def __init__(self, root: str, train_split: str, label_feature: str):
    self._layout = layout = hf_layout.read(root)
    first = next(iter(layout.splits.values()))[0]
    schema = (
        _open_arrow(first).schema if layout.arrow else hf_layout.parquet_file(first).schema_arrow
    )
    kinds = {n: _column_type(layout.features.get(n), schema.field(n).type) for n in schema.names}
    found = [n for n, kind in kinds.items() if kind == 'image']
    if not found:
      raise ValueError(f'Dataset {root} has no Image column (its columns: {schema.names})')
    self._image_column = 'image' if 'image' in found else found[0]
    self._label_kind = kinds.get(label_feature, '')
    if self._label_kind not in ('class_label', 'integer', 'string'):
      labels = [n for n, kind in kinds.items() if kind in ('class_label', 'integer', 'string')]
      raise ValueError(
          f'Dataset {root} has no label column {label_feature!r} (a ClassLabel, integers or '
          f'strings): set --config.label_feature to one of {labels}'
      )
    self._label_column = label_feature
    # Each split's rows, counted once: a Parquet file's count is a read of its footer.
    self._sizes = {
        name: sum(hf_layout.parquet_file(f).metadata.num_rows for f in files)
        for name, files in layout.splits.items()
        if not layout.arrow
    }
    self._tables = {}  # Split -> its table, opened at its first read.
    self._images = {}  # Split -> its image column (a lookup by name costs 70 us over 5,000 chunks).
    self._checked_labels = {}  # Split -> its int32 labels.
    self.check_split(train_split, '--config.train_split')
    if self._label_kind == 'class_label':
      self.class_names = tuple(layout.features[label_feature]['names'])
    else:
      train = np.concatenate([self._raw_labels(name) for name, _ in self._parts(train_split)])
      if self._label_kind == 'integer':
        self.class_names = tuple(str(i) for i in range(int(train.max(initial=-1)) + 1))
      else:
        self.class_names = tuple(sorted(set(train.tolist())))
    if not self.class_names:
      raise ValueError(f'Split {train_split!r} of dataset {root} has no labelled example')

  def __getstate__(self) -> dict[str, Any]:
    # Memory maps are opened again by each process; records carry their labels.
    return {**self.__dict__, '_tables': {}, '_images': {}, '_checked_labels': {}}

  def _parts(self, split: str) -> list[tuple[str, np.ndarray]]:
    if not self._sizes:  # save_to_disk's Arrow files: their memory-mapped tables count them.
      self._sizes = {name: self._table(name).num_rows for name in self._layout.splits}
    return order.split_indices(split, self._sizes)

  def check_split(self, split: str, field: str) -> None:
    """A one-line ValueError naming the config `field` to set where `split` is not a split of the
    dataset or a slice of one."""
    try:
      self._parts(split)
    except ValueError as e:
      raise ValueError(
          f"{str(e).rstrip('.')}; set {field} to one of {list(self._layout.splits)} or a "
          "slice of one, e.g. 'train[:90%]'"
      ) from None

  def _table(self, split: str):
    if split not in self._tables:
      files = self._layout.splits[split]
      if not self._layout.arrow:
        columns = [self._image_column, self._label_column]
        files = (_converted(files, columns, f'split {split!r} of {self._layout.root}'),)
      import pyarrow as pa  # pylint: disable=g-import-not-at-top

      self._tables[split] = pa.concat_tables([_open_arrow(f) for f in files])
      self._images[split] = self._tables[split].column(self._image_column)
    return self._tables[split]

  def _raw_labels(self, split: str) -> np.ndarray:
    column = self._table(split).column(self._label_column)
    if column.null_count:
      raise ValueError(
          f'Split {split!r} of dataset {self._layout.root} has {column.null_count} examples '
          f'without a {self._label_column!r}: use a labelled split'
      )
    return column.to_numpy()

  def _labels(self, split: str) -> np.ndarray:
    """The int32 labels of every row of `split`, checked to be classes of the train split."""
    if split not in self._checked_labels:
      self._checked_labels[split] = self._check_labels(split, self._raw_labels(split))
    return self._checked_labels[split]

  def _check_labels(self, split: str, raw: np.ndarray) -> np.ndarray:
    if self._label_kind == 'string':
      index = {name: label for label, name in enumerate(self.class_names)}
      unknown = sorted(set(raw.tolist()) - set(index))
      if unknown:
        raise ValueError(
            f'Split {split!r} of dataset {self._layout.root} has labels that no train example '
            f'has: {unknown[:5]}; train on a split with every class'
        )
      return np.array([index[name] for name in raw.tolist()], np.int32)
    bad = raw[(raw < 0) | (raw >= len(self.class_names))]
    if bad.size:
      raise ValueError(
          f'Split {split!r} of dataset {self._layout.root} has {bad.size} labels that are not '
          f'one of its {len(self.class_names)} classes (e.g. {int(bad[0])}; -1 marks an '
          'unlabelled example): evaluate on a labelled split'
      )
    return raw.astype(np.int32)

  def split_labels(self, split: str) -> np.ndarray:
    """The int32 label of every example of `split` (a slice too), read without an image."""
    return np.concatenate([self._labels(name)[rows] for name, rows in self._parts(split)])

  def examples(self, split: str, shard: int = 0, num_shards: int = 1) -> order.Records:
    """Shard `shard` of `num_shards` of `split` (strided, so each holds every class)."""
    parts = self._parts(split)
    names = tuple(name for name, _ in parts)
    # Each worker process gets a copy of these arrays: 2 + 4 + 4 bytes a record of the shard.
    part = np.concatenate([np.full(len(rows), i, np.uint16) for i, (_, rows) in enumerate(parts)])
    rows = np.concatenate([rows for _, rows in parts]).astype(np.int32)
    labels = np.concatenate([self._labels(name)[rows] for name, rows in parts])
    return order.Records(
        len(rows[shard::num_shards]),
        _Rows(names, part[shard::num_shards], rows[shard::num_shards], labels[shard::num_shards]),
    )

  def load(self, record: Record) -> dict[str, np.ndarray]:
    """The record's image decoded, and its label; `images.UnreadableImage` if it cannot be."""
    (split, row), label = record
    if split not in self._images:
      self._table(split)
    cell = self._images[split][row].as_py()
    data = cell.get('bytes') if isinstance(cell, dict) else cell
    if data is None and isinstance(cell, dict) and cell.get('path'):
      try:  # An image datasets did not embed: the file it was made from.
        with open(os.path.join(self._layout.root, cell['path']), 'rb') as f:
          data = f.read()
      except OSError as e:
        raise images.UnreadableImage(e.strerror or str(e)) from None
    if data is None:
      raise images.UnreadableImage('no image in this row')
    return {'image': images.decode(data), 'label': np.int32(label)}

  def describe(self, record: Record) -> str:
    (split, row), _ = record
    return f'row {row} of split {split!r} of {self._layout.root}'


class _Rows:
  """Record k of a shard. A class, not a closure, so that it pickles by value."""

  def __init__(
      self, names: tuple[str, ...], part: np.ndarray, rows: np.ndarray, labels: np.ndarray
  ):
    self._names = names
    self._part = part
    self._rows = rows
    self._labels = labels

  def __call__(self, k: int) -> Record:
    return (self._names[self._part[k]], int(self._rows[k])), int(self._labels[k])
