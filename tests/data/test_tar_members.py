"""tar_members reads a tar's regular files, their names and where their bytes lie, as Python's tarfile
does: on random archives of each of its formats, and the errors it raises."""

import io
import tarfile

import numpy as np
import pytest

from vit_jax.data import tar_members


def _listed(content: bytes) -> list[tuple[str, int, int]]:
  return [tuple(m) for m in tar_members.regular_files(io.BytesIO(content))]


def _tarfile_listed(content: bytes) -> list[tuple[str, int, int]]:
  with tarfile.open(fileobj=io.BytesIO(content), mode='r:') as tar:
    return [(m.name, m.offset_data, m.size) for m in tar if m.isreg()]


def _random_tar(rng, tar_format: int) -> bytes:
  """Files of random sizes (0 to a few blocks) and names (past ustar's 100 and 255 characters, not
  ASCII, in folders), among folders, links and empty files; pax archives with a global header."""
  out = io.BytesIO()
  global_headers = {'comment': 'made by a test'} if tar_format == tarfile.PAX_FORMAT else None
  with tarfile.open(fileobj=out, mode='w', format=tar_format, pax_headers=global_headers) as tar:
    for k in range(rng.integers(0, 30)):
      length = rng.choice([3, 40, 99, 100, 101, 120, 200, 300])
      stem = ''.join(rng.choice(list('abcxyz_-')) for _ in range(length))
      if tar_format != tarfile.USTAR_FORMAT and rng.random() < 0.2:
        stem = f'é{stem}ü'
      name = f'{"/".join(["d"] * rng.integers(0, 4))}/{stem}.{k}.jpg'.lstrip('/')
      if tar_format == tarfile.USTAR_FORMAT and len(name.encode()) > 100:
        name = f'{"p" * 60}/{stem[:90]}.{k}'  # Ustar: a prefix of up to 155 and a name of 100.
      info = tarfile.TarInfo(name)
      kind = rng.random()
      if kind < 0.1:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
      elif kind < 0.2:
        info.type, info.linkname = tarfile.SYMTYPE, 'elsewhere'
        tar.addfile(info)
      else:
        data = rng.bytes(int(rng.choice([0, 1, 511, 512, 513, 3000])))
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
  return out.getvalue()


@pytest.mark.parametrize(
    'tar_format', [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT], ids=str
)
def test_regular_files_are_tarfiles_on_random_archives(tar_format):
  rng = np.random.default_rng(tar_format)
  for _ in range(40):
    content = _random_tar(rng, tar_format)
    listed = _listed(content)
    assert listed == _tarfile_listed(content)
    for name, offset, size in listed:
      with tarfile.open(fileobj=io.BytesIO(content)) as tar:
        assert content[offset : offset + size] == tar.extractfile(name).read()


def test_gnu_base_256_sizes_and_the_ends_tarfile_ends_at():
  for value in (0, 7, 8**11 - 1, 8**11, 2**40 + 3):
    field = tarfile.itn(value, 12, tarfile.GNU_FORMAT)
    assert tar_members._number(field) == value  # pylint: disable=protected-access
  one = io.BytesIO()
  with tarfile.open(fileobj=one, mode='w') as tar:
    info = tarfile.TarInfo('a.cls')
    info.size = 1
    tar.addfile(info, io.BytesIO(b'7'))
  whole = one.getvalue()
  # After the first header, tarfile ends at a damaged header, as at a zero block.
  damaged = whole[:1024] + b'\1' * 512 + whole[1536:]
  assert _listed(damaged) == _tarfile_listed(damaged) == [('a.cls', 512, 1)]


@pytest.mark.parametrize(
    'content, message',
    [
        (b'', 'empty file'),
        (b'version https://git-lfs.github.com/spec/v1\n', 'truncated header'),
        (b'\x1f\x8b' + bytes(1022), 'bad checksum'),
    ],
    ids=['empty', 'short', 'gzip'],
)
def test_what_is_not_a_tar_is_tarfiles_read_error(content, message):
  with pytest.raises(tarfile.ReadError, match=message):
    _listed(content)
  with pytest.raises(tarfile.ReadError):
    _tarfile_listed(content)


def test_a_tar_cut_inside_a_file_is_a_read_error():
  out = io.BytesIO()
  with tarfile.open(fileobj=out, mode='w') as tar:
    info = tarfile.TarInfo('a.jpg')
    info.size = 2000
    tar.addfile(info, io.BytesIO(bytes(2000)))
  with pytest.raises(tarfile.ReadError, match='unexpected end of data'):
    _listed(out.getvalue()[:1500])
