"""The run's pace in its log and metrics: steps per second, ETA, the share of time spent outside
the train steps (evaluations, checkpoints), and the share the loop waited for the input pipeline."""

import collections
import contextlib
import time
from typing import Any, Iterator

import jax
from absl import logging

from vit_jax.train import event_writer, progress

# The share of a report's time the loop waited for batches above which the log says so, and above
# which it warns (once a run, on accelerators) that the input pipeline holds the steps back. On CPU
# the pipeline and the steps share the cores: more workers would take them from the steps.
_SHOWN_INPUT_WAIT = 0.05
_WARNED_INPUT_WAIT = 0.25


def on_accelerator() -> bool:
  """Whether the steps run on accelerators, not on the cores that also run the input pipeline."""
  return jax.default_backend() != 'cpu'


class Pace:
  """Called after each step; at every `every_steps`-th step and the last, logs `Progress: ...` and
  writes the scalars `steps_per_sec` (since the previous report), `uptime` (seconds) and
  `input_wait` (the share of the time since the previous report that the loop waited for batches,
  `waiting_for_input`: with steps dispatched ahead, ~0 unless the input pipeline is slower).

  The first call only starts the clock, so that the first rate leaves out the compilation.
  """

  def __init__(self, total_steps: int, every_steps: int, writer: event_writer.MetricWriter):
    self._total_steps, self._every_steps, self._writer = total_steps, every_steps, writer
    self._start = time.monotonic()
    self._previous: tuple[int, float] | None = None
    self._seconds_in = collections.defaultdict(float)
    self._waited = 0.0  # Seconds waiting for input since the previous report.
    self._warned = False

  def __call__(self, step: int) -> None:
    now = time.monotonic()
    if self._previous is None:
      self._previous = step, now
      return
    if step % self._every_steps and step != self._total_steps:
      return
    previous_step, previous_time = self._previous
    steps_per_sec = (step - previous_step) / max(now - previous_time, 1e-9)
    input_wait = min(self._waited / max(now - previous_time, 1e-9), 1.0)
    self._previous, self._waited = (step, now), 0.0
    uptime = now - self._start
    eta = (self._total_steps - step) / steps_per_sec
    message = (
        f'{steps_per_sec:.1f} steps/s, {100 * step / self._total_steps:.1f}% '
        f'({step}/{self._total_steps}), ETA {progress.duration(eta)}'
    )
    if input_wait >= _SHOWN_INPUT_WAIT:
      message += f', {100 * input_wait:.0f}% of it waiting for input'
    if self._seconds_in:
      message += ' ({} so far: {})'.format(
          progress.duration(uptime),
          ', '.join(
              f'{100 * seconds / uptime:.1f}% {name}'
              for name, seconds in sorted(self._seconds_in.items())
          ),
      )
    logging.info('Progress: %s', message)
    if input_wait >= _WARNED_INPUT_WAIT and not self._warned and on_accelerator():
      self._warned = True
      logging.warning(
          'The train steps waited for input %.0f%% of the time of steps %d-%d: the input pipeline '
          'is slower than the model; docs/speed.md says what speeds it up (more '
          'config.data_workers, pp.reducing_gap for large JPEGs, the data on a local disk)',
          100 * input_wait,
          previous_step + 1,
          step,
      )
    self._writer.write_scalars(
        step, {'steps_per_sec': steps_per_sec, 'uptime': uptime, 'input_wait': input_wait}
    )

  @contextlib.contextmanager
  def timed(self, name: str, after: Any) -> Iterator[None]:
    """Counts the block's time as `name`'s. The clock starts once `after` (the state the block reads)
    is computed, so that the train steps still in flight are not counted."""
    jax.block_until_ready(after)
    start = time.monotonic()
    yield
    self._seconds_in[name] += time.monotonic() - start

  @contextlib.contextmanager
  def waiting_for_input(self) -> Iterator[None]:
    """Counts the block's time (taking the next batch) as waiting for input, once the clock runs."""
    start = time.monotonic()
    yield
    if self._previous is not None:
      self._waited += time.monotonic() - start
