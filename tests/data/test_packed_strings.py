"""PackedStrings against the list of its strings, and what it saves a worker process."""

import pickle
import tracemalloc

import numpy as np
import pytest

from vit_jax.data import packed_strings

_ALPHABET = ['a', 'b', '/', '.', 'é', '猫', '\U0001f431', '\udcff']  # \udcff: a name's bad byte.


def _random_strings(rng: np.random.Generator, count: int) -> list[str]:
  prefix = ''.join(rng.choice(_ALPHABET, rng.integers(0, 4)))
  return [prefix + ''.join(rng.choice(_ALPHABET, rng.integers(0, 6))) for _ in range(count)]


@pytest.mark.parametrize('seed', range(20))
def test_it_is_the_list_of_its_strings_indexed_sliced_and_pickled(seed):
  rng = np.random.default_rng(seed)
  strings = _random_strings(rng, int(rng.integers(0, 30)))
  packed = packed_strings.PackedStrings(strings)
  assert len(packed) == len(strings) and list(packed) == strings
  for k in range(-len(strings), len(strings)):
    assert packed[k] == strings[k]
  for k in (len(strings), -len(strings) - 1):
    with pytest.raises(IndexError):
      packed[k]  # pylint: disable=pointless-statement
  for _ in range(20):
    start, stop = rng.integers(-35, 35, 2)
    step = int(rng.choice([-3, -1, 1, 2, 5]))
    sliced = packed[start:stop:step]
    assert isinstance(sliced, packed_strings.PackedStrings)
    assert list(sliced) == strings[start:stop:step]
    assert list(sliced[::2]) == strings[start:stop:step][::2]
  assert list(pickle.loads(pickle.dumps(packed))) == strings


def test_a_worker_unpickles_a_splits_paths_in_a_third_of_a_lists_memory():
  paths = [
      f'/data/imagenet/train/n{c:08d}/n{c:08d}_{i}.JPEG' for c in range(100) for i in range(500)
  ]
  held = {}
  for name, value in (('list', paths), ('packed', packed_strings.PackedStrings(paths))):
    data = pickle.dumps(value)
    tracemalloc.start()
    loaded = pickle.loads(data)
    held[name] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert list(loaded) == paths
  assert held['packed'] < held['list'] / 3, held
