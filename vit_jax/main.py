"""Entry point: `python -m vit_jax.main --config=configs/X.py[:arg] --workdir=DIR [--config.field=value]`."""
import logging as python_logging
import os
import sys

# Before TensorFlow loads: its C++ start-up banners are noise for a training run. (TensorFlow only
# runs the input pipeline, where oneDNN's kernels make no difference.)
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')

from absl import app, flags, logging  # pylint: disable=g-import-not-at-top
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Experiment config file, optionally with an argument: configs/X.py:arg.',
    lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and exports.')
flags.mark_flags_as_required(['config', 'workdir'])


def _fail(message: str) -> None:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def parse_flags(argv: list[str]) -> list[str]:
  """absl flag parsing, with bad config overrides reported in one line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    _fail(str(e).splitlines()[0])
  except (AttributeError, KeyError) as e:
    # ml_collections words it as "'name'\nDid you mean ...", and KeyError quotes that once more.
    detail = str(e.args[0]).replace('\\n', ' ').replace("\\'", '').replace("'", '').strip('"')
    overrides = [a for a in argv if a.startswith('--config.')]
    _fail(f'the config has no field {detail} (overrides given: {" ".join(overrides)}); '
          'fix the name or add the field to the config file')
  except (TypeError, ValueError) as e:
    _fail(f'bad config override: {e}')


class _OwnInfoOnly(python_logging.Filter):
  """INFO lines from vit_jax and clu (metrics, progress, ETA) only; libraries speak from WARNING up."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    if record.levelno >= python_logging.WARNING:
      return 'tensorflow_datasets' not in record.pathname or record.levelno >= python_logging.ERROR
    return any(f'{os.sep}{package}{os.sep}' in record.pathname for package in ('vit_jax', 'clu'))


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _fail(f'unexpected arguments {argv[1:]}: config fields are set as --config.FIELD=VALUE')
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
  # Imported here so that `--help` and flag errors answer before TensorFlow and JAX load.
  from vit_jax import train  # pylint: disable=g-import-not-at-top
  try:
    setup = train.prepare(_CONFIG.value, _WORKDIR.value)
  except ValueError as e:
    _fail(str(e))
  logging.info('Config:\n%s', setup.config)
  metrics = train.train_and_evaluate(setup)
  logging.info('Final eval: %s', ', '.join(f'{k}={v:.4f}' for k, v in sorted(metrics.items())))


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)
