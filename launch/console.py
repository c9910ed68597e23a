"""A local multi-process run's output on the launcher's console, as one run's.

Process 0 speaks for the run: its output passes as it comes (its stderr through a pseudo-terminal
where the launcher's is one, so that its progress bar shows). Every process of a local run reads
the same config and data, so each reports the same config warnings and errors: another process's
line is held for `HOLD_S` and printed, marked `[process k]`, only if process 0 has not printed the
same message. gloo's connection lines (`[Gloo] Rank 0 is connected to 1 peer ranks...`, one a
process) are dropped.
"""

import os
import re
import subprocess
import sys
import threading
import time
from typing import TextIO

# How long another process's line waits for process 0's of the same message.
HOLD_S = 3.0
_GLOO = '[Gloo] '
# absl's prefix: level, date, time, thread; the message key keeps the source line and the text.
_ABSL = re.compile(r'^[DIWEF]\d{4} [\d:.]+ +\d+ (\S+\] .*)$')
_ESCAPES = re.compile(r'\x1b\[[0-9;]*[A-Za-z]')


def message(line: str) -> str:
  """What a line says, without what differs between processes: absl's time and thread, the
  terminal's carriage returns and escape codes."""
  line = _ESCAPES.sub('', line.rstrip('\r\n').rsplit('\r', 1)[-1])
  match = _ABSL.match(line)
  return match.group(1) if match else line


class Console:
  """Collects the processes' output: `popen(k, ...)` starts process k with its output read here,
  `flush()` prints the held lines that are due and `close()`, once the processes have ended, the
  rest."""

  def __init__(self):
    self._lock = threading.Lock()
    self._said: dict[str, float] = {}  # Process 0's messages, by when it printed them.
    self._held: list[tuple[float, int, TextIO, str]] = []  # (due, process, stream, line)
    self._readers: list[threading.Thread] = []

  def popen(self, index: int, args: list[str], **kwargs) -> subprocess.Popen:
    """Starts process `index` (`subprocess.Popen(args, **kwargs)`), its stdout and stderr read here."""
    ends = []  # (the launcher's end, the process's end, where its lines go)
    for target in (sys.stdout, sys.stderr):
      if index == 0 and target is sys.stderr and _isatty(sys.stderr):
        import pty  # pylint: disable=g-import-not-at-top

        ends.append((*pty.openpty(), target))
      else:
        ends.append((*os.pipe(), target))
    try:
      process = subprocess.Popen(args, stdout=ends[0][1], stderr=ends[1][1], **kwargs)
    finally:
      for _, child, _ in ends:
        os.close(child)
    for parent, _, target in ends:
      reader = threading.Thread(target=self._read, args=(index, parent, target), daemon=True)
      reader.start()
      self._readers.append(reader)
    return process

  def _read(self, index: int, fd: int, target) -> None:
    # `shown`: the bytes of process 0's unfinished line already written. A line often comes in two
    # writes (print's text, then its newline): its message is the whole line's, once it ends.
    pending, shown = b'', 0
    while True:
      try:
        chunk = os.read(fd, 65536)
      except OSError:  # A pseudo-terminal whose process has ended.
        chunk = b''
      if not chunk:
        break
      pending += chunk
      *lines, pending = pending.split(b'\n')
      for line in lines:
        self._line(index, target, line + b'\n', shown)
        shown = 0
      # Process 0's bar redraws its line without ending it: that passes at once.
      if (
          index == 0
          and len(pending) > shown
          and not _GLOO.encode().startswith(pending[: len(_GLOO)])
      ):
        with self._lock:
          _write(target, pending[shown:].decode(errors='replace'))
        shown = len(pending)
    if pending:
      self._line(index, target, pending, shown)
    os.close(fd)

  def _line(self, index: int, target, line: bytes, shown: int) -> None:
    """A whole line of process `index`, of which the first `shown` bytes are written already."""
    text = line.decode(errors='replace')
    if message(text).startswith(_GLOO):
      return
    now = time.monotonic()
    with self._lock:
      if index == 0:
        self._said[message(text)] = now
        _write(target, line[shown:].decode(errors='replace'))
      else:
        self._held.append((now + HOLD_S, index, target, text))

  def flush(self, everything: bool = False) -> None:
    """Prints the held lines that are due (all of them with `everything`) unless process 0 said the
    same."""
    now = time.monotonic()
    with self._lock:
      due = [held for held in self._held if everything or held[0] <= now]
      self._held = [held for held in self._held if not (everything or held[0] <= now)]
      for _, index, target, line in due:
        if message(line) not in self._said:
          _write(target, f'[process {index}] {line}')
      # Process 0's messages are kept as long as another's same line may still be held.
      self._said = {text: t for text, t in self._said.items() if t > now - 2 * HOLD_S or everything}

  def close(self, timeout: float = 30) -> None:
    """After the processes have ended: reads what they left in the pipes and prints the rest."""
    for reader in self._readers:
      reader.join(timeout)
    self.flush(everything=True)


def _write(target: TextIO, text: str) -> None:
  target.write(text)
  target.flush()


def _isatty(stream) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False
