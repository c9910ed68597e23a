"""From a function of row index to batches: built in threads of this process, or in grain's worker
processes, whose batches come back through a ring of shared slots (ring.py). `iterate` is one stream
of batches; `Passes` is the same batches again and again (an evaluation's), from workers that start
once and wait between passes.
"""

import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import weakref
from typing import Callable, Iterator

from absl import flags
import grain
import numpy as np

from vit_jax.data import ring as ring_lib
from vit_jax.runtime import cpuinfo

Spec = ring_lib.Spec
# The index grain gave this worker process (None in any other process).
_worker_index: int | None = None


class _Batches:
  """Batch k: rows k * batch_size ... of `row` (of batch k % period with a period: passes over the
  same batches), each a dict of the spec's arrays, written into a ring slot (in a worker) or new
  arrays."""

  def __init__(
      self,
      row: Callable[[int], dict],
      spec: Spec,
      batch_size: int,
      writer: ring_lib.RingWriter | None = None,
      period: int | None = None,
  ):
    self._row, self._spec, self._batch_size, self._writer = row, spec, batch_size, writer
    self._period = period

  def __call__(self, k: int) -> dict[str, np.ndarray] | ring_lib.Filled:
    pass_index, k = divmod(k, self._period) if self._period else (0, k)
    if self._writer is None:
      arrays = {
          name: np.empty((self._batch_size, *shape), dtype)
          for name, (shape, dtype) in self._spec.items()
      }
      filled = arrays
    else:
      slot, arrays = self._writer.acquire(_worker_index, pass_index)
      filled = ring_lib.Filled(_worker_index, slot)
    for i in range(self._batch_size):
      row = self._row(k * self._batch_size + i)
      if row.keys() != arrays.keys():  # A field left out would be the slot's last batch's.
        raise ValueError(f'row {k * self._batch_size + i} has {sorted(row)}, not {sorted(arrays)}')
      for name, value in row.items():
        np.copyto(arrays[name][i, ...], value, casting='no')
    return filled


def _worker_init(worker_index: int, worker_count: int) -> None:
  """grain worker set-up. The run decides when its workers stop: Ctrl-C and a scheduler's SIGTERM
  reach every process of the job, and the run saves before it stops them (a worker that died
  there would print its traceback and could break the batch the run is waiting on). A worker also
  ends when the process that started it ends: grain's stop only when told to, so after a SIGKILL of
  the run (the OOM killer, a scheduler's kill after its grace period) they would run on for ever,
  holding their memory and the run's stdout and stderr."""
  del worker_count
  global _worker_index
  _worker_index = worker_index
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  parent = multiprocessing.parent_process()
  if parent is None:
    return

  def exit_when_parent_ends():
    multiprocessing.connection.wait([parent.sentinel])  # Readable once the parent has ended.
    os._exit(1)  # pylint: disable=protected-access

  threading.Thread(target=exit_when_parent_ends, name='exit-with-parent', daemon=True).start()


# multiprocessing's resource tracker, at the end of a run with worker processes, warns of each
# worker's batches still in shared memory ("There appear to be 3 leaked shared_memory objects"), and
# then unlinks them: that is the clean-up, not a leak. It runs in a process of its own, which takes
# its warning filters from this process's -W options when it starts (with the first workers).
_TRACKER_WARNING = 'ignore:resource_tracker:UserWarning'


def _quiet_resource_tracker() -> None:
  if _TRACKER_WARNING not in sys.warnoptions:
    sys.warnoptions.append(_TRACKER_WARNING)


class BatchIterator:
  """Batches in order (`next`); `close()` (or the iterator's end, or the interpreter's) ends the
  worker processes: first their waits for a slot, then grain's iterator, which would otherwise wait
  25 s for each worker waiting on a slot no one gives back."""

  def __init__(self, batches: grain.DatasetIterator, ring: ring_lib.Ring | None):
    self._batches = batches
    self._closer = weakref.finalize(self, _close_iterator, batches, ring)

  def __iter__(self) -> 'BatchIterator':
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._batches)

  def close(self) -> None:
    self._closer()


def _close_iterator(batches: grain.DatasetIterator, ring: ring_lib.Ring | None) -> None:
  if ring:
    ring.close()
  batches.close()


def _start(batches: grain.MapDataset, workers: int, ring: ring_lib.Ring | None) -> BatchIterator:
  """`batches` in order, built in `workers` processes (0: threads of this one, one a core up to
  4), a few ahead of the consumer."""
  if not workers:
    it = batches.to_iter_dataset(
        grain.ReadOptions(num_threads=min(4, cpuinfo.usable_cores()), prefetch_buffer_size=4)
    )
    return BatchIterator(iter(it), None)
  if not flags.FLAGS.is_parsed():
    # grain reads its absl flags when it starts workers: a caller that parsed none (a notebook, a
    # test; commands parse theirs) would get UnparsedFlagAccessError. Their defaults it is.
    flags.FLAGS.mark_as_parsed()
  _quiet_resource_tracker()
  # Each worker builds whole batches in its own thread; two batches ahead each.
  it = batches.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
  it = it.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2),
      worker_init_fn=_worker_init,
  )
  return BatchIterator(iter(it.map(ring.read) if ring else it), ring)


def iterate(
    row: Callable[[int], dict[str, np.ndarray]],
    spec: Spec,
    *,
    batch_size: int,
    first: int,
    end: int,
    workers: int,
) -> BatchIterator:
  """Batches first, first + 1, ... (before `end`) of `row`'s rows, in order, each a dict of the
  spec's arrays [batch_size, ...]: built by `workers` processes (0: threads of this one, one a core
  up to 4), a few ahead of the consumer. grain hands batch i to worker i % workers and reads them
  back in order, so the batches do not depend on the number of workers."""
  ring = ring_lib.ring_or_none(spec, batch_size, workers)
  batches = _Batches(row, spec, batch_size, ring.writer() if ring else None)
  return _start(grain.MapDataset.range(first, end).map(batches), workers, ring)


class Passes:
  """Batches 0 .. num_batches - 1 of `row`'s rows (as `iterate`'s), again at each call: one pass.

  With worker processes, they start at the first pass and stay: between passes each waits, holding
  no batch, until the next pass opens, and the slots' memory goes back to the system. So an
  evaluation every few hundred steps does not start its workers again (1.5 s on 2 cores, imports
  mostly) and holds only idle processes while the run trains. Without the ring (off Linux), and in
  threads, which start in milliseconds, each pass starts its own. A pass left unfinished (an error
  in the consumer) is read to its end before the next, which starts at batch 0. `close()` ends the
  workers; a later pass starts them again.
  """

  def __init__(
      self,
      row: Callable[[int], dict[str, np.ndarray]],
      spec: Spec,
      *,
      batch_size: int,
      num_batches: int,
      workers: int,
  ):
    self._row, self._spec, self._batch_size = row, spec, batch_size
    self._num_batches, self._workers = num_batches, workers
    self._ring: ring_lib.Ring | None = None
    self._batches: BatchIterator | None = None
    self._unread = 0  # Batches of the last pass opened that are not yet read.

  def __call__(self) -> Iterator[dict[str, np.ndarray]]:
    if self._batches is None:
      self._ring = ring_lib.ring_or_none(self._spec, self._batch_size, self._workers, gated=True)
      if self._ring is None:  # Threads, off Linux, or shared memory refused: no gate either.
        yield from self._one_stream()
        return
      batches = _Batches(
          self._row, self._spec, self._batch_size, self._ring.writer(), self._num_batches
      )
      self._batches = _start(grain.MapDataset.range(2**62).map(batches), self._workers, self._ring)
    try:
      for _ in range(self._unread):
        next(self._batches)
      self._unread = self._num_batches
      self._ring.open_pass()
      for _ in range(self._num_batches):
        batch = next(self._batches)
        self._unread -= 1
        yield batch
    except Exception:  # A worker's error: the next pass starts afresh.
      self.close()
      raise
    self._ring.release()

  def _one_stream(self) -> Iterator[dict[str, np.ndarray]]:
    """This pass's batches from threads or workers of its own, without a ring (there is none)."""
    batches = _Batches(self._row, self._spec, self._batch_size)
    batches = _start(grain.MapDataset.range(self._num_batches).map(batches), self._workers, None)
    try:
      yield from batches
    finally:
      batches.close()

  def close(self) -> None:
    if self._batches is not None:
      self._batches.close()
    self._ring, self._batches, self._unread = None, None, 0
