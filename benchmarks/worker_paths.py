"""What an image folder's paths cost each worker process: packed (PackedStrings) against a list.

  python benchmarks/worker_paths.py [--classes=1000 --per_class=1281 --rounds=3]

A worker process receives a split's records pickled (folder._StridedFiles: the paths and their
labels); ImageNet-1k's train split is 1.28 million paths of its layout
(/data/imagenet/train/n01440764/n01440764_10026.JPEG). For the paths packed and as the list of str
they were before: the pickle's size, the time to unpickle it (the best of `--rounds`), the memory
the unpickled records hold (tracemalloc), and the time to read one record's path, each as a ratio
(packed / list).

Then the same paths as files of a zip archive (`dataset='folder'` on `imagenet.zip`, the files
empty): what a worker process pays before it reads its first image from it: zipfile's listing of
the archive, which each worker made before (the time, the memory it holds), against mapping the
archive's index that the first process made in the dataset cache (zip_members.py), as a ratio.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse
import pickle
import platform
import time
import tracemalloc

import tempfile
import zipfile

import numpy as np

from vit_jax.data import dataset_cache  # pylint: disable=wrong-import-position
from vit_jax.data import folder  # pylint: disable=wrong-import-position
from vit_jax.data import packed_strings  # pylint: disable=wrong-import-position
from vit_jax.data import zip_members  # pylint: disable=wrong-import-position

_READS = 100_000


def measure(files, labels: np.ndarray, rounds: int) -> dict[str, float]:
  data = pickle.dumps(folder._StridedFiles(files, labels))  # pylint: disable=protected-access
  seconds = []
  for _ in range(rounds):
    start = time.perf_counter()
    pickle.loads(data)
    seconds.append(time.perf_counter() - start)
  tracemalloc.start()
  records = pickle.loads(data)
  held = tracemalloc.get_traced_memory()[0]
  tracemalloc.stop()
  ks = np.random.default_rng(0).integers(0, len(labels), _READS).tolist()
  start = time.perf_counter()
  for k in ks:
    records(k)
  read = (time.perf_counter() - start) / _READS
  return {
      'MB pickled': len(data) / 1e6,
      's to unpickle': min(seconds),
      'MB held': held / 1e6,
      'us a record': read * 1e6,
  }


def _held(first_read) -> tuple[float, float]:
  """(seconds, MB held) of a fresh process's `first_read()` of an archive (timed untraced): what
  it returns is kept, as a worker kept its listing."""
  fresh = zip_members._index.cache_clear  # pylint: disable=protected-access
  fresh()
  start = time.perf_counter()
  first_read()
  seconds = time.perf_counter() - start
  fresh()
  tracemalloc.start()
  kept = first_read()
  held = tracemalloc.get_traced_memory()[0]
  tracemalloc.stop()
  del kept
  return seconds, held / 1e6


def measure_zip(paths: list[str]) -> dict[str, tuple[float, float]]:
  with tempfile.TemporaryDirectory() as directory:
    os.environ[dataset_cache.CACHE_VARIABLE] = os.path.join(directory, 'cache')
    archive = os.path.join(directory, 'imagenet.zip')
    with zipfile.ZipFile(archive, 'w') as f:
      for path in paths:
        f.writestr(path[1:], b'')
    name = paths[len(paths) // 2][1:]
    zip_members.read(archive, name)  # The first process: it lists the archive, makes the index.
    return {
        'zipfile listing (each worker, before)': _held(
            lambda: zip_members._files(archive)  # pylint: disable=protected-access
        ),
        'index mapped (each worker, now)': _held(lambda: zip_members.read(archive, name)),
    }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--classes', type=int, default=1000)
  parser.add_argument('--per_class', type=int, default=1281)
  parser.add_argument('--rounds', type=int, default=3)
  args = parser.parse_args()
  paths = [
      f'/data/imagenet/train/n{c:08d}/n{c:08d}_{i}.JPEG'
      for c in range(args.classes)
      for i in range(args.per_class)
  ]
  labels = np.repeat(np.arange(args.classes, dtype=np.int32), args.per_class)
  rows = {
      'list': measure(paths, labels, args.rounds),
      'packed': measure(packed_strings.PackedStrings(paths), labels, args.rounds),
  }
  print(f'# {len(paths)} paths, {platform.processor() or platform.machine()}, {time.ctime()}')
  columns = list(rows['list'])
  print('| paths | ' + ' | '.join(columns) + ' |')
  print('|---' * (len(columns) + 1) + '|')
  for name, row in rows.items():
    print(f'| {name} | ' + ' | '.join(f'{row[c]:.3g}' for c in columns) + ' |')
  ratios = ', '.join(f'{c} {rows["packed"][c] / rows["list"][c]:.3g}x' for c in columns)
  print(f'packed / list: {ratios}')
  zipped = measure_zip(paths)
  print("\n| a worker's first read from the zip | s | MB held |\n|---|---|---|")
  for name, (seconds, held) in zipped.items():
    print(f'| {name} | {seconds:.3g} | {held:.3g} |')
  before, now = zipped.values()
  print(f'index / listing: s {now[0] / before[0]:.3g}x, MB held {now[1] / before[1]:.3g}x')


if __name__ == '__main__':
  main()
