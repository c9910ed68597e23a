"""The processes of a multi-host run (jax.distributed: a pod's hosts, a cluster's nodes) dividing
work done before any step, such as indexing a dataset's files, and each getting every result.

Every process must make the same calls in the same order (they are collectives); a process without
jax.distributed is the only one, and nothing is exchanged.
"""

from typing import Callable

import jax
from jax.experimental import multihost_utils
import numpy as np

_OK, _FAILED = b'\x00', b'\x01'  # The first byte of what a process sends.


def count() -> int:
  return jax.process_count() if jax.distributed.is_initialized() else 1


def index() -> int:
  return jax.process_index() if jax.distributed.is_initialized() else 0


def any_of(flag: bool) -> bool:
  """Whether `flag` is true on any process."""
  if count() == 1:
    return flag
  return bool(np.any(multihost_utils.process_allgather(np.array(flag))))


def share(n: int) -> range:
  """This process's share of n items: a contiguous range, the shares in process order."""
  return range(index() * n // count(), (index() + 1) * n // count())


def gathered(work: Callable[[], bytes]) -> list[bytes]:
  """Every process's `work()`, in process order. Where it raises on one process, that process
  raises it and every other one a ValueError that names it: none waits for a result that will not
  come."""
  if count() == 1:
    return [work()]
  try:
    sent, failure = _OK + work(), None
  except Exception as e:  # pylint: disable=broad-exception-caught
    sent, failure = _FAILED + (str(e) or type(e).__name__).encode(), e
  sizes = multihost_utils.process_allgather(np.array(len(sent), np.int32))
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[: len(sent)] = np.frombuffer(sent, np.uint8)
  rows = multihost_utils.process_allgather(padded)
  received = [rows[i, : sizes[i]].tobytes() for i in range(count())]
  if failure is not None:
    raise failure
  for i, piece in enumerate(received):
    if piece[:1] == _FAILED:
      raise ValueError(f'{piece[1:].decode()} (on process {i} of the run)')
  return [piece[1:] for piece in received]
