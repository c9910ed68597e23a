"""The readability probe of a split of image files, before a run writes anything: a sample decoded
as the pipeline decodes them, so that a folder of files that are not images (a git-lfs checkout's
pointers) stops the run at once, rather than each file being skipped with a warning in training
on nothing."""

import concurrent.futures
import os
from typing import Callable

from vit_jax.data import images as data_images

# The readability probe decodes this many files of a class, of this many classes of a split (each
# evenly spread over the sorted ones): at most 192 files, whatever the size of the split. Reads run
# _PROBE_THREADS at a time, so the latency of cloud storage is paid about 12 times, not 192.
_PROBE_PER_CLASS = 3
_PROBE_CLASSES = 64
_PROBE_THREADS = 16
_PROBE_FIX = 'check that they are images (a git-lfs checkout needs `git lfs pull`)'


def spread(items: list, k: int) -> list:
  """`k` of `items`, evenly spread, in order (all of them if there are no more)."""
  n = len(items)
  return list(items) if n <= k else [items[i * n // k] for i in range(k)]


def _why_unreadable(path: str, read: Callable[[str], bytes]) -> str | None:
  """None if the file decodes as the pipeline decodes it, else why not, in one line."""
  try:
    data_images.check(read(path))
    return None
  except data_images.UnreadableImage as e:
    return str(e)
  except OSError as e:
    return e.strerror or str(e)


def probe(split: str, sampled: list[str], read: Callable[[str], bytes]) -> dict[str, str | None]:
  """Why each of the split's `sampled` files (their bytes `read(path)`) does not decode as the
  pipeline decodes it (None where it does), read _PROBE_THREADS at a time; a one-line ValueError
  where none does (a git-lfs checkout's pointers): the run would skip each, with a warning, and
  train on nothing."""
  with concurrent.futures.ThreadPoolExecutor(_PROBE_THREADS) as pool:
    reasons = dict(zip(sampled, pool.map(lambda path: _why_unreadable(path, read), sampled)))
  if reasons and all(reasons.values()):
    raise ValueError(
        f'No image of split {split!r} decodes: none of {len(sampled)} sampled, e.g. '
        f'{sampled[0]} ({reasons[sampled[0]]}); {_PROBE_FIX}'
    )
  return reasons


def check_classes(
    split: str,
    split_dir: str,
    files: dict[str, list[str]],
    read: Callable[[str], bytes],
    *,
    train: bool,
) -> None:
  """Raises a ValueError if none of a sample of the split's images decodes, or in the train split none
  of a class's: without it a folder of files that are not images (a git-lfs checkout without `git lfs
  pull`) would train on nothing, each file skipped with a warning."""
  probed = {
      name: spread(names, _PROBE_PER_CLASS)
      for name, names in spread([(n, f) for n, f in files.items() if f], _PROBE_CLASSES)
  }
  sampled = [os.path.join(split_dir, name, f) for name, names in probed.items() for f in names]
  reasons = probe(split, sampled, read)
  if not train:
    return  # An evaluation skips unreadable files; a class without images is no obstacle there.
  for name, names in probed.items():
    path = os.path.join(split_dir, name, names[0])
    if all(reasons[os.path.join(split_dir, name, f)] for f in names):
      # Its other files, until one decodes: a class whose sampled files are broken may have others.
      rest = (os.path.join(split_dir, name, f) for f in files[name] if f not in names)
      if any(_why_unreadable(other, read) is None for other in rest):
        continue
      raise ValueError(
          f'Class {name!r} has no readable train image: none of its {len(files[name])} '
          f'decodes, e.g. {path} ({reasons[path]}); {_PROBE_FIX}, or remove the class folder'
      )
