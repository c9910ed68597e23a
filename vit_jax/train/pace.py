"""The run's pace in its log and metrics: steps per second, ETA, and the share of time spent outside
the train steps (evaluations, checkpoints)."""

import collections
import contextlib
import time
from typing import Any, Iterator

import jax
from absl import logging

from vit_jax.train import event_writer, progress


class Pace:
  """Called after each step; at every `every_steps`-th step and the last, logs `Progress: ...` and
  writes the scalars `steps_per_sec` (since the previous report) and `uptime` (seconds).

  The first call only starts the clock, so that the first rate leaves out the compilation.
  """

  def __init__(self, total_steps: int, every_steps: int, writer: event_writer.MetricWriter):
    self._total_steps, self._every_steps, self._writer = total_steps, every_steps, writer
    self._start = time.monotonic()
    self._previous: tuple[int, float] | None = None
    self._seconds_in = collections.defaultdict(float)

  def __call__(self, step: int) -> None:
    now = time.monotonic()
    if self._previous is None:
      self._previous = step, now
      return
    if step % self._every_steps and step != self._total_steps:
      return
    previous_step, previous_time = self._previous
    steps_per_sec = (step - previous_step) / max(now - previous_time, 1e-9)
    self._previous = step, now
    uptime = now - self._start
    eta = (self._total_steps - step) / steps_per_sec
    message = (
        f'{steps_per_sec:.1f} steps/s, {100 * step / self._total_steps:.1f}% '
        f'({step}/{self._total_steps}), ETA {progress.duration(eta)}'
    )
    if self._seconds_in:
      message += ' ({} so far: {})'.format(
          progress.duration(uptime),
          ', '.join(
              f'{100 * seconds / uptime:.1f}% {name}'
              for name, seconds in sorted(self._seconds_in.items())
          ),
      )
    logging.info('Progress: %s', message)
    self._writer.write_scalars(step, {'steps_per_sec': steps_per_sec, 'uptime': uptime})

  @contextlib.contextmanager
  def timed(self, name: str, after: Any) -> Iterator[None]:
    """Counts the block's time as `name`'s. The clock starts once `after` (the state the block reads)
    is computed, so that the train steps still in flight are not counted."""
    jax.block_until_ready(after)
    start = time.monotonic()
    yield
    self._seconds_in[name] += time.monotonic() - start
