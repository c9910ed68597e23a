"""vit_jax/checkpoints/orbax_noise.py: what a failed checkpoint read leaves behind stays off the output."""

import logging

from vit_jax.checkpoints import orbax_noise

_UNRETRIEVED = (
    'Task exception was never retrieved\nfuture: <Task finished coro=<_wrap_awaitable()> '
    "exception=ValueError('OUT_OF_RANGE: Error reading local file: Requested byte range "
    "[0, 13131) is not valid for value of size 6565 [tensorstore_spec=...]')>"
)


def test_asyncios_unretrieved_read_errors_go_to_debug_and_nothing_else_does(caplog):
  orbax_noise.quiet_failed_reads()
  orbax_noise.quiet_failed_reads()  # Once is enough: no second filter.
  asyncio_logger = logging.getLogger('asyncio')
  assert (
      sum(isinstance(f, orbax_noise.UnretrievedReadErrorsAtDebug) for f in asyncio_logger.filters)
      == 1
  )
  caplog.set_level(logging.DEBUG)
  asyncio_logger.error(_UNRETRIEVED)
  asyncio_logger.error('Task exception was never retrieved\nfuture: <Task exception=KeyError()>')
  assert [(r.name, r.levelname) for r in caplog.records] == [
      ('absl', 'DEBUG'),
      ('asyncio', 'ERROR'),
  ]  # Another task's error is still an error.
  assert caplog.records[0].getMessage() == _UNRETRIEVED
