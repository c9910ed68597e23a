"""The rows of a Hugging Face dataset of Parquet or Arrow files, read by index.

Arrow files (save_to_disk's, a repository's) are memory-mapped: one copy in the page cache for every
worker process. A split's Parquet files, whose rows are compressed in groups, are copied once into
one uncompressed Arrow file of the image and label columns (dataset_cache.py), as
`datasets.load_dataset` copies them into its cache.
"""

import os
from typing import Any

import numpy as np

from vit_jax.data import dataset_cache
from vit_jax.data import hf_layout
from vit_jax.data import images

_ROWS_PER_BATCH = 256  # Rows a record batch of a copied file: the images of one Parquet read.


def cache_path(files: tuple[str, ...], columns: list[str]) -> str:
  """Where the copy of `columns` of Parquet `files` goes."""
  return dataset_cache.cache_path(files, columns, '.arrow')


def copied(files: tuple[str, ...], columns: list[str], what: str, path: str | None = None) -> str:
  """The cached Arrow file of `columns` of Parquet `files` (at `path` where it is known: found
  without a look at the files); written on the first call."""
  path = path or cache_path(files, columns)
  if os.path.exists(path):
    return path
  needed = sum(dataset_cache.size_and_time(f)[0] for f in files)  # It is uncompressed: more.
  doing = f'Copying {what} ({len(files)} Parquet files, {needed / 1e6:.1f} MB) into one Arrow file'
  return dataset_cache.made_once(path, needed, doing, lambda partial: copy(files, columns, partial))


def copy(files: tuple[str, ...], columns: list[str], path: str) -> None:
  """`columns` of Parquet `files` into Arrow file `path`."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  schema = hf_layout.parquet_file(files[0]).schema_arrow
  schema = pa.schema([schema.field(c) for c in columns])
  with pa.OSFile(path, 'wb') as sink, pa.ipc.new_stream(sink, schema) as writer:
    for f in files:
      try:
        for batch in hf_layout.parquet_file(f).iter_batches(_ROWS_PER_BATCH, columns=columns):
          # A shard may have written its labels narrower (int32 for int64): one schema a file.
          writer.write_batch(batch if batch.schema == schema else batch.cast(schema))
      except (pa.ArrowException, OSError) as e:  # A file damaged past its footer.
        raise hf_layout.unreadable_parquet(f, e) from None


def _column_kind(feature: dict[str, Any] | None, arrow_type) -> str:
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
  names = _schema(layout).names
  if label_column in names or '.' not in label_column:
    return label_column, ()
  column, *fields = label_column.split('.')
  return column, tuple(fields)


class Rows:
  """The rows of every split: their labels, and each one's image bytes."""

  def __init__(self, layout: hf_layout.Layout, image_column: str, label_column: str):
    self._layout = layout
    self._label = label_column
    column, self._label_fields = _label_path(layout, label_column)
    self._columns = [image_column, column]  # A struct label's whole column is copied.
    self._tables = {}  # Split -> its table, opened at its first read.
    self._images = {}  # Split -> its image column (a lookup by name costs 70 us over 5,000 chunks).
    # Where each split's Parquet files are copied, named once: a worker process then finds the copy
    # without a look at each file (on cloud storage, a request each).
    self._copies = {
        name: cache_path(files, self._columns)
        for name, files in layout.splits.items()
        if layout.format == 'parquet'
    }
    # A Parquet file's count is a read of its footer: once. Arrow tables count their own rows.
    self.sizes = (
        {name: self._table(name).num_rows for name in layout.splits}
        if layout.format == 'arrow'
        else {
            name: sum(hf_layout.parquet_file(f).metadata.num_rows for f in files)
            for name, files in layout.splits.items()
        }
    )

  def __getstate__(self) -> dict[str, Any]:
    # Memory maps are opened again by each process.
    return {**self.__dict__, '_tables': {}, '_images': {}}

  def _table(self, split: str):
    if split not in self._tables:
      import pyarrow as pa  # pylint: disable=g-import-not-at-top

      files = self._layout.splits[split]
      if self._layout.format == 'parquet':
        what = f'split {split!r} of {self._layout.root}'
        files = (copied(files, self._columns, what, self._copies[split]),)
      self._tables[split] = pa.concat_tables([hf_layout.open_arrow(f) for f in files])
      self._images[split] = self._tables[split].column(self._columns[0])
    return self._tables[split]

  def labels(self, split: str) -> np.ndarray:
    """The label of every row of `split`, as written (integers or strings)."""
    import pyarrow.compute as pc  # pylint: disable=g-import-not-at-top

    column = self._table(split).column(self._columns[1])
    for field in self._label_fields:
      column = pc.struct_field(column, field)
    if column.null_count:
      raise hf_layout.unlabelled(self._layout.root, split, column.null_count, self._label)
    return column.to_numpy()

  def describe(self, split: str, row: int) -> str:
    return f'row {row} of split {split!r} of {self._layout.root}'

  def image(self, split: str, row: int) -> bytes:
    """The encoded image of `row` of `split`; `images.UnreadableImage` where there is none."""
    if split not in self._images:
      self._table(split)
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
