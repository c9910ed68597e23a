"""The batches of grain's worker processes, handed over through each worker's ring of shared slots
(vit_jax/data/batching.py, ring.py): the same batches as in this process, whatever the consumer
keeps, and nothing left behind; an evaluation's passes from workers started once."""

import gc
import itertools
import multiprocessing
import os
import time

import numpy as np
import pytest

import helpers
from vit_jax import data
from vit_jax.data import batching
from vit_jax.data import ring

pytestmark = pytest.mark.skipif(not ring.SUPPORTED, reason='the ring is Linux-only')


def _config(workers: int):
  return helpers.data_config(
      None, image_size=16, data_workers=workers, pp=dict(crop='inception', flip=True)
  )


def _take(iterator, n: int) -> list[dict[str, np.ndarray]]:
  try:
    return list(itertools.islice(iterator, n))
  finally:
    iterator.close()


def test_batches_the_consumer_keeps_are_not_written_over():
  """Each worker has 3 slots, reused for its 4th batch on: every batch kept here must still be the
  batch this process builds (a batch that were a view of its slot would now hold a later one)."""
  kept = _take(data.train_iterator(_config(2), local_batch_size=8), 16)
  want = _take(data.train_iterator(_config(0), local_batch_size=8), 16)
  for got, expected in zip(kept, want, strict=True):
    assert got.keys() == expected.keys()
    for name in got:
      assert got[name].dtype == expected[name].dtype
      np.testing.assert_array_equal(got[name], expected[name])


def test_eval_batches_through_the_ring_are_the_in_process_ones():
  config = _config(2)
  got = list(data.eval_iterator(config, 'test', local_batch_size=64))
  want = list(data.eval_iterator(_config(0), 'test', local_batch_size=64))
  assert len(got) == len(want) == 6
  for g, w in zip(got, want):
    for name in w:
      np.testing.assert_array_equal(g[name], w[name])
  assert not got[-1]['mask'].all()  # The padding rows came through too.


def test_close_ends_workers_that_wait_for_a_slot_at_once():
  """An endless stream's workers fill their slots and wait for one back: closing must end that wait
  (grain's close otherwise waits 25 s for each worker before killing it)."""
  batches = data.train_iterator(_config(2), local_batch_size=8)
  next(batches)
  time.sleep(3)  # Long enough for both workers to fill every slot and wait.
  start = time.monotonic()
  batches.close()
  assert time.monotonic() - start < 10


def test_an_iterator_dropped_without_close_ends_its_workers_at_once():
  batches = data.train_iterator(_config(2), local_batch_size=8)
  next(batches)
  time.sleep(3)
  start = time.monotonic()
  del batches  # As a notebook does with an iterator it no longer needs.
  gc.collect()
  assert time.monotonic() - start < 10


def _open_descriptors() -> list[str]:
  links = []
  for fd in os.listdir('/proc/self/fd'):
    try:
      links.append(os.readlink(f'/proc/self/fd/{fd}'))
    except FileNotFoundError:  # The listing's own descriptor, closed since.
      pass
  return links


def _ring_mappings() -> int:
  with open('/proc/self/maps') as maps:
    return maps.read().count('vit_jax-batches')


def test_nothing_of_the_ring_outlives_its_iterator():
  # grain's and multiprocessing's own first-use descriptors (the resource tracker's) stay.
  _take(data.train_iterator(_config(2), local_batch_size=8), 1)
  gc.collect()
  before = len(_open_descriptors())
  batches = data.train_iterator(_config(2), local_batch_size=8)
  next(batches)
  assert _ring_mappings() == 2  # One ring a worker, mapped here,
  assert any('vit_jax-batches' in link for link in _open_descriptors())  # and open.
  batches.close()
  del batches
  gc.collect()
  assert _ring_mappings() == 0
  assert not any('vit_jax-batches' in link for link in _open_descriptors())
  assert len(_open_descriptors()) <= before  # Its pipes too.


def test_a_slot_holds_every_array_of_the_spec_aligned():
  fields, slot_bytes = ring._layout(  # pylint: disable=protected-access
      {'image': ((5, 5, 3), np.uint8), 'label': ((), np.int32), 'mask': ((), bool)}, 3
  )
  assert [(name, shape) for name, shape, _, _ in fields] == [
      ('image', (3, 5, 5, 3)),
      ('label', (3,)),
      ('mask', (3,)),
  ]
  offsets = [offset for *_, offset in fields]
  assert offsets == [0, 256, 320] and slot_bytes == 384


@pytest.mark.parametrize('workers', (0, 2))
def test_a_row_without_a_field_of_the_spec_is_an_error_not_stale_pixels(workers):
  spec = {'image': ((2,), np.uint8), 'label': ((), np.int32)}

  def row(i):
    return (
        {'image': np.full(2, i, np.uint8)}
        if i == 5
        else {'image': np.full(2, i, np.uint8), 'label': np.int32(i)}
    )

  batches = batching.iterate(row, spec, batch_size=4, first=0, end=3, workers=workers)
  try:
    np.testing.assert_array_equal(next(batches)['label'], [0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"row 5 has \['image'\], not \['image', 'label'\]"):
      next(batches)
  finally:
    batches.close()


def _slot_bytes_in_memory() -> int:
  """Bytes of the rings' memfds that hold pages (a released slot holds none)."""
  blocks = 0
  for fd in os.listdir('/proc/self/fd'):
    try:
      if 'vit_jax-batches' in os.readlink(f'/proc/self/fd/{fd}'):
        blocks += os.stat(f'/proc/self/fd/{fd}').st_blocks
    except FileNotFoundError:
      pass
  return blocks * 512


def test_passes_are_the_same_batches_from_workers_started_once():
  want = list(data.eval_iterator(_config(0), 'test', local_batch_size=64))
  passes = data.eval_passes(_config(2), 'test', local_batch_size=64)
  try:
    workers = None
    for _ in range(3):
      got = list(passes())
      assert len(got) == len(want) == 6
      for g, w in zip(got, want):
        for name in w:
          np.testing.assert_array_equal(g[name], w[name])
      pids = sorted(child.pid for child in multiprocessing.active_children())
      assert len(pids) >= 2 and pids == (workers or pids)  # The same processes every pass.
      workers = pids
      time.sleep(1)  # Long enough for a worker to build ahead, which the gate must stop:
      assert _slot_bytes_in_memory() == 0  # no batch is held between passes.
  finally:
    passes.close()
  deadline = time.monotonic() + 10  # The workers, each waiting for a pass, end at once.
  while multiprocessing.active_children() and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not multiprocessing.active_children()


def test_a_pass_left_unfinished_is_read_to_its_end_and_the_next_starts_at_batch_0():
  want = list(data.eval_iterator(_config(0), 'test', local_batch_size=64))
  passes = data.eval_passes(_config(2), 'test', local_batch_size=64)
  try:
    first = passes()
    np.testing.assert_array_equal(next(first)['image'], want[0]['image'])
    del first  # As a consumer whose step raised: 5 batches of the pass not read.
    got = list(passes())
    assert len(got) == 6
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g['image'], w['image'])
  finally:
    passes.close()


def test_passes_after_close_start_their_workers_again():
  passes = data.eval_passes(_config(2), 'test', local_batch_size=64)
  try:
    before = [b['label'] for b in passes()]
    passes.close()
    np.testing.assert_array_equal([b['label'] for b in passes()], before)
  finally:
    passes.close()


def test_an_evaluation_starts_no_more_workers_than_it_has_batches(monkeypatch):
  started = []
  start = multiprocessing.process.BaseProcess.start

  def counted_start(process):
    started.append(process.name)
    start(process)

  monkeypatch.setattr(multiprocessing.process.BaseProcess, 'start', counted_start)
  batches = data.eval_iterator(_config(4), 'test', local_batch_size=256)
  try:
    assert len(list(batches)) == 2
  finally:
    batches.close()
  assert len([name for name in started if name.startswith('grain')]) == 2, started
