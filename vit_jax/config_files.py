"""Config files that import their siblings (`from configs import demo`) from any working directory.

ml_collections loads `--config=FILE` by its path, but the imports inside it are resolved on `sys.path`,
where only the current directory stands for the repository: `configs/demo_finetune.py` loaded from
elsewhere failed with "No module named 'configs'". So, as pytest does for a test file, the directory
above the file's outermost package (the last parent holding an `__init__.py`) goes on `sys.path`.
"""
import os
import sys
from typing import Optional, Sequence


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
