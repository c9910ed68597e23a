"""From a function of row index to an iterator of batches: built in threads of this process, or in
grain's worker processes, whose batches come back through shared memory mapped once.

grain hands a worker's batch back in a new shared-memory block per batch: the worker copies the batch
in, and both processes fault in every page afresh (~1,200 pages for a batch of 32 images of 224 px:
5.8 ms of CPU a batch, as much as preparing 17 of those digits). Here each worker writes its batches
straight into one of `SLOTS` batch-sized slots of its own `_Ring`, mapped once by it and by the
consuming process, and sends the slot's index; the consumer copies the batch out and gives the slot
back through a pipe (reads and writes of a pipe are system calls, so the slot is written again only
after the copy has read it). The memory is an anonymous file (memfd) and the pipe the consumer's
own, which a worker opens through /proc: nothing is left behind, however a run ends. Elsewhere than
Linux, grain's own hand-over.
"""

import dataclasses
import mmap
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
import weakref
from typing import Any, Callable

from absl import flags
from absl import logging
import grain
import numpy as np

from vit_jax.runtime import cpuinfo

# A batch's arrays without the batch axis: name -> (shape, dtype).
Spec = dict[str, tuple[tuple[int, ...], Any]]

# Batch slots a worker's ring holds: one being written, the rest waiting in grain's buffers.
SLOTS = 3
_RING_SUPPORTED = sys.platform == 'linux' and hasattr(os, 'memfd_create')
# The index grain gave this worker process (None in any other process).
_worker_index: int | None = None


def _layout(spec: Spec, batch_size: int) -> tuple[list[tuple[str, tuple[int, ...], Any, int]], int]:
  """[(name, batch shape, dtype, byte offset in a slot)], and a slot's bytes (64-byte aligned)."""
  fields, offset = [], 0
  for name, (shape, dtype) in spec.items():
    shape = (batch_size, *shape)
    fields.append((name, shape, np.dtype(dtype), offset))
    offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 64) * 64
  return fields, offset


def _views(buffer: Any, fields, slot_bytes: int, slot: int) -> dict[str, np.ndarray]:
  start = slot * slot_bytes
  return {
      name: np.frombuffer(buffer, dtype, int(np.prod(shape)), start + offset).reshape(shape)
      for name, shape, dtype, offset in fields
  }


@dataclasses.dataclass(frozen=True)
class _Filled:
  """A batch a worker wrote into slot `slot` of its ring."""

  worker: int
  slot: int


class _Ring:
  """Each worker's slots (one memfd each) and the pipes that give them back, held by the consuming
  process; `writer()` is what a worker needs to reach its own."""

  def __init__(self, spec: Spec, batch_size: int, workers: int):
    self._fields, self._slot_bytes = _layout(spec, batch_size)
    size = SLOTS * self._slot_bytes
    self._memfds = [os.memfd_create('vit_jax-batches') for _ in range(workers)]
    self._maps = []
    self._pipes = []
    for fd in self._memfds:
      os.ftruncate(fd, size)
      self._maps.append(mmap.mmap(fd, size))
      read_end, write_end = os.pipe()
      os.write(write_end, bytes(range(SLOTS)))  # Every slot free.
      self._pipes.append((read_end, write_end))
    fds = self._memfds + [fd for pipe in self._pipes for fd in pipe]
    self._finalizer = weakref.finalize(self, _close, self._maps, fds)

  def writer(self) -> '_RingWriter':
    return _RingWriter(
        os.getpid(),
        tuple(self._memfds),
        tuple(read_end for read_end, _ in self._pipes),
        self._fields,
        self._slot_bytes,
    )

  def read(self, filled: _Filled) -> dict[str, np.ndarray]:
    """The batch in the slot, copied out; the slot goes back to its worker."""
    views = _views(self._maps[filled.worker], self._fields, self._slot_bytes, filled.slot)
    batch = {name: view.copy() for name, view in views.items()}
    del views  # No view of the slot outlives the copy.
    os.write(self._pipes[filled.worker][1], bytes([filled.slot]))
    return batch

  def close(self) -> None:
    """Ends the workers' waits for a slot (they read the end of the pipe), so that grain's close
    finds them stopping, not waiting for slots that no one will give back."""
    self._finalizer()


def _close(maps: list[mmap.mmap], fds: list[int]) -> None:
  for fd in fds:
    os.close(fd)
  for m in maps:
    try:
      m.close()
    except BufferError:  # A view still exported (a batch being read as the run ends): left to exit.
      pass


class _RingWriter:
  """A worker's side of a `_Ring`: it pickles as the consuming process's descriptors, which the
  worker opens through /proc when it first writes."""

  def __init__(self, pid, memfds, free_pipes, fields, slot_bytes):
    self._pid, self._memfds, self._free_pipes = pid, memfds, free_pipes
    self._fields, self._slot_bytes = fields, slot_bytes
    self._opened = None  # (mmap, free pipe) in the worker.

  def __getstate__(self):
    return {**self.__dict__, '_opened': None}

  def _open(self, worker: int) -> tuple[mmap.mmap, int]:
    try:
      memfd = os.open(f'/proc/{self._pid}/fd/{self._memfds[worker]}', os.O_RDWR)
      free = os.open(f'/proc/{self._pid}/fd/{self._free_pipes[worker]}', os.O_RDONLY)
    except OSError as e:
      raise OSError(
          f"A data worker cannot open its batches' shared memory ({e}): set "
          '--config.data_workers=0 (threads)'
      ) from None
    shared = mmap.mmap(memfd, SLOTS * self._slot_bytes)
    os.close(memfd)
    return shared, free

  def acquire(self) -> tuple[int, int, dict[str, np.ndarray]]:
    """(this worker, a free slot, its arrays): waits while all its slots are being read."""
    worker = _worker_index
    if self._opened is None:
      self._opened = self._open(worker)
    shared, free = self._opened
    token = os.read(free, 1)
    if not token:
      raise EOFError('the consuming process closed its batches')
    return worker, token[0], _views(shared, self._fields, self._slot_bytes, token[0])


class _Batches:
  """Batch k: rows k * batch_size ... of `row`, each a dict of the spec's arrays, written into a
  ring slot (in a worker) or new arrays."""

  def __init__(self, row: Callable[[int], dict], spec: Spec, batch_size: int, writer=None):
    self._row, self._spec, self._batch_size, self._writer = row, spec, batch_size, writer

  def __call__(self, k: int) -> dict[str, np.ndarray] | _Filled:
    if self._writer is None:
      arrays = {
          name: np.empty((self._batch_size, *shape), dtype)
          for name, (shape, dtype) in self._spec.items()
      }
      filled = arrays
    else:
      worker, slot, arrays = self._writer.acquire()
      filled = _Filled(worker, slot)
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


def _ring_or_none(spec: Spec, batch_size: int, workers: int) -> _Ring | None:
  """The workers' ring; None (grain's own hand-over) without workers, off Linux, or where the
  system refuses anonymous shared memory (a sandbox's seccomp filter)."""
  if not workers or not _RING_SUPPORTED:
    return None
  try:
    return _Ring(spec, batch_size, workers)
  except OSError as e:
    logging.warning("Data workers hand batches over through grain's shared memory: %s", e)
    return None


class BatchIterator:
  """Batches in order (`next`); `close()` (or the iterator's end, or the interpreter's) ends the
  worker processes: first their waits for a slot, then grain's iterator, which would otherwise wait
  25 s for each worker waiting on a slot no one gives back."""

  def __init__(self, batches: grain.DatasetIterator, ring: _Ring | None):
    self._batches = batches
    self._closer = weakref.finalize(self, _close_iterator, batches, ring)

  def __iter__(self) -> 'BatchIterator':
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    return next(self._batches)

  def close(self) -> None:
    self._closer()


def _close_iterator(batches: grain.DatasetIterator, ring: _Ring | None) -> None:
  if ring:
    ring.close()
  batches.close()


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
  ring = _ring_or_none(spec, batch_size, workers)
  batches = _Batches(row, spec, batch_size, ring.writer() if ring else None)
  ds = grain.MapDataset.range(first, end).map(batches)
  if not workers:
    it = ds.to_iter_dataset(
        grain.ReadOptions(num_threads=min(4, cpuinfo.usable_cores()), prefetch_buffer_size=4)
    )
    return BatchIterator(iter(it), None)
  if not flags.FLAGS.is_parsed():
    # grain reads its absl flags when it starts workers: a caller that parsed none (a notebook, a
    # test; commands parse theirs) would get UnparsedFlagAccessError. Their defaults it is.
    flags.FLAGS.mark_as_parsed()
  _quiet_resource_tracker()
  # Each worker builds whole batches in its own thread; two batches ahead each.
  it = ds.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
  it = it.mp_prefetch(
      grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2),
      worker_init_fn=_worker_init,
  )
  return BatchIterator(iter(it.map(ring.read) if ring else it), ring)
