"""The files of zip archives, read where they lie. A Hugging Face image folder (`datasets`'
imagefolder format) may hold its images in zip files, which `datasets.load_dataset` extracts (or
reads through fsspec); `dataset='folder'` reads an archive as the folder it holds. vit_jax lists
each archive's central directory once a process and reads a file as one ranged read of its bytes,
inflated and checked against its CRC: nothing is extracted or copied.

A file of an archive is named by fsspec's URL for it, `zip://<name>::<archive>`, as `datasets`
names it (hf_layout's split files, hf_imagefolder's rows); folder.py's paths go through the
archive as through a folder ('pets.zip/train/cat/a.jpg'), as torchvision's would after unzipping.
"""

import bz2
import collections
import functools
import posixpath
import struct
import zipfile
import zlib

from vit_jax.data import hf_data_files
from vit_jax.data import images

_PREFIX, _SEPARATOR = 'zip://', '::'
# PKWARE's local file header: signature, version, flags, method, time, date, CRC, sizes, the lengths
# of the name and of the extra field that follow it, then the file's bytes.
_LOCAL_HEADER = struct.Struct('<4s5H3L2H')
_SIGNATURE = b'PK\x03\x04'
# Bytes read past the central directory's name and extra field: a local header's own extra field
# may be longer (Info-ZIP's timestamps); where it is longer still, a second read.
_SLACK = 64
_INFLATE = {
    zipfile.ZIP_STORED: bytes,
    zipfile.ZIP_DEFLATED: lambda data: zlib.decompress(data, -15),
    zipfile.ZIP_BZIP2: bz2.decompress,
}
_ARCHIVES_FOR_FORMAT = 10  # datasets' ARCHIVES_MAX_NUMBER_FOR_MODULE_INFERENCE.


def url(archive: str, name: str) -> str:
  """The URL of file `name` of `archive`."""
  return f'{_PREFIX}{name}{_SEPARATOR}{archive}'


def parse(path: str) -> tuple[str, str] | None:
  """(archive, name) of a file's URL; None where `path` is not one."""
  if not path.startswith(_PREFIX) or _SEPARATOR not in path:
    return None
  name, archive = path[len(_PREFIX) :].split(_SEPARATOR, 1)
  return archive, name


def name_in_archive(path: str) -> str:
  """The file's path inside its archive ('cat/1.jpg'); `path` itself where it is no archive's."""
  parsed = parse(path)
  return parsed[1] if parsed else path


def _hidden(name: str) -> bool:
  """Whether datasets leaves an extracted file out (DownloadManager.iter_files): its name or a
  folder's starts with '.' or '__' (macOS's __MACOSX/ and ._ files)."""
  return any(part.startswith(('.', '__')) for part in name.split('/'))


def _walk_order(name: str) -> list[tuple[int, str]]:
  """The sort key of os.walk over the extracted archive, as datasets walks it: a folder's files,
  sorted, then its sub-folders, sorted."""
  *folders, file = name.split('/')
  return [(1, folder) for folder in folders] + [(0, file)]


@functools.cache  # An archive's listing, once a process (worker processes list it again).
def _files(archive: str) -> dict[str, zipfile.ZipInfo]:
  """The files of `archive`, by name; a one-line ValueError where it is not a zip archive vit_jax
  reads."""
  try:
    with hf_data_files.open_file(archive) as f:
      infos = zipfile.ZipFile(f).infolist()
  except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
    raise hf_data_files.unreadable(archive, e, 'zip archive', 'download it again') from None
  files = {i.filename: i for i in infos if not i.is_dir()}
  for name, info in files.items():
    if info.flag_bits & 0x1:
      raise ValueError(
          f'{url(archive, name)} is encrypted: zip the images again without a password'
      )
    if info.compress_type not in _INFLATE:
      raise ValueError(
          f'{url(archive, name)} is compressed by method {info.compress_type}, which vit_jax does '
          "not read: zip the images again with deflate (zip's default) or none"
      )
  return files


def names(archive: str) -> list[str]:
  """The files of `archive` datasets reads (hidden ones left out), in the order it reads them."""
  return sorted((n for n in _files(archive) if not _hidden(n)), key=_walk_order)


@functools.cache
def folders(archive: str) -> dict[str, tuple[set[str], list[str]]]:
  """Each folder of `archive` ('' its top, 'train/cat'): the names of its sub-folders and of its
  files, as the archive extracted would hold them."""
  tree = {'': (set(), [])}
  for name in _files(archive):
    *parents, file = name.split('/')
    for depth, sub in enumerate(parents):
      tree.setdefault('/'.join(parents[:depth]), (set(), []))[0].add(sub)
    tree.setdefault('/'.join(parents), (set(), []))[1].append(file)
  return tree


def most_common_extension(archives: list[str]) -> str | None:
  """The most common extension of the files in a split's first archives ('.png'), where datasets
  infers a format from them (infer_module_for_data_files_list_in_archives)."""
  counts = collections.Counter(
      '.' + suffix.lower()
      for archive in archives[:_ARCHIVES_FOR_FORMAT]
      for name in names(archive)
      for suffix in posixpath.basename(name).split('.')[1:]
  )
  return counts.most_common(1)[0][0] if counts else None


def read(path: str) -> bytes:
  """The bytes of the file of URL `path`; `images.UnreadableImage` where the archive has no such
  file or its bytes are not those its central directory describes (the archive changed)."""
  archive, name = parse(path)
  info = _files(archive).get(name)
  if info is None:
    raise images.UnreadableImage(f'{archive} has no file {name!r}')
  expected = _LOCAL_HEADER.size + len(info.orig_filename.encode()) + len(info.extra) + _SLACK
  data = hf_data_files.read_range(archive, info.header_offset, expected + info.compress_size)
  fields = _LOCAL_HEADER.unpack_from(data) if len(data) >= _LOCAL_HEADER.size else None
  if fields is None or fields[0] != _SIGNATURE:
    raise images.UnreadableImage(f'{archive} has changed since it was listed: no file header')
  start = _LOCAL_HEADER.size + fields[-2] + fields[-1]
  stored = data[start : start + info.compress_size]
  if len(stored) < info.compress_size and len(data) == expected + info.compress_size:
    stored = hf_data_files.read_range(archive, info.header_offset + start, info.compress_size)
  try:
    content = _INFLATE[info.compress_type](stored)
  except (zlib.error, OSError, ValueError, EOFError) as e:
    raise images.UnreadableImage(f'damaged in its archive ({e})') from None
  if len(content) != info.file_size or zlib.crc32(content) != info.CRC:
    raise images.UnreadableImage(
        'damaged in its archive: its bytes are not those it was zipped with'
    )
  return content
