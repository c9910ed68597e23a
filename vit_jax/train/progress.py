"""A progress bar on the last line of an interactive terminal, with the log lines printed above it.

Only process 0 draws it, and only when stderr is a terminal: a pipe, a file, a SLURM or CI log gets
the plain log lines and nothing else. While the bar is up, stderr (and the absl log handler's stream)
is a `_Above`: whatever is written there first erases the bar, and once its line is complete the bar
is drawn again below it, so a log line (also one from the metric writer's thread) never lands inside
the bar.

The bar only reads the host: the step counter of the loop and metrics the loop has already fetched.
It never waits on a device value, so it does not slow the steps down.
"""

import collections
import os
import sys
import threading
import time
from typing import Callable, Mapping, TextIO

from absl import logging

# Back to the start of the line, then erase it: the bar is always redrawn in place.
CLEAR = '\r\x1b[2K'
MIN_REDRAW_S = 0.1  # At most ~10 redraws a second: drawing is cheap, a flickering terminal is not.
_RATE_WINDOW_S = 10.0  # Speed and ETA from the last seconds of steps, not from the compile.
_BAR_WIDTH = 24
# The metrics the bar shows, when the loop has them, and how.
_SHOWN = {'train_loss': 'loss {:.4f}', 'eval_top1': 'eval top-1 {:.2%}'}


class Bar:
  """No bar: what a run without a terminal, and every process but 0, gets. Each method does
  nothing; `TerminalBar` draws."""

  def advance(self, step: int) -> None:
    """Step `step` has been dispatched (a host-side count: nothing waits on the device)."""

  def show(self, metrics: Mapping[str, float]) -> None:
    """Host values (already fetched by the loop) of the metrics the bar shows, when among them."""

  def close(self) -> None:
    """Leaves the final bar on its own line and gives stderr back."""


def for_run(total_steps: int, start_step: int, batch_size: int, process_index: int) -> Bar:
  """A `TerminalBar` on stderr for process 0 of an interactive run; a `Bar` (no bar) otherwise."""
  stream = sys.stderr
  if process_index != 0 or not stream.isatty() or os.environ.get('TERM') == 'dumb':
    return Bar()
  return TerminalBar(total_steps, start_step, batch_size, stream)


def duration(seconds: float) -> str:
  """`m:ss`, or `h:mm:ss` from an hour: the bar's ETA and the log's (pace.py)."""
  minutes, seconds = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return f'{hours}:{minutes:02d}:{seconds:02d}' if hours else f'{minutes}:{seconds:02d}'


class TerminalBar(Bar):
  """`step 8/12 [################--------] 67% | 2,720 img/s | ETA 0:01 | loss 2.2976 |
  eval top-1 16.11%` on the last line of `stream`, a terminal.

  It takes over sys.stderr and the absl handler's stream (when that is `stream`) until `close`.
  """

  def __init__(
      self,
      total_steps: int,
      start_step: int,
      batch_size: int,
      stream: TextIO,
      *,
      clock: Callable[[], float] = time.monotonic,
  ):
    self._total, self._step, self._batch_size = total_steps, start_step, batch_size
    self._stream, self._clock = stream, clock
    self._metrics: dict[str, float] = {}
    # (time, step) of recent steps. The first point is the first step's end, so the compile it waits
    # for is never part of the speed.
    self._points: collections.deque[tuple[float, int]] = collections.deque()
    # Log lines come from the loop's thread and from the metric writer's thread.
    self._lock = threading.RLock()
    self._drawn = False  # The bar is on the last line, and the cursor after it.
    self._mid_line = False  # A write left the cursor after text: the bar waits for the newline.
    self._last_draw = -float('inf')
    self._closed = False
    self._above = _Above(self, stream)
    self._handler = logging.get_absl_handler().python_handler
    self._handler_stream = self._handler.stream
    self._stderr = sys.stderr
    sys.stderr = self._above
    if self._handler_stream is stream:
      self._handler.setStream(self._above)
    self._draw()  # Up while the first step compiles.

  def advance(self, step: int) -> None:
    with self._lock:
      now = self._clock()
      self._step = step
      self._points.append((now, step))
      while len(self._points) > 2 and now - self._points[0][0] > _RATE_WINDOW_S:
        self._points.popleft()
      if now - self._last_draw >= MIN_REDRAW_S:
        self._draw()

  def show(self, metrics: Mapping[str, float]) -> None:
    with self._lock:
      self._metrics.update({k: float(v) for k, v in metrics.items() if k in _SHOWN})

  def close(self) -> None:
    with self._lock:
      if self._closed:
        return
      if sys.stderr is self._above:
        sys.stderr = self._stderr
      if self._handler.stream is self._above:
        self._handler.setStream(self._handler_stream)
      if not self._mid_line:
        self._draw()
        self._stream.write('\n')  # The last bar stays, above what the run prints next.
        self._stream.flush()
        self._drawn = False
      self._closed = True

  def text(self, width: int) -> str:
    """The bar's line, at most `width` characters."""
    fields = []
    steps_per_s = None
    if len(self._points) >= 2:
      (t0, s0), (t1, s1) = self._points[0], self._points[-1]
      if t1 > t0:
        steps_per_s = (s1 - s0) / (t1 - t0)
    if steps_per_s is not None:
      fields.append(f'{steps_per_s * self._batch_size:,.0f} img/s')
    remaining = self._total - self._step
    if remaining <= 0:
      fields.append('ETA 0:00')
    elif steps_per_s:
      fields.append(f'ETA {duration(remaining / steps_per_s)}')
    else:
      fields.append('ETA --')
    fields += [_SHOWN[k].format(self._metrics[k]) for k in _SHOWN if k in self._metrics]
    done = min(max(self._step / max(self._total, 1), 0.0), 1.0)
    head = f'step {self._step}/{self._total}'
    tail = f' {done:4.0%} | ' + ' | '.join(fields)
    bar_width = min(_BAR_WIDTH, width - len(head) - len(tail) - 3)
    if bar_width >= 8:  # Too narrow a bar says nothing: the numbers come first.
      filled = int(done * bar_width)
      head += f' [{"#" * filled}{"-" * (bar_width - filled)}]'
    return (head + tail)[:width]

  def write_above(self, text: str) -> int:
    """Writes `text` to the terminal above the bar: what `_Above` (stderr) does."""
    with self._lock:
      if self._drawn:
        self._stream.write(CLEAR)
        self._drawn = False
      written = self._stream.write(text)
      if text:
        self._mid_line = not text.endswith('\n')
      if not self._mid_line and not self._closed:
        self._draw()
      return written

  def _draw(self) -> None:
    if self._mid_line:
      return
    self._stream.write(CLEAR + self.text(self._width() - 1))  # The last column would wrap the line.
    self._stream.flush()
    self._drawn = True
    self._last_draw = self._clock()

  def _width(self) -> int:
    try:
      width = os.get_terminal_size(self._stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
      width = 0
    return width if width > 0 else 80  # A pseudo-terminal nobody sized reports 0.


class _Above:
  """stderr while a `TerminalBar` is up: text goes above the bar (see `TerminalBar.write_above`);
  everything else (fileno, isatty, encoding...) is the terminal's."""

  def __init__(self, bar: TerminalBar, stream: TextIO):
    self._bar, self._stream = bar, stream

  def write(self, text: str) -> int:
    return self._bar.write_above(text)

  def flush(self) -> None:
    self._stream.flush()

  def __getattr__(self, name: str):
    return getattr(self._stream, name)
