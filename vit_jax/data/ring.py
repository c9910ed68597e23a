"""Batches from grain's worker processes to the consuming process through shared memory mapped once.

grain hands a worker's batch back in a new shared-memory block per batch: the worker copies the batch
in, and both processes fault in every page afresh (~1,200 pages for a batch of 32 images of 224 px:
5.8 ms of CPU a batch, as much as preparing 17 of those digits). Here each worker writes its batches
straight into one of `SLOTS` batch-sized slots of its own ring, mapped once by it and by the
consuming process, and sends the slot's index; the consumer copies the batch out and gives the slot
back through a pipe (reads and writes of a pipe are system calls, so the slot is written again only
after the copy has read it). The memory is an anonymous file (memfd) and the pipes the consumer's
own, which a worker opens through /proc: nothing is left behind, however a run ends. Linux only
(`SUPPORTED`); elsewhere grain's own hand-over.

A gated ring also holds each worker at the start of every pass over the same batches until the
consumer opens the pass (`Ring.open_pass`): between an evaluation's passes the workers wait, holding
no batch, and `Ring.release` returns the slots' memory to the system.
"""

import dataclasses
import mmap
import os
import sys
import weakref
from typing import Any

from absl import logging
import numpy as np

# A batch's arrays without the batch axis: name -> (shape, dtype).
Spec = dict[str, tuple[tuple[int, ...], Any]]

# Batch slots a worker's ring holds: one being written, the rest waiting in grain's buffers.
SLOTS = 3
SUPPORTED = sys.platform == 'linux' and hasattr(os, 'memfd_create')


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
class Filled:
  """A batch a worker wrote into slot `slot` of its ring."""

  worker: int
  slot: int


class Ring:
  """Each worker's slots (one memfd each), the pipes that give them back and, if `gated`, the pipes
  that open its passes; held by the consuming process. `writer()` is what a worker needs to reach
  its own."""

  def __init__(self, spec: Spec, batch_size: int, workers: int, gated: bool = False):
    self._fields, self._slot_bytes = _layout(spec, batch_size)
    size = SLOTS * self._slot_bytes
    self._memfds = [os.memfd_create('vit_jax-batches') for _ in range(workers)]
    self._maps = []
    self._free_pipes = []
    for fd in self._memfds:
      os.ftruncate(fd, size)
      self._maps.append(mmap.mmap(fd, size))
      read_end, write_end = os.pipe()
      os.write(write_end, bytes(range(SLOTS)))  # Every slot free.
      self._free_pipes.append((read_end, write_end))
    self._gate_pipes = [os.pipe() for _ in range(workers)] if gated else []
    pipes = self._free_pipes + self._gate_pipes
    fds = self._memfds + [fd for pipe in pipes for fd in pipe]
    self._finalizer = weakref.finalize(self, _close, self._maps, fds)

  def writer(self) -> 'RingWriter':
    return RingWriter(
        os.getpid(),
        tuple(self._memfds),
        tuple(read_end for read_end, _ in self._free_pipes),
        tuple(read_end for read_end, _ in self._gate_pipes) or None,
        self._fields,
        self._slot_bytes,
    )

  def read(self, filled: Filled) -> dict[str, np.ndarray]:
    """The batch in the slot, copied out; the slot goes back to its worker."""
    views = _views(self._maps[filled.worker], self._fields, self._slot_bytes, filled.slot)
    batch = {name: view.copy() for name, view in views.items()}
    del views  # No view of the slot outlives the copy.
    os.write(self._free_pipes[filled.worker][1], bytes([filled.slot]))
    return batch

  def open_pass(self) -> None:
    """Lets every worker of a gated ring build the batches of its next pass."""
    for _, write_end in self._gate_pipes:
      os.write(write_end, b'\0')

  def release(self) -> None:
    """Gives the slots' memory back to the system (they read as zeros after). Only while no worker
    writes: between the passes of a gated ring, after the consumer has read every batch."""
    for shared in self._maps:
      shared.madvise(mmap.MADV_REMOVE)

  def close(self) -> None:
    """Ends the workers' waits for a slot or a pass (they read the end of the pipe), so that grain's
    close finds them stopping, not waiting for slots that no one will give back."""
    self._finalizer()


def _close(maps: list[mmap.mmap], fds: list[int]) -> None:
  for fd in fds:
    os.close(fd)
  for m in maps:
    try:
      m.close()
    except BufferError:  # A view still exported (a batch being read as the run ends): left to exit.
      pass


class RingWriter:
  """A worker's side of a `Ring`: it pickles as the consuming process's descriptors, which the
  worker opens through /proc when it first writes."""

  def __init__(self, pid, memfds, free_pipes, gate_pipes, fields, slot_bytes):
    self._pid, self._memfds = pid, memfds
    self._free_pipes, self._gate_pipes = free_pipes, gate_pipes
    self._fields, self._slot_bytes = fields, slot_bytes
    self._opened = None  # (mmap, free pipe, gate pipe or None) in the worker.
    self._passes_open = 0  # Passes the consumer has opened, as this worker has read so far.

  def __getstate__(self):
    return {**self.__dict__, '_opened': None, '_passes_open': 0}

  def _open(self, worker: int) -> tuple[mmap.mmap, int, int | None]:
    def descriptor(fd: int, mode: int) -> int:
      return os.open(f'/proc/{self._pid}/fd/{fd}', mode)

    try:
      memfd = descriptor(self._memfds[worker], os.O_RDWR)
      free = descriptor(self._free_pipes[worker], os.O_RDONLY)
      gate = descriptor(self._gate_pipes[worker], os.O_RDONLY) if self._gate_pipes else None
    except OSError as e:
      raise OSError(
          f"A data worker cannot open its batches' shared memory ({e}): set "
          '--config.data_workers=0 (threads)'
      ) from None
    shared = mmap.mmap(memfd, SLOTS * self._slot_bytes)
    os.close(memfd)
    return shared, free, gate

  def acquire(self, worker: int, pass_index: int = 0) -> tuple[int, dict[str, np.ndarray]]:
    """(a free slot of `worker`, its arrays): in a gated ring, first waits until the consumer has
    opened pass `pass_index`; then while all the worker's slots are being read."""
    if self._opened is None:
      self._opened = self._open(worker)
    shared, free, gate = self._opened
    while gate is not None and self._passes_open <= pass_index:
      self._passes_open += len(_read_or_end(gate))
    slot = _read_or_end(free)[0]
    return slot, _views(shared, self._fields, self._slot_bytes, slot)


def _read_or_end(pipe: int) -> bytes:
  token = os.read(pipe, 1)
  if not token:
    raise EOFError('the consuming process closed its batches')
  return token


def ring_or_none(spec: Spec, batch_size: int, workers: int, gated: bool = False) -> Ring | None:
  """The workers' ring; None (grain's own hand-over) without workers, off Linux, or where the
  system refuses anonymous shared memory (a sandbox's seccomp filter)."""
  if not workers or not SUPPORTED:
    return None
  try:
    return Ring(spec, batch_size, workers, gated)
  except OSError as e:
    logging.warning("Data workers hand batches over through grain's shared memory: %s", e)
    return None
