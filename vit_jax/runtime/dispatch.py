"""How far the host runs ahead of the devices."""

import collections
from typing import Any

import jax

# Enough to keep accelerators fed. Unbounded (until the next metrics fetch), a 2-process x 4-device
# CPU run over gloo deadlocked in about one run in five: a device's launch of step k+1 waited for room
# among that device's computations in flight (XLA:CPU allows 32), which waited on the step-k
# all-reduce, which waited for that device (the stacks are in issue 15).
AHEAD = 2


class BoundedDispatch:
  """`add(outputs)`, after dispatching the computation of `outputs`, waits for the outputs added
  AHEAD calls before: the host stays at most AHEAD computations ahead of the devices."""

  def __init__(self):
    self._pending = collections.deque()

  def add(self, outputs: Any) -> None:
    self._pending.append(outputs)
    if len(self._pending) > AHEAD:
      jax.block_until_ready(self._pending.popleft())
