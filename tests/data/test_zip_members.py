"""zip_members against zipfile and `datasets`: on random archives (stored, deflated, bzip2 and LZMA files,
zip64 headers, data descriptors, extra fields, folders, hidden files), the files listed and their
order are those datasets reads from the extracted archive, and each file's bytes are zipfile's."""

import io
import os
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest

from vit_jax.data import hf_data_files
from vit_jax.data import images
from vit_jax.data import zip_members

datasets = pytest.importorskip('datasets')

_FOLDERS = ['cat', 'Dog', 'b c', 'é', '__MACOSX', '.git', 'x.y', '_under', '0']
_FILES = ['a.jpg', 'B.PNG', '.DS_Store', '._a.jpg', '__init__.py', 'z', 'c d.jpeg', 'metadata.csv']
_METHODS = [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]


class _Unseekable(io.RawIOBase):
  """A file zipfile cannot seek back into: it writes each file's sizes after its bytes (a data
  descriptor), as zip does into a pipe."""

  def __init__(self, f):
    super().__init__()
    self._f = f

  def writable(self) -> bool:
    return True

  def write(self, data) -> int:
    return self._f.write(data)


def _random_archive(path, rng) -> None:
  names = {
      '/'.join([*rng.choice(_FOLDERS, rng.integers(4)), rng.choice(_FILES)])
      for _ in range(rng.integers(1, 25))
  }
  with open(path, 'wb') as f:
    out = f if rng.random() < 0.7 else _Unseekable(f)
    with zipfile.ZipFile(out, 'w') as archive:
      for name in sorted(names, key=lambda _: rng.random()):
        folder = os.path.dirname(name) or 'empty'
        if rng.random() < 0.1 and folder + '/' not in archive.namelist():
          archive.mkdir(folder)
        size = int(rng.integers(0, 3000))
        data = bytes(size) if rng.random() < 0.3 else rng.bytes(size)
        info = zipfile.ZipInfo(name, (2020, 1, 2, 3, 4, 6))
        info.compress_type = _METHODS[rng.integers(len(_METHODS))]
        if rng.random() < 0.3:  # An extra field of an unknown kind, in both headers.
          info.extra = struct.pack('<HH', 0x6666, 5) + rng.bytes(5)
        # A forced zip64 header has a longer extra field in the local header than in the central
        # directory's.
        with archive.open(info, 'w', force_zip64=bool(rng.random() < 0.3)) as member:
          member.write(data)


@pytest.mark.parametrize('slack', [zip_members._SLACK, 0])  # pylint: disable=protected-access
def test_random_archives_list_and_read_as_datasets_extracts_them(tmp_path, monkeypatch, slack):
  """A file is one read; with no slack, one whose local header is longer than the central
  directory says is read again from its bytes' start."""
  monkeypatch.setattr(zip_members, '_SLACK', slack)
  ranges = []
  read_range = hf_data_files.read_range
  monkeypatch.setattr(hf_data_files, 'read_range', lambda *a: ranges.append(a) or read_range(*a))
  rng = np.random.default_rng(slack)
  download = datasets.DownloadManager()
  files = 0
  for trial in range(40):
    path = str(tmp_path / f'{trial}.zip')
    _random_archive(path, rng)
    extracted = tmp_path / f'{trial}_extracted'
    with zipfile.ZipFile(path) as archive:
      archive.extractall(extracted)
      theirs = [os.path.relpath(f, extracted) for f in download.iter_files(str(extracted))]
      assert zip_members.names(path) == theirs
      # datasets' imagefolder walks the archive through fsspec, unextracted: the same files.
      walked = download.iter_files(f'zip://::{path}')
      assert [f'zip://{name}::{path}' for name in theirs] == list(walked)
      for name in theirs:
        assert zip_members.read(path, name) == archive.read(name), name
      files += len(theirs)
  assert len(ranges) > files if slack == 0 else len(ranges) == files


def test_a_path_goes_through_an_archive_as_through_a_folder(tmp_path):
  (tmp_path / 'data').mkdir()
  archive = str(tmp_path / 'data/train.zip')
  _zipped(tmp_path / 'data/train.zip')
  assert zip_members.in_archive(f'{archive}/cat/a.jpg') == (archive, 'cat/a.jpg')
  assert zip_members.in_archive(f'{archive}/cat/') == (archive, 'cat')
  assert zip_members.in_archive(archive) == (archive, '')
  assert zip_members.in_archive(str(tmp_path / 'data/cat/a.jpg')) is None
  (tmp_path / 'folder.zip/cat').mkdir(parents=True)  # A folder with an archive's name.
  assert zip_members.in_archive(str(tmp_path / 'folder.zip/cat/a.jpg')) is None
  assert zip_members.folders(archive) == {'': ({'cat'}, []), 'cat': (set(), ['a.jpg'])}


def _zipped(path, encrypted: bool = False, method: int = zipfile.ZIP_STORED) -> bytes:
  """An archive of one stored file; zipfile writes no encrypted file, nor one of a method it does
  not read (e.g. 98, PPMd): `encrypted`'s flag and `method` are set in both headers."""
  data = b'an image, or so'
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr(zipfile.ZipInfo('cat/a.jpg'), data)
  written = bytearray(path.read_bytes())
  for signature, flags in ((b'PK\x03\x04', 6), (b'PK\x01\x02', 8)):
    at = written.index(signature) + flags
    written[at] |= int(encrypted)
    written[at + 2 : at + 4] = struct.pack('<H', method)
  path.write_bytes(bytes(written))
  return data


def test_what_cannot_be_read_is_a_one_line_error(tmp_path):
  _zipped(tmp_path / 'locked.zip', encrypted=True)
  _zipped(tmp_path / 'ppmd.zip', method=98)
  (tmp_path / 'not.zip').write_bytes(b'PK, but no more')
  data = _zipped(tmp_path / 'cut.zip')
  (tmp_path / 'cut.zip').write_bytes((tmp_path / 'cut.zip').read_bytes()[:40])
  for name, expected in (
      ('locked.zip', 'is encrypted: zip the images again without a password'),
      ('ppmd.zip', 'compressed by method 98, which vit_jax does not read: zip the images again'),
      ('not.zip', 'not.zip is not a readable zip archive (File is not a zip file): download it'),
      ('cut.zip', 'cut.zip is not a readable zip archive'),
  ):
    with pytest.raises(ValueError, match='.*') as raised:
      zip_members.names(str(tmp_path / name))
    assert expected in str(raised.value) and '\n' not in str(raised.value), name

  # An archive that changed after it was listed: a file's bytes are checked against its CRC.
  path = str(tmp_path / 'changed.zip')
  _zipped(tmp_path / 'changed.zip')
  assert zip_members.read(path, 'cat/a.jpg') == data
  with open(path, 'r+b') as f:
    found = f.read().index(data)
    f.seek(found)
    f.write(b'AN')
  with pytest.raises(images.UnreadableImage, match='damaged in its archive'):
    zip_members.read(path, 'cat/a.jpg')
  with open(path, 'r+b') as f:
    f.write(b'XX')  # Its first file header.
  with pytest.raises(images.UnreadableImage, match='has changed since it was listed'):
    zip_members.read(path, 'cat/a.jpg')
  with pytest.raises(images.UnreadableImage, match="has no file 'cat/b.jpg'"):
    zip_members.read(path, 'cat/b.jpg')


def _fresh_process() -> None:
  """What a worker process starts with: no listing or index of any archive."""
  for cached in (zip_members._index, zip_members.folders):  # pylint: disable=protected-access
    cached.cache_clear()


def test_a_worker_reads_through_the_mapped_index_without_listing_the_archive(tmp_path, monkeypatch):
  path = str(tmp_path / 'many.zip')
  contents = {
      f'train/n{c:04d}/{i}.jpg': f'{c} {i}'.encode() * (i % 7)
      for c in range(20)
      for i in range(500)
  }
  with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as archive:
    for name, data in contents.items():
      archive.writestr(name, data)
  assert zip_members.read(path, 'train/n0003/17.jpg') == contents['train/n0003/17.jpg']
  _fresh_process()
  monkeypatch.setattr(zipfile, 'ZipFile', None)  # A worker lists nothing.
  tracemalloc.start()
  found = {name: zip_members.read(path, name) for name in list(contents)[::97]}
  held = tracemalloc.get_traced_memory()[0]
  tracemalloc.stop()
  assert found == {name: contents[name] for name in found}
  assert held < 200_000, held  # zipfile's listing of the 10,000 files: ~5 MB.
  with pytest.raises(images.UnreadableImage, match="has no file 'train/n0003/500.jpg'"):
    zip_members.read(path, 'train/n0003/500.jpg')


def test_names_of_the_same_hash_are_told_apart(tmp_path, monkeypatch):
  monkeypatch.setattr(zip_members, '_name_hash', lambda encoded: len(encoded) % 3)
  _fresh_process()
  path = str(tmp_path / 'colliding.zip')
  contents = {f'{"x" * k}/{name}': f'{k}{name}'.encode() for k in range(6) for name in 'abcdé'}
  with zipfile.ZipFile(path, 'w') as archive:
    for name, data in contents.items():
      archive.writestr(name, data)
  for name, data in contents.items():
    assert zip_members.read(path, name) == data, name
  with pytest.raises(images.UnreadableImage, match='has no file'):
    zip_members.read(path, 'xx/f')
  _fresh_process()


@pytest.mark.parametrize('lc, lp, pb', [(3, 0, 2), (0, 4, 0), (1, 3, 4)])
def test_lzma_properties_other_than_zipfiles_are_read(lc, lp, pb):
  """zipfile writes LZMA's default lc/lp/pb; other archivers may not: a member of other properties
  (their byte as liblzma encodes it; it takes lc + lp <= 4) reads back."""
  import lzma  # pylint: disable=g-import-not-at-top

  data = np.random.default_rng(lc).bytes(5000) * 3
  lzma1 = dict(id=lzma.FILTER_LZMA1, dict_size=1 << 16, lc=lc, lp=lp, pb=pb)
  properties = lzma._encode_filter_properties(lzma1)  # pylint: disable=protected-access
  assert properties == bytes([(pb * 5 + lp) * 9 + lc]) + (1 << 16).to_bytes(4, 'little')
  stream = lzma.LZMACompressor(lzma.FORMAT_RAW, filters=[lzma1])
  member = b'\x09\x14' + struct.pack('<H', 5) + properties + stream.compress(data) + stream.flush()
  assert zip_members._unlzma(member) == data  # pylint: disable=protected-access
