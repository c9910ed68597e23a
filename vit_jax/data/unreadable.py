"""Naming the examples a source could not read, once each.

An unreadable file is named where it is met (pipeline.py replaces it in a train stream,
eval_pipeline.py pads it in an evaluation). Each is named once per process: an endless train stream
meets it again every epoch, and a log of the same names over and over hides everything else.
"""

import threading

from absl import logging

# The records named so far in this process, and the lock that makes naming one happen once.
_named: set[str] = set()
_named_lock = threading.Lock()


def name_once(name: str, reason: str) -> None:
  """A warning that `name` (a path) was skipped because of `reason`, the first time only."""
  with _named_lock:
    if name in _named:
      return
    _named.add(name)
  logging.warning('Skipping unreadable image file %s (%s)', name, reason)
