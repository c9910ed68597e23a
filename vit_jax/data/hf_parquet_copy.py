"""A split's Parquet files (their rows compressed in groups), or some of their rows, copied once
into one uncompressed Arrow file of some columns, in the dataset cache (dataset_cache.py), to be
read by index from a memory map shared by the worker processes (hf_arrow.py)."""

import hashlib
import os

import numpy as np

from vit_jax.data import dataset_cache
from vit_jax.data import hf_layout

_ROWS_PER_BATCH = 256  # Rows a record batch of a copied file: the images of one Parquet read.


def cache_path(files: tuple[str, ...], columns: list[str]) -> str:
  """Where the copy of `columns` of Parquet `files` goes."""
  return dataset_cache.cache_path(files, columns, '.arrow')


def subset_path(whole: str, rows: np.ndarray) -> str:
  """Where the copy of `rows` goes, of the files whose whole copy goes to `whole`."""
  digest = hashlib.sha256(rows.astype(np.int64).tobytes()).hexdigest()[:16]
  return f'{whole.removesuffix(".arrow")}-{digest}.arrow'


def copied(
    files: tuple[str, ...],
    columns: list[str],
    what: str,
    path: str | None = None,
    rows: np.ndarray | None = None,
    share: float = 1.0,
) -> str:
  """The cached Arrow file of `columns` of Parquet `files`' `rows` (None: all; `share` of them), at
  `path` where it is known (found without a look at the files); written on the first call."""
  path = path or cache_path(files, columns)
  if os.path.exists(path):
    return path
  size = sum(size for size, _ in dataset_cache.of_each(files, dataset_cache.size_and_time))
  needed = share * size  # Uncompressed: more.
  amount = (
      f'{size / 1e6:.1f} MB'
      if share == 1
      else f'{needed / 1e6:.1f} MB of their {size / 1e6:.1f} MB'
  )
  count = f'{len(files)} Parquet file{"s" if len(files) > 1 else ""}'
  doing = f'Copying {what} ({count}, {amount}) into one Arrow file'
  return dataset_cache.made_once(
      path, int(needed), doing, lambda partial: copy(files, columns, partial, rows)
  )


def copy(
    files: tuple[str, ...], columns: list[str], path: str, rows: np.ndarray | None = None
) -> None:
  """`columns` of `rows` (sorted; numbered through the files one after another; None: all) of
  Parquet `files` into Arrow file `path`."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  schema = hf_layout.parquet_file(files[0]).schema_arrow
  schema = pa.schema([schema.field(c) for c in columns])
  first = 0  # The number of the file's first row.
  with pa.OSFile(path, 'wb') as sink, pa.ipc.new_stream(sink, schema) as writer:
    for f in files:
      parquet = hf_layout.parquet_file(f)
      count = parquet.metadata.num_rows
      wanted = None
      if rows is not None:
        wanted = np.zeros(count, bool)
        wanted[rows[(rows >= first) & (rows < first + count)] - first] = True
      first += count
      try:
        for batch in _batches(parquet, columns, wanted):
          # A file may have written a column's type otherwise (int32 for int64): one schema a copy.
          writer.write_batch(batch if batch.schema == schema else batch.cast(schema))
      except (pa.ArrowException, OSError) as e:  # A file damaged past its footer.
        raise hf_layout.unreadable_parquet(f, e) from None


def _batches(parquet, columns: list[str], wanted: np.ndarray | None):
  """Record batches of `columns` of a ParquetFile's rows where `wanted` (None: all), read from the
  row groups that hold one only."""
  if wanted is None:
    yield from parquet.iter_batches(_ROWS_PER_BATCH, columns=columns)
    return
  metadata = parquet.metadata
  ends = np.cumsum([metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
  starts = ends - np.diff(ends, prepend=0)
  groups = [g for g in range(len(ends)) if wanted[starts[g] : ends[g]].any()]
  if not groups:
    return
  read = np.concatenate([wanted[starts[g] : ends[g]] for g in groups])  # Of the rows read, wanted.
  at = 0
  for batch in parquet.iter_batches(_ROWS_PER_BATCH, row_groups=groups, columns=columns):
    keep = np.flatnonzero(read[at : at + batch.num_rows])
    at += batch.num_rows
    if keep.size:
      yield batch if keep.size == batch.num_rows else batch.take(keep)
