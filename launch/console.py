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
  """Collects the processes' output; `streams(k)` gives Popen's stdout and stderr of process k,
  `started(k)` starts reading them, `flush()` prints the held lines that are due and `close()`, once
  the processes have ended, the rest."""

  def __init__(self):
    self._lock = threading.Lock()
    self._said: dict[str, float] = {}  # Process 0's messages, by when it printed them.
    self._held: list[tuple[float, int, TextIO, str]] = []  # (due, process, stream, line)
    self._readers: list[threading.Thread] = []
    self._child_ends: dict[int, list[int]] = {}
    self._parent_ends: dict[int, list[tuple[int, TextIO]]] = {}

  def streams(self, index: int) -> tuple[int, int]:
    """File descriptors for process `index`'s stdout and stderr."""
    ends, children = [], []
    for target in (sys.stdout, sys.stderr):
      if index == 0 and target is sys.stderr and _isatty(sys.stderr):
        import pty  # pylint: disable=g-import-not-at-top
        parent, child = pty.openpty()
      else:
        parent, child = os.pipe()
      ends.append((parent, target))
      children.append(child)
    self._parent_ends[index], self._child_ends[index] = ends, children
    return children[0], children[1]

  def started(self, index: int) -> None:
    for child in self._child_ends.pop(index):
      os.close(child)
    for parent, target in self._parent_ends.pop(index):
      reader = threading.Thread(target=self._read, args=(index, parent, target), daemon=True)
      reader.start()
      self._readers.append(reader)

  def _read(self, index: int, fd: int, target) -> None:
    pending = b''
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
        self._line(index, target, line.decode(errors='replace') + '\n')
      # Process 0's bar redraws its line without ending it: that passes at once.
      if index == 0 and pending and not _GLOO.encode().startswith(pending[:len(_GLOO)]):
        self._write(target, pending.decode(errors='replace'))
        pending = b''
    if pending:
      self._line(index, target, pending.decode(errors='replace'))
    os.close(fd)

  def _line(self, index: int, target, line: str) -> None:
    text = message(line)
    if text.startswith(_GLOO):
      return
    now = time.monotonic()
    with self._lock:
      if index == 0:
        self._said[text] = now
        self._write(target, line)
      else:
        self._held.append((now + HOLD_S, index, target, line))

  def _write(self, target, text: str) -> None:
    target.write(text)
    target.flush()

  def flush(self, everything: bool = False) -> None:
    """Prints the held lines that are due (all of them with `everything`) unless process 0 said the
    same."""
    now = time.monotonic()
    with self._lock:
      due = [held for held in self._held if everything or held[0] <= now]
      self._held = [held for held in self._held if not (everything or held[0] <= now)]
      for _, index, target, line in due:
        if message(line) not in self._said:
          self._write(target, f'[process {index}] {line}')
      # Process 0's messages are kept as long as another's same line may still be held.
      self._said = {text: t for text, t in self._said.items() if t > now - 2 * HOLD_S or everything}

  def close(self, timeout: float = 30) -> None:
    """After the processes have ended: reads what they left in the pipes and prints the rest."""
    for reader in self._readers:
      reader.join(timeout)
    self.flush(everything=True)


def _isatty(stream) -> bool:
  try:
    return stream.isatty()
  except (AttributeError, ValueError):
    return False
