"""The rows of a dataset of WebDataset tar files (a hub repository of them, such as timm's
imagenet-1k-wds, or any folder of shards), read by index, in place.

A sample is the consecutive files of a tar that share a key (the path up to the first dot of the
file's name); each file is a column named by the rest of its name (`jpg`, `cls`, `json`), as
`datasets`' webdataset builder reads them. A tar is not compressed, so each split's tar files are
indexed once (dataset_cache.py: where each sample's image lies, and its label; by a process a core
where there are many tars) and a record is then one read of its image's bytes: nothing is copied,
locally or from cloud storage.
"""

import concurrent.futures
import io
import json
import multiprocessing
import os
import re
import tarfile
from typing import Any, Iterator

from absl import logging
import numpy as np

from vit_jax.data import dataset_cache
from vit_jax.data import hf_data_files
from vit_jax.data import hf_features
from vit_jax.data import hf_layout
from vit_jax.data import images
from vit_jax.data import label_sets
from vit_jax.data import tar_members
from vit_jax.data import hf_webdataset_fields
from vit_jax.runtime import cpuinfo
from vit_jax.runtime import hosts

_KEY_AND_FIELD = re.compile(r'^((?:.*/|)[^.]+)[.]([^/]*)$')  # webdataset's base_plus_ext.
_SAMPLES_FOR_COLUMNS = 5  # datasets infers the columns from a tar's first five samples.
_EXTENT = np.dtype([('file', '<u4'), ('offset', '<i8'), ('size', '<i8'), ('labelled', '?')])
_INDEXING_THREADS = 16  # Tar files indexed at once: reads of headers, mostly waiting on storage.
# From this many tar files on, a split is indexed by processes, one a core, each reading its share of
# the files in threads: a sample's headers are ~20 us of Python, so one process took ~5 minutes for
# ImageNet-21k's 13 million samples; a process costs a second or two to start (its imports).
_TARS_FOR_PROCESSES = 16


def _samples(path: str, read: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, Any]]]:
  """(key, {column: (offset, size, bytes where the column is in `read`, else None)}) of each sample
  of tar `path`, in order, as datasets groups its files (hidden ones, `.x` and `__x`, left out).
  Its headers are read one by one, the files between them sought over (on cloud storage, gcsfs
  reads ahead: a request fetches many headers)."""
  with hf_data_files.open_file(path) as f:
    try:
      yield from _grouped(path, f, read)
    except (tarfile.TarError, OSError) as e:  # Not a tar, compressed, or cut short.
      raise hf_data_files.unreadable(
          path, e, 'uncompressed tar file', 'download it again, uncompressed'
      ) from None


def _grouped(path: str, f, read: tuple[str, ...]):
  key, sample = None, {}
  for name, offset, size in tar_members.regular_files(f):
    match = _KEY_AND_FIELD.match(name)
    if os.path.basename(name).startswith(('.', '__')) or not match:
      continue
    if sample and match.group(1) != key:
      yield key, sample
      sample = {}
    key, field = match.groups()
    if field in sample:
      raise ValueError(
          f'{path}: sample {key!r} has two {field!r} files: a sample is the consecutive files '
          'of one key, each key once: write the tar again with one file a column'
      )
    data = None
    if field in read:
      f.seek(offset)
      data = f.read(size)
    sample[field] = (offset, size, data)
  if sample:
    yield key, sample


def column_kinds(layout: hf_layout.Layout) -> dict[str, str]:
  """Each column's kind ('image', 'class_label', 'integer', 'string', ''): the README's features,
  else the columns of the first samples of the last split's first tar (datasets' inference)."""
  if layout.features:
    return {name: hf_features.feature_kind(feature) for name, feature in layout.features.items()}
  first = list(layout.splits.values())[-1][0]
  samples = [s for _, (_, s) in zip(range(_SAMPLES_FOR_COLUMNS), _samples(first, ('json',)))]
  columns = [list(s) for s in samples]
  if any(set(c) != set(columns[0]) for c in columns):
    raise ValueError(
        f"{first}: its first samples' files do not have the same extensions ({columns}): write "
        'the dataset with the same columns for every sample'
    )
  kinds = {
      field: hf_webdataset_fields.field_kind(field) for field in (columns[0] if columns else [])
  }
  return {
      **kinds,
      **hf_webdataset_fields.json_key_kinds(
          [s['json'][2] for s in samples] if 'json' in kinds else []
      ),
  }


def _index_tar(
    path: str,
    image_column: str,
    label_column: str,
    names: list[str] | None,
    numbers: bool,
    sets: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
  """Each sample's image extent (offset, size; -1 where it has none) and label (-1 or '': none), a
  class number where `numbers`, else a name; where `sets`, its list of them as JSON text."""
  kind = int if numbers else str
  extents, labels = [], []
  classes = None if names is None else {name: k for k, name in enumerate(names)}
  label_file = hf_webdataset_fields.file_and_key(label_column)[0]
  for key, sample in _samples(path, (label_file,)):
    offset, size, _ = sample.get(image_column, (-1, -1, None))
    _, _, data = sample.get(label_file, (0, 0, None))
    where = f'{path}: sample {key!r}'
    label = (
        None
        if data is None
        else hf_webdataset_fields.label(data, label_column, classes, where, sets)
    )
    if label is not None and any(type(v) is not kind for v in (label if sets else [label])):
      raise ValueError(
          f'{where}: its {label_column!r} is {label!r}, where the first samples have '
          f"{'class numbers' if kind is int else 'class names'}: write one kind of label"
      )
    extents.append((0, offset, size, label is not None))
    labels.append(json.dumps(label) if sets and label is not None else label)
  missing = -1 if numbers and not sets else ''
  labels = np.array([missing if label is None else label for label in labels])
  as_numbers = numbers and not sets
  return np.array(extents, _EXTENT), labels.astype(np.int64) if as_numbers else labels.astype(str)


def _index_in_threads(files: tuple[str, ...], *columns: Any) -> list[tuple[np.ndarray, np.ndarray]]:
  """`_index_tar` of each of `files` with `columns` (its other arguments), _INDEXING_THREADS at a
  time."""
  with concurrent.futures.ThreadPoolExecutor(min(_INDEXING_THREADS, len(files))) as pool:
    return list(pool.map(lambda f: _index_tar(f, *columns), files))


def _index_tars(files: tuple[str, ...], *columns: Any) -> tuple[np.ndarray, np.ndarray]:
  """Each sample of tar `files`: its extent (the file's number in `files`) and label. From
  _TARS_FOR_PROCESSES files on, in processes (spawned, as grain's workers are), one a core."""
  processes = min(cpuinfo.usable_cores(), len(files))
  if len(files) < _TARS_FOR_PROCESSES or processes < 2:
    indexed = _index_in_threads(files, *columns)
  else:
    shares = [
        files[k * len(files) // processes : (k + 1) * len(files) // processes]
        for k in range(processes)
    ]
    context = multiprocessing.get_context('spawn')
    with concurrent.futures.ProcessPoolExecutor(processes, mp_context=context) as pool:
      each = [[column] * processes for column in columns]
      indexed = [tar for share in pool.map(_index_in_threads, shares, *each) for tar in share]
  for i, (extents, _) in enumerate(indexed):
    extents['file'] = i
  return np.concatenate([e for e, _ in indexed]), np.concatenate([found for _, found in indexed])


def _index_divided(files: tuple[str, ...], *columns: Any) -> tuple[np.ndarray, np.ndarray]:
  """The index of `files`, each process of a multi-host run indexing its share of them: a pod on
  cloud storage would otherwise read every tar whole on each host."""
  share = hosts.share(len(files))

  def indexed_share() -> bytes:
    if not share:  # More processes than tars.
      return b''
    extents, labels = _index_tars(files[share.start : share.stop], *columns)
    extents['file'] += share.start
    buffer = io.BytesIO()
    np.savez(buffer, extents=extents, labels=labels)
    return buffer.getvalue()

  pieces = [np.load(io.BytesIO(piece)) for piece in hosts.gathered(indexed_share) if piece]
  return tuple(np.concatenate([p[name] for p in pieces]) for name in ('extents', 'labels'))


def _write_index(extents: np.ndarray, labels: np.ndarray, directory: str) -> None:
  os.makedirs(directory)
  np.save(os.path.join(directory, 'extents.npy'), extents)
  np.save(os.path.join(directory, 'labels.npy'), labels)


class Rows:
  """The samples of every split: their labels, and each one's image bytes."""

  def __init__(self, layout: hf_layout.Layout, image_column: str, label_column: str):
    self._layout = layout
    self._columns = (image_column, label_column)
    feature = layout.features.get(label_column, {})
    names = feature.get('names') if feature.get('_type') == 'ClassLabel' else None
    sets = False
    if names is not None:
      numbers = True
    elif hf_webdataset_fields.file_and_key(label_column)[1] is not None:
      # A JSON key: as its first samples hold.
      kind = column_kinds(layout).get(label_column, '')
      numbers, sets = kind.startswith('integer'), kind.endswith(hf_features.SET)
    else:
      numbers = label_column.rsplit('.', 1)[-1].lower() in hf_webdataset_fields.INTEGER_FIELDS
    # The README's class names, whether labels are numbers, and whether a sample has a list of them.
    self._labels_as = (names, numbers, sets)
    # Each split's index, made once here: a worker process then maps it without a look at each tar
    # (on cloud storage, a request each).
    self._indices = {split: self._indexed(split) for split in layout.splits}
    self._index = {}  # Split -> (extents, labels), memory-mapped at their first read.
    self.sizes = {split: len(self._split(split)[0]) for split in layout.splits}

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, '_index': {}}  # Each process maps the index again.

  def _indexed(self, split: str) -> str:
    """The folder of the split's index; made on the first call (divided between the processes of a
    multi-host run where any of them has none)."""
    files = self._layout.splits[split]
    path = dataset_cache.cache_path(files, [*self._columns, *self._labels_as], '.webdataset')
    doing = f'Indexing split {split!r} of {self._layout.root} ({len(files)} tar files)'
    if hosts.count() > 1 and hosts.any_of(not os.path.exists(path)):
      logging.info(
          '%s: %d of them on this process, the rest on the other %d',
          doing,
          len(hosts.share(len(files))),
          hosts.count() - 1,
      )
      index = _index_divided(files, *self._columns, *self._labels_as)
      doing = f'Writing the index of split {split!r} of {self._layout.root}'
      write = lambda directory: _write_index(*index, directory)
    else:
      write = lambda directory: _write_index(
          *_index_tars(files, *self._columns, *self._labels_as), directory
      )
    return dataset_cache.made_once(path, 0, doing, write)

  def _split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
    if split not in self._index:
      self._index[split] = tuple(
          np.load(os.path.join(self._indices[split], f'{name}.npy'), mmap_mode='r')
          for name in ('extents', 'labels')
      )
    return self._index[split]

  def labels(self, split: str) -> np.ndarray | label_sets.LabelSets:
    """The label of every sample of `split`, as written (integers or strings), or of a list of them
    a sample, each sample's list."""
    extents, labels = self._split(split)
    missing = int(np.sum(~extents['labelled']))
    if missing:
      raise hf_features.unlabelled(self._layout.root, split, missing, self._columns[1])
    _, numbers, sets = self._labels_as
    if not sets:
      return np.asarray(labels)
    lists = [json.loads(str(text)) for text in labels]
    values = np.array([v for labels in lists for v in labels], np.int64 if numbers else str)
    return label_sets.from_lengths(np.array([len(v) for v in lists], np.int64), values)

  def describe(self, split: str, row: int) -> str:
    file = int(self._split(split)[0][row]['file'])
    return f'sample {row} of split {split!r} (in {self._layout.splits[split][file]})'

  def image(self, split: str, row: int) -> bytes:
    """The encoded image of sample `row` of `split`; `images.UnreadableImage` where there is none."""
    file, offset, size, _ = self._split(split)[0][row].tolist()
    if size < 0:
      raise images.UnreadableImage(f'no {self._columns[0]!r} file in this sample')
    data = hf_data_files.read_range(self._layout.splits[split][file], offset, size)
    if len(data) != size:
      raise images.UnreadableImage(
          f'{self._layout.splits[split][file]} is shorter than when it was indexed'
      )
    return data
