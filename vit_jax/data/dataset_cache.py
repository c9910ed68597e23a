"""What a machine writes once to read a dataset by index: a split's Parquet files copied into one
Arrow file, a split's WebDataset tar files indexed. In $VIT_JAX_DATASETS_CACHE (default
$XDG_CACHE_HOME/vit_jax/datasets, ~/.cache/...), named by the paths, sizes and modification times of
the files it was made from (as `datasets` names its cache) and, on local disks, their inode change
times and inode numbers: `cp -p` and `rsync -a` keep a changed file's size and modification time
but not those, so a changed file is read again. Hosts that share the folder (a cluster's shared file
system) share what one of them made from the same files; hosts with their own copies make their own.
"""

import concurrent.futures
import hashlib
import json
import os
import shutil
from typing import Any, Callable, Sequence, TypeVar
import uuid

from absl import logging
from etils import epath

from vit_jax.runtime import paths

CACHE_VARIABLE = 'VIT_JAX_DATASETS_CACHE'  # The tests set theirs.
_STAT_THREADS = 16
T = TypeVar('T')


def cache_dir() -> str:
  return os.environ.get(CACHE_VARIABLE) or paths.user_cache('datasets')


def size_and_time(path: str) -> tuple[int, float]:
  """A file's size in bytes and its modification time, on local disk or cloud storage."""
  if paths.is_url(path):
    stat = epath.Path(path).stat()
    return stat.length, stat.mtime
  stat = os.stat(path)
  return stat.st_size, stat.st_mtime_ns


def _identity(path: str) -> tuple[Any, ...]:
  """What tells a file's contents apart without reading them: its size and times (a cloud object's
  time is its last upload's) and, on a local disk, its inode."""
  if paths.is_url(path):
    return size_and_time(path)
  stat = os.stat(path)
  return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


def of_each(files: Sequence[str], look: Callable[[str], T]) -> list[T]:
  """`look(file)` of each of `files`, in order; on cloud storage _STAT_THREADS at a time: a request
  or a few each (a thousand shards looked at one by one took ~30 s at every start)."""
  threads = _STAT_THREADS if files and paths.is_url(files[0]) else 1
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    return list(pool.map(look, files))


def cache_path(files: tuple[str, ...], what: Any, suffix: str) -> str:
  """Where what is made of `files` (`what`: JSON, e.g. the columns copied) goes."""
  stats = of_each(files, lambda f: (paths.absolute(f), *_identity(f)))
  key = hashlib.sha256(json.dumps([stats, what]).encode()).hexdigest()[:24]
  return os.path.join(cache_dir(), f'{key}{suffix}')


def _remove(path: str) -> None:
  if os.path.isdir(path):
    shutil.rmtree(path)
  elif os.path.exists(path):
    os.remove(path)


def made_once(path: str, needed_bytes: int, doing: str, write: Callable[[str], None]) -> str:
  """`path` (a file or a folder), made by `write(partial)` on the first call and logged as `doing`;
  it exists only once whole. The processes that want it (launch/local.py's, a shared cache's hosts)
  take turns: one makes it, the others then find it. Each path has its own lock: the hosts of a
  shared cache make their own data shards' copies at once."""
  import filelock  # pylint: disable=g-import-not-at-top

  if os.path.exists(path):
    return path
  lock = filelock.FileLock(f'{path}.lock')
  try:
    os.makedirs(cache_dir(), exist_ok=True)
    lock.acquire()
  except OSError as e:  # Left to a reader, a file it reads would be "unreadable" for this.
    raise ValueError(
        f'{doing}: the dataset cache {cache_dir()} cannot be written ({e.strerror or e}): set '
        f'{CACHE_VARIABLE} to a folder this process may write'
    ) from None
  try:
    if os.path.exists(path):
      return path
    free = shutil.disk_usage(cache_dir()).free
    if needed_bytes > free:
      raise ValueError(
          f'{doing} needs {needed_bytes / 1e9:.1f} GB in {cache_dir()}, which has '
          f'{free / 1e9:.1f} GB free: set {CACHE_VARIABLE} to a folder on a disk with room'
      )
    logging.info('%s, once, into %s', doing, cache_dir())
    partial = f'{path}.{os.getpid()}-{uuid.uuid4().hex}.partial'
    try:
      write(partial)
      try:
        os.replace(partial, path)
      except OSError:  # A folder another machine made meanwhile (a shared file system's lock
        if not os.path.exists(path):  # may not hold): the same contents, which it keeps.
          raise
    finally:
      _remove(partial)
  finally:
    lock.release()
  return path
