"""The rows of a Hugging Face dataset of Parquet or Arrow files, read by index.

Arrow files (save_to_disk's, a repository's) are memory-mapped: one copy in the page cache for every
worker process. A split's Parquet files, whose rows are compressed in groups, are copied once into
one uncompressed Arrow file of the image column (hf_parquet_copy.py), as `datasets.load_dataset`
copies them into its cache; but only the rows a process reads (`Rows.reading`): a pod's host copies
its data shards (1/N of the split, in one file), and a run on 'train[:1%]' copies 1% of it. The
labels are read from the Parquet files' label column alone.
"""

import os
from typing import Any

import numpy as np

from vit_jax.data import dataset_cache
from vit_jax.data import hf_features
from vit_jax.data import hf_layout
from vit_jax.data import hf_parquet_copy
from vit_jax.data import images
from vit_jax.data import label_sets


def _decoded_type(arrow_type):
  """The type of a column's values as `datasets` returns them: a dictionary-encoded column's (pandas'
  Categorical) its values', a string_view column's strings."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  if pa.types.is_dictionary(arrow_type):
    arrow_type = arrow_type.value_type
  return pa.string() if pa.types.is_string_view(arrow_type) else arrow_type


def _column_kind(feature: Any, arrow_type) -> str:
  """'image', a label kind (hf_features.LABEL_KINDS), a list of labels ('class_label_set',
  'integer_set', 'string_set'), or '' for a column no run reads."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  if hf_features.is_list(arrow_type):
    kind = _column_kind(hf_features.element_feature(feature), arrow_type.value_type)
    return kind + hf_features.SET if kind in hf_features.LABEL_KINDS else ''
  arrow_type = _decoded_type(arrow_type)
  kind = feature.get('_type') if isinstance(feature, dict) else None
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


def _kinds(name: str, feature: Any, arrow_type) -> dict[str, str]:
  """The kind of column `name`, and of each field of a struct that is no image ('name.field', as
  `datasets` returns it, row[name][field]), and so on down."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  kinds = {name: _column_kind(feature, arrow_type)}
  if not kinds[name] and pa.types.is_struct(arrow_type):
    for i in range(arrow_type.num_fields):
      field = arrow_type.field(i)
      inner = feature.get(field.name) if isinstance(feature, dict) else None
      kinds.update(_kinds(f'{name}.{field.name}', inner, field.type))
  return kinds


def _schema(layout: hf_layout.Layout):
  first = next(iter(layout.splits.values()))[0]
  if layout.format == 'arrow':
    return hf_layout.open_arrow(first).schema
  return hf_layout.parquet_file(first).schema_arrow


def column_kinds(layout: hf_layout.Layout) -> dict[str, str]:
  """Each column's kind ('image', 'class_label', 'integer', 'string', ''), in the files' order;
  a struct's fields' as 'column.field' (`_kinds`)."""
  schema = _schema(layout)
  kinds = {}
  for name in schema.names:
    kinds.update(_kinds(name, layout.features.get(name), schema.field(name).type))
  return kinds


def _label_path(layout: hf_layout.Layout, label_column: str) -> tuple[str, tuple[str, ...]]:
  """(the column, the struct fields within it) of the label `label_column`: a column, or a field
  'column.field' of a struct column."""
  if '.' not in label_column or label_column in _schema(layout).names:
    return label_column, ()
  column, *fields = label_column.split('.')
  return column, tuple(fields)


def _increasing(rows: np.ndarray) -> np.ndarray:
  """`rows` sorted, each once: as they are where they are (a data shard's, a slice's). Not
  np.unique, which took 14 s for ImageNet-21k's 13 million (numpy 2.4; np.sort 0.5 s)."""
  if np.all(rows[1:] > rows[:-1]):
    return rows
  rows = np.sort(rows)
  return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]


def _num_rows(path: str) -> int:
  return hf_layout.parquet_file(path).metadata.num_rows  # A read of its footer.


class Rows:
  """The rows of every split: their labels, and each one's image bytes."""

  def __init__(self, layout: hf_layout.Layout, image_column: str, label_column: str):
    self._layout = layout
    self._label = label_column
    self._label_column, self._label_fields = _label_path(layout, label_column)
    self._columns = [image_column]
    self._chosen = None  # Split -> the rows whose images this reads (sorted); None: all.
    self._tables = {}  # Split -> its table, opened at its first read.
    self._images = {}  # Split -> its image column (a lookup by name costs 70 us over 5,000 chunks).
    self._at = {}  # Split -> the rows of its copy, where it is of some (None: of all).
    # Where each split's Parquet files are copied whole, named once: a worker process then finds the
    # copy without a look at each file (on cloud storage, a request each).
    self._copies = {
        name: hf_parquet_copy.cache_path(files, self._columns)
        for name, files in layout.splits.items()
        if layout.format == 'parquet'
    }
    # A Parquet file's count is a read of its footer: once. Arrow tables count their own rows.
    self.sizes = (
        {name: self._table(name).num_rows for name in layout.splits}
        if layout.format == 'arrow'
        else {
            name: sum(dataset_cache.of_each(files, _num_rows))
            for name, files in layout.splits.items()
        }
    )

  def __getstate__(self) -> dict[str, Any]:
    # Memory maps are opened again by each process.
    return {**self.__dict__, '_tables': {}, '_images': {}, '_at': {}}

  def reading(self, chosen: dict[str, np.ndarray]) -> 'Rows':
    """These rows, to read the images of `chosen` rows of each split only (split -> its rows): a
    Parquet split's copy is of those rows, unless the whole split's is made already (by a run on one
    host, or another host of a shared cache)."""
    if self._layout.format != 'parquet':
      return self
    subset = object.__new__(Rows)
    subset.__dict__.update(self.__getstate__())
    subset._chosen = {split: _increasing(rows) for split, rows in chosen.items()}
    return subset

  def prepare(self) -> None:
    """Makes the copies this reads, in this process (where its log is seen, and a full disk is a
    one-line error, not a worker's traceback)."""
    for split in self._chosen or ():
      self._table(split)

  def _copy(self, split: str) -> str:
    """The Arrow file of the images this reads of Parquet split `split`, made on the first call."""
    files, whole = self._layout.splits[split], self._copies[split]
    rows = None if self._chosen is None else self._chosen[split]
    what = f'split {split!r} of {self._layout.root}'
    if rows is None or len(rows) == self.sizes[split] or os.path.exists(whole):
      self._at[split] = None
      return hf_parquet_copy.copied(files, self._columns, what, whole)
    self._at[split] = rows
    what = f'the {len(rows)} of {self.sizes[split]} rows this process reads of {what}'
    path = hf_parquet_copy.subset_path(whole, rows)
    return hf_parquet_copy.copied(
        files, self._columns, what, path, rows, len(rows) / self.sizes[split]
    )

  def _table(self, split: str):
    if split not in self._tables:
      import pyarrow as pa  # pylint: disable=g-import-not-at-top

      files = self._layout.splits[split]
      if self._layout.format == 'parquet':
        files = (self._copy(split),)
      self._tables[split] = pa.concat_tables([hf_layout.open_arrow(f) for f in files])
      self._images[split] = self._tables[split].column(self._columns[0])
    return self._tables[split]

  def labels(self, split: str) -> np.ndarray | label_sets.LabelSets:
    """The label of every row of `split`, as written (integers or strings), or of a list column, each
    row's list; of Parquet files, read from their label column alone."""
    import pyarrow as pa  # pylint: disable=g-import-not-at-top
    import pyarrow.compute as pc  # pylint: disable=g-import-not-at-top

    if self._layout.format == 'parquet':
      columns = dataset_cache.of_each(self._layout.splits[split], self._label_of_file)
    else:
      columns = [self._table(split).column(self._label_column)]
    values, missing = [], 0
    for column in columns:
      for field in self._label_fields:
        column = pc.struct_field(column, field)
      missing += column.null_count
      values.append(column)
    if missing:
      raise hf_features.unlabelled(self._layout.root, split, missing, self._label)
    column = pa.chunked_array([chunk for part in values for chunk in part.chunks], values[0].type)
    column = column.cast(_decoded_type(column.type))
    if hf_features.is_list(column.type):
      return label_sets.from_lengths(
          pc.list_value_length(column).to_numpy(), pc.list_flatten(column).to_numpy()
      )
    return column.to_numpy()

  def _label_of_file(self, path: str):
    """The label column of Parquet file `path`, read alone."""
    import pyarrow as pa  # pylint: disable=g-import-not-at-top

    try:
      return hf_layout.parquet_file(path).read(columns=[self._label_column]).column(0)
    except (pa.ArrowException, OSError) as e:
      raise hf_layout.unreadable_parquet(path, e) from None

  def describe(self, split: str, row: int) -> str:
    return f'row {row} of split {split!r} of {self._layout.root}'

  def image(self, split: str, row: int) -> bytes:
    """The encoded image of `row` of `split`; `images.UnreadableImage` where there is none."""
    if split not in self._images:
      self._table(split)
    rows = self._at.get(split)
    if rows is not None:  # A copy of some rows: the row's place in it.
      at = int(np.searchsorted(rows, row))
      if at == len(rows) or rows[at] != row:
        raise ValueError(f'{self.describe(split, row)} is not one of the rows this reads')
      row = at
    cell = self._images[split][row].as_py()
    data = cell.get('bytes') if isinstance(cell, dict) else cell
    if data is None and isinstance(cell, dict) and cell.get('path'):
      try:  # An image datasets did not embed: the file it was made from.
        with open(os.path.join(self._layout.root, cell['path']), 'rb') as f:
          return f.read()
      except OSError as e:
        raise images.UnreadableImage(e.strerror or str(e)) from None
    if data is None:
      raise images.UnreadableImage('no image in this row')
    return data
