"""The files of zip archives, read where they lie, as the folder each archive holds: a path goes
through an archive as through a folder ('pets.zip/train/cat/a.jpg'), as it would through the
archive extracted in place. `dataset='folder'` reads an archive so (`data_dir=pets.zip`), and a
Hugging Face image folder its zip files (which `datasets.load_dataset` reads through fsspec's
`zip://` URLs). An archive's central directory is read once a machine, into an index in the
dataset cache that each process maps (a run's worker processes among them); a file is one ranged
read of its bytes, inflated and checked against its CRC: nothing is extracted or copied.
"""

import bz2
import collections
import functools
import lzma
import os
import posixpath
import struct
from typing import NamedTuple
import zipfile
import zlib

from etils import epath
import numpy as np

from vit_jax.data import dataset_cache
from vit_jax.data import hf_data_files
from vit_jax.data import images
from vit_jax.runtime import paths

# PKWARE's local file header: signature, version, flags, method, time, date, CRC, sizes, the lengths
# of the name and of the extra field that follow it, then the file's bytes.
_LOCAL_HEADER = struct.Struct('<4s5H3L2H')
_SIGNATURE = b'PK\x03\x04'
# Bytes read past the central directory's name and extra field: a local header's own extra field
# may be longer (Info-ZIP's timestamps); where it is longer still, a second read.
_SLACK = 64


def _unlzma(data: bytes) -> bytes:
  """A file of method 14 (APPNOTE 5.8.8; 7-Zip's LZMA, zipfile's ZIP_LZMA): the LZMA SDK's version
  (2 bytes), the properties' length (2 bytes), the properties (lc/lp/pb in a byte, the dictionary's
  size in 4), then the raw LZMA1 stream."""
  (length,) = struct.unpack('<H', data[2:4])
  properties = data[4 : 4 + length]
  if len(properties) != 5:
    raise ValueError(f'LZMA properties of {len(properties)} bytes, not 5')
  lc_lp_pb, dict_size = properties[0], int.from_bytes(properties[1:], 'little')
  lzma1 = dict(
      id=lzma.FILTER_LZMA1,
      dict_size=dict_size,
      lc=lc_lp_pb % 9,
      lp=lc_lp_pb // 9 % 5,
      pb=lc_lp_pb // 45,
  )
  return lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[lzma1]).decompress(data[4 + length :])


_INFLATE = {
    zipfile.ZIP_STORED: bytes,
    zipfile.ZIP_DEFLATED: lambda data: zlib.decompress(data, -15),
    zipfile.ZIP_BZIP2: bz2.decompress,
    zipfile.ZIP_LZMA: _unlzma,
}
_ARCHIVES_FOR_FORMAT = 10  # datasets' ARCHIVES_MAX_NUMBER_FOR_MODULE_INFERENCE.
# A file's entry in an archive's index (dataset_cache.py), which each process maps: zipfile's
# listing is 520-560 bytes a file in each process that makes it (0.7 GB for ImageNet-1k zipped);
# the index, 58 bytes and the name's, is one copy in the page cache for all.
_ENTRY = np.dtype(
    [
        ('name_end', '<i8'),  # Where its name ends in the names' bytes.
        ('header_offset', '<i8'),
        ('header_bytes', '<i8'),  # Its local header's length by the central directory's fields.
        ('stored_size', '<i8'),
        ('file_size', '<i8'),
        ('crc', '<u4'),
        ('method', '<u2'),
    ]
)


@functools.cache  # Once a process: a worker asks for each image it reads.
def _is_file(path: str) -> bool:
  return epath.Path(path).is_file() if paths.is_url(path) else os.path.isfile(path)


def in_archive(path: str) -> tuple[str, str] | None:
  """(zip archive, the path in it) where `path` goes through a zip archive ('pets.zip/train/cat':
  'train/cat'; '' for the archive itself); None elsewhere."""
  # In any case, as image extensions ('PETS.ZIP'): the path's own spelling is kept.
  lowered, suffix = path.lower(), hf_data_files.ARCHIVE
  if lowered.endswith(suffix):
    archive, inside = path, ''
  else:
    end = lowered.find(suffix + '/')
    if end < 0:
      return None
    end += len(suffix)
    archive, inside = path[:end], path[end:].strip('/')
  return (archive, inside) if _is_file(archive) else None


def hidden(name: str) -> bool:
  """Whether datasets leaves an extracted file out (DownloadManager.iter_files): its name or a
  folder's starts with '.' or '__' (macOS's __MACOSX/ and ._ files)."""
  return any(part.startswith(('.', '__')) for part in name.split('/'))


def _walk_order(name: str) -> list[tuple[int, str]]:
  """The sort key of os.walk over the extracted archive, as datasets walks it: a folder's files,
  sorted, then its sub-folders, sorted."""
  *folders, file = name.split('/')
  return [(1, folder) for folder in folders] + [(0, file)]


def _name(info: zipfile.ZipInfo) -> str:
  """A file's name as `unzip` extracts it: zipfile decodes a name without the UTF-8 flag (bit 11) as
  CP437, and Info-ZIP's zip (Linux's, macOS's) writes UTF-8 names without it: where those bytes are
  UTF-8, so is the name. A leading './' (bsdtar's, a script's `zip -r x.zip ./train`) is no folder.
  """
  name = info.filename
  if not info.flag_bits & 0x800:
    try:
      name = name.encode('cp437').decode('utf-8')
    except (UnicodeEncodeError, UnicodeDecodeError):
      pass
  while name.startswith('./'):
    name = name[2:]
  return name


def _files(archive: str) -> tuple[dict[str, zipfile.ZipInfo], list[str]]:
  """The files of `archive`, by name, in its order, as zipfile lists its central directory, and the
  names of its folders' own entries (an empty folder is one, as `unzip` makes it); a one-line
  ValueError where it is not a zip archive vit_jax reads."""
  try:
    with hf_data_files.open_file(archive) as f:
      infos = zipfile.ZipFile(f).infolist()
  except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
    raise hf_data_files.unreadable(archive, e, 'zip archive', 'download it again') from None
  files = {_name(i): i for i in infos if not i.is_dir()}
  for name, info in files.items():
    if info.flag_bits & 0x1:
      raise ValueError(
          f'{os.path.join(archive, name)} is encrypted: zip the images again without a password'
      )
    if info.compress_type not in _INFLATE:
      raise ValueError(
          f'{os.path.join(archive, name)} is compressed by method {info.compress_type}, which '
          "vit_jax does not read: zip the images again with deflate (zip's default), bzip2, "
          'LZMA or none'
      )
  folder_entries = [_name(i).rstrip('/') for i in infos if i.is_dir()]
  return files, [name for name in folder_entries if name]


def forget() -> None:
  """Forgets what this process read of archives: a run starts (a notebook may have rewritten one at
  the same path since the last, and its index is another)."""
  for cached in (_is_file, folders, _index):
    cached.cache_clear()


def names(archive: str) -> list[str]:
  """The files of `archive` datasets reads (hidden ones left out), in the order it reads them."""
  return sorted((n for n in _names(archive) if not hidden(n)), key=_walk_order)


@functools.cache
def folders(archive: str) -> dict[str, tuple[set[str], list[str]]]:
  """Each folder of `archive` ('' its top, 'train/cat'): the names of its sub-folders and of its
  files, as the archive extracted would hold them (an empty folder among them)."""
  tree = {'': (set(), [])}
  for name in [*_names(archive), *(f'{folder}/' for folder in _index(archive).folders.tolist())]:
    *parents, file = name.split('/')
    for depth, sub in enumerate(parents):
      tree.setdefault('/'.join(parents[:depth]), (set(), []))[0].add(sub)
    files = tree.setdefault('/'.join(parents), (set(), []))[1]
    if file:
      files.append(file)
  return tree


def most_common_extension(archives: list[str]) -> str | None:
  """The most common extension of the files in a split's first archives ('.png'), where datasets
  infers a format from them (infer_module_for_data_files_list_in_archives)."""
  counts = collections.Counter(
      '.' + suffix.lower()
      for archive in archives[:_ARCHIVES_FOR_FORMAT]
      for name in _names(archive)
      if not hidden(name)
      for suffix in posixpath.basename(name).split('.')[1:]
  )
  return counts.most_common(1)[0][0] if counts else None


def _name_hash(encoded: bytes) -> int:
  """What an archive's index sorts its names by: the same in every process (str's hash is not)."""
  return zlib.crc32(encoded)


def _write_index(archive: str, directory: str) -> None:
  """The index of `archive`'s files, in its order: each file's entry, their names' bytes end to end;
  and their names' hashes sorted, with the order that sorts them."""
  files, folder_entries = _files(archive)
  encoded = [name.encode('utf-8', 'surrogateescape') for name in files]
  infos = list(files.values())
  entries = np.zeros(len(infos), _ENTRY)
  entries['name_end'] = np.cumsum([len(e) for e in encoded])
  entries['header_offset'] = [i.header_offset for i in infos]
  entries['header_bytes'] = [
      _LOCAL_HEADER.size
      + len(i.orig_filename.encode('utf-8' if i.flag_bits & 0x800 else 'cp437'))
      + len(i.extra)
      for i in infos
  ]
  entries['stored_size'] = [i.compress_size for i in infos]
  entries['file_size'] = [i.file_size for i in infos]
  entries['crc'] = [i.CRC for i in infos]
  entries['method'] = [i.compress_type for i in infos]
  hashes = np.array([_name_hash(e) for e in encoded], '<u4')
  by_hash = np.argsort(hashes, kind='stable')
  os.makedirs(directory)
  np.save(os.path.join(directory, 'entries.npy'), entries)
  np.save(os.path.join(directory, 'names.npy'), np.frombuffer(b''.join(encoded), np.uint8))
  np.save(os.path.join(directory, 'hashes.npy'), hashes[by_hash])
  np.save(os.path.join(directory, 'by_hash.npy'), by_hash)
  np.save(os.path.join(directory, 'folders.npy'), np.array(folder_entries, str))


class _Index(NamedTuple):
  entries: np.ndarray
  names: np.ndarray  # uint8: the names' UTF-8 bytes, end to end.
  hashes: np.ndarray  # Sorted.
  by_hash: np.ndarray  # hashes[j] is the hash of file by_hash[j]'s name.
  folders: np.ndarray  # str: the names of the folders' own entries.


@functools.cache  # Once a process: the index made once a machine, mapped by each process.
def _index(archive: str) -> _Index:
  # Versioned: an index of an earlier vit_jax's names (CP437's, './' kept; no folders) is not this
  # one's.
  path = dataset_cache.cache_path((archive,), ('zip index', 3), '.zipindex')
  dataset_cache.made_once(
      path, 0, f'Indexing zip archive {archive}', lambda d: _write_index(archive, d)
  )
  return _Index(
      *(np.load(os.path.join(path, f'{name}.npy'), mmap_mode='r') for name in _Index._fields)
  )


def _names(archive: str) -> list[str]:
  """The names of `archive`'s files (folders left out), in its order."""
  index = _index(archive)
  data, ends = index.names.tobytes(), index.entries['name_end'].tolist()
  return [
      data[start:end].decode('utf-8', 'surrogateescape')
      for start, end in zip([0, *ends[:-1]], ends)
  ]


def _entry(archive: str, name: str) -> np.void | None:
  """File `name`'s entry in `archive`'s index; None where it has no such file."""
  index = _index(archive)
  encoded = name.encode('utf-8', 'surrogateescape')
  key = np.uint32(_name_hash(encoded))
  for j in range(
      np.searchsorted(index.hashes, key), np.searchsorted(index.hashes, key, side='right')
  ):
    k = int(index.by_hash[j])
    start = int(index.entries[k - 1]['name_end']) if k else 0
    if index.names[start : index.entries[k]['name_end']].tobytes() == encoded:
      return index.entries[k]
  return None


def read(archive: str, name: str) -> bytes:
  """The bytes of file `name` of `archive`; `images.UnreadableImage` where the archive has no such
  file or its bytes are not those its central directory describes (the archive changed)."""
  entry = _entry(archive, name)
  if entry is None:
    raise images.UnreadableImage(f'{archive} has no file {name!r}')
  offset, expected, size = (int(entry[f]) for f in ('header_offset', 'header_bytes', 'stored_size'))
  expected += _SLACK
  data = hf_data_files.read_range(archive, offset, expected + size)
  fields = _LOCAL_HEADER.unpack_from(data) if len(data) >= _LOCAL_HEADER.size else None
  if fields is None or fields[0] != _SIGNATURE:
    raise images.UnreadableImage(f'{archive} has changed since it was listed: no file header')
  start = _LOCAL_HEADER.size + fields[-2] + fields[-1]
  stored = data[start : start + size]
  if len(stored) < size and len(data) == expected + size:
    stored = hf_data_files.read_range(archive, offset + start, size)
  try:
    content = _INFLATE[int(entry['method'])](stored)
  except (zlib.error, lzma.LZMAError, OSError, ValueError, EOFError, struct.error) as e:
    raise images.UnreadableImage(f'damaged in its archive ({e})') from None
  if len(content) != entry['file_size'] or zlib.crc32(content) != entry['crc']:
    raise images.UnreadableImage(
        'damaged in its archive: its bytes are not those it was zipped with'
    )
  return content
