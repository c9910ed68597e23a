"""Config files that import their siblings (`from configs import demo`) from any working directory.

ml_collections loads `--config=FILE` by its path, but the imports inside it are resolved on `sys.path`,
where only the current directory stands for the repository: `configs/demo_finetune.py` loaded from
elsewhere failed with "No module named 'configs'". So, as pytest does for a test file, the directory
above the file's outermost package (the last parent holding an `__init__.py`) goes on `sys.path`.
"""
import os
import sys
from typing import Optional, Sequence

from absl import flags

from vit_jax import cli


def config_path(argv: Sequence[str], flag: str = 'config') -> Optional[str]:
  """The file of `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`, None if not given."""
  for i, arg in enumerate(argv):
    for prefix in (f'--{flag}', f'-{flag}'):
      if arg.startswith(prefix + '='):
        return arg[len(prefix) + 1:].split(':', 1)[0]
      if arg == prefix and i + 1 < len(argv):
        return argv[i + 1].split(':', 1)[0]
  return None


def import_root(path: str) -> str:
  """The directory from which `path`'s package imports resolve: above its outermost package."""
  directory = os.path.dirname(os.path.abspath(path))
  while os.path.isfile(os.path.join(directory, '__init__.py')):
    directory = os.path.dirname(directory)
  return directory


def make_importable(argv: Sequence[str], flag: str = 'config') -> None:
  """Puts the import root of the `--config` file in `argv` first on `sys.path`, as Python puts a script's
  directory; does nothing without one, or for a file that does not exist (the flag reports that)."""
  path = config_path(argv, flag)
  if path is None or not os.path.isfile(path):
    return
  # First: run from another checkout, the file's siblings are its own `configs`, not the directory's.
  sys.path.insert(0, import_root(path))


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing for a command with a config_flags `--config`: a bad override or a config file
  that cannot be loaded is one `error:` line, not a traceback."""
  make_importable(argv)  # The config file's `from configs import ...`, from any directory.
  try:
    argv = flags.FLAGS(argv)
  except flags.Error as e:
    lines = str(e).strip().splitlines()
    # A config file's own error (e.g. configs/vtab.py:TASK's unknown task) ends the traceback that
    # ml_collections puts in the message: its last line, without the exception's type, is the fix.
    cli.fail(lines[-1].split(': ', 1)[-1] if 'Traceback' in str(e) else lines[0])
  except (AttributeError, KeyError) as e:
    # ml_collections words it as "'name'\nDid you mean ...", and KeyError quotes that once more.
    detail = str(e.args[0]).replace('\\n', ' ').replace("\\'", '').replace("'", '').strip('"')
    overrides = [a for a in argv if a.startswith('--config.')]
    cli.fail(f'bad config override: the config has no field {detail} (overrides given: '
             f'{" ".join(overrides)}); fix the name or add the field to the config file')
  except (TypeError, ValueError) as e:
    cli.fail(f'bad config override: {e}')
  try:
    # config_flags keeps a file it could not load as an object that raises on first use, a traceback
    # of many lines: ask now, and say its last line (e.g. "[Errno 2] No such file or directory: ...").
    flags.FLAGS.config.get('variant')
  except OSError as e:
    cli.fail(f'cannot load the --config file: {str(e).strip().splitlines()[-1].strip()}')
  return argv
