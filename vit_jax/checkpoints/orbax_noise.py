"""What orbax and tensorstore print around a failed save or read, kept off a command's output: the
checkpoint module reports each failure in one line of its own."""

import logging as python_logging
import os
import sys
from typing import Any

from absl import logging


class TracebacksAtDebug(python_logging.Filter):
  """Orbax logs a failed save's error with its traceback three times over, from its threads, before
  the Saver reports it in one line: those records are logged at DEBUG instead (`--verbosity=1`)."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    if (
        record.levelno >= python_logging.ERROR
        and record.exc_info
        and record.exc_info[0]
        and f'{os.sep}orbax{os.sep}' in record.pathname
    ):
      logging.debug('%s', record.getMessage(), exc_info=record.exc_info)
      return False
    return True


class UnretrievedReadErrorsAtDebug(python_logging.Filter):
  """When one of orbax's concurrent tensorstore reads of a checkpoint fails, the others' failures
  are left in their asyncio tasks, and asyncio logs each, with its traceback, as "Task exception was
  never retrieved" when the task is collected (or not: it depends on the garbage collector's timing).
  The checkpoint module reports the read's failure in one line: those records go to DEBUG instead.
  """

  def filter(self, record: python_logging.LogRecord) -> bool:
    message = record.getMessage()
    if message.startswith('Task exception was never retrieved') and 'tensorstore' in message:
      logging.debug('%s', message, exc_info=record.exc_info)
      return False
    return True


def quiet_failed_reads() -> None:
  """What a failed orbax read leaves behind, kept off the output.

  Its tensorstore callbacks are bound for the asyncio loop it ran in, which is closed by then: each
  prints a harmless `RuntimeError: Event loop is closed` traceback through sys.unraisablehook, 100 to
  200 of them around one unreadable checkpoint; those alone are dropped. Its other reads' failures
  are logged by asyncio (`UnretrievedReadErrorsAtDebug`)."""
  asyncio_logger = python_logging.getLogger('asyncio')
  if not any(isinstance(f, UnretrievedReadErrorsAtDebug) for f in asyncio_logger.filters):
    asyncio_logger.addFilter(UnretrievedReadErrorsAtDebug())
  if getattr(sys.unraisablehook, 'drops_closed_event_loops', False):
    return
  previous = sys.unraisablehook

  def hook(unraisable: Any) -> None:
    error = unraisable.exc_value
    if not (isinstance(error, RuntimeError) and str(error) == 'Event loop is closed'):
      previous(unraisable)

  hook.drops_closed_event_loops = True
  sys.unraisablehook = hook
