"""Config files that import their siblings (`from configs import demo`) from any working directory.

ml_collections loads `--config=FILE` by its path, but the imports inside it are resolved on `sys.path`,
where only the current directory stands for the repository: `configs/demo_finetune.py` loaded from
elsewhere failed with "No module named 'configs'". So, as pytest does for a test file, the directory
above the file's outermost package (the last parent holding an `__init__.py`) goes on `sys.path`.
"""

import difflib
import functools
import os
import re
import sys
import traceback
from typing import Callable, Optional, Sequence

import ml_collections
from absl import flags

from vit_jax import defaults
from vit_jax.runtime import cli

_OVERRIDE = re.compile(r'^--?(?:no)?config\.([^=]+)(?:=(.*))?$')
# Fields of which a run takes exactly one (train/setup.py checks it too, without the command line).
_ONE_OF = ('total_steps', 'num_epochs')


def config_arg(argv: Sequence[str], flag: str = 'config') -> Optional[str]:
  """The value of `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`, None if not given."""
  for i, arg in enumerate(argv):
    for prefix in (f'--{flag}', f'-{flag}'):
      if arg.startswith(prefix + '='):
        return arg[len(prefix) + 1 :]
      if arg == prefix and i + 1 < len(argv):
        return argv[i + 1]
  return None


def config_path(argv: Sequence[str], flag: str = 'config') -> Optional[str]:
  """The file of `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`, None if not given."""
  arg = config_arg(argv, flag)
  return None if arg is None else arg.split(':', 1)[0]


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


def flags_parser(usage: str) -> Callable[[list[str]], list[str]]:
  """absl's flag parsing for a command with a config_flags `--config`: a bad override or a config file
  that cannot be loaded is one `error:` line, not a traceback (a missing or bad flag names the
  `usage`); `--config.FIELD=None` unsets a field that may be unset; `--help` exits with status 0."""
  return functools.partial(_parse_flags, usage=usage)


def _parse_flags(argv: list[str], usage: str) -> list[str]:
  make_importable(argv)  # The config file's `from configs import ...`, from any directory.
  given = list(argv)  # absl returns the arguments that are not flags.
  overrides = _overrides(argv)
  # config_flags would parse 'None' as the field's type ("could not convert string to float"): those
  # flags are left out here and applied below, when the last value given for the field is None.
  unset = [field for field, value in overrides.items() if value == 'None']
  try:
    argv = flags.FLAGS([arg for arg in argv if not _is_unset(arg)])
  except SystemExit as exit_:
    cli.help_exits_0(exit_, given)
    raise
  except Exception as e:  # pylint: disable=broad-except
    message = _parse_error(e, given, overrides, usage)
    if message is None:
      raise
    cli.fail(message)
  try:
    # config_flags keeps a file it could not load as an object that raises on first use, a traceback
    # of many lines: ask now, and say its last line (e.g. "[Errno 2] No such file or directory: ...").
    flags.FLAGS.config.get('variant')
  except OSError as e:
    cli.fail(_cannot_load(e))
  for field in unset:
    _unset(flags.FLAGS.config, field)
  _check_one_of(flags.FLAGS.config, config_path(given), overrides)
  return argv


def _cannot_load(error: OSError) -> str:
  """The line for a --config file that cannot be read: the last of config_flags' message (e.g.
  "[Errno 2] No such file or directory: ...")."""
  return f'cannot load the --config file: {str(error).strip().splitlines()[-1].strip()}'


def _overrides(argv: Sequence[str]) -> dict[str, Optional[str]]:
  """field -> the last value given for it by `--config.FIELD=VALUE` (None for `--config.FIELD`)."""
  found = {}
  for arg in argv:
    match = _OVERRIDE.match(arg)
    if match:
      found.pop(match[1], None)  # Ordered as the last of each, as config_flags applies them.
      found[match[1]] = match[2]
  return found


def _is_unset(arg: str) -> bool:
  match = _OVERRIDE.match(arg)
  return bool(match) and match[2] == 'None' and not arg.lstrip('-').startswith('no')


def _parse_error(
    error: Exception, argv: Sequence[str], overrides: dict[str, Optional[str]], usage: str
) -> Optional[str]:
  """The one line that says what went wrong in parsing the flags, None for an unexpected error."""
  path = config_path(argv)
  located = _config_file_error(error, path)
  if located is not None:
    return located
  unloadable = _unloadable_config_file(error, path)
  if unloadable is not None:
    return unloadable
  missing = next((cause for cause in _causes(error) if isinstance(cause, OSError)), None)
  if missing is not None:  # The file read to apply an override to it (none read without one).
    return _cannot_load(missing)
  if isinstance(error, (AttributeError, KeyError)):
    return _unknown_field(argv, overrides)
  if isinstance(error, flags.Error):
    if 'Traceback' in str(error):  # Its last line, without the exception's type, is the fix.
      return str(error).strip().splitlines()[-1].split(': ', 1)[-1]
    return f'{cli.flag_error(error)}: use {usage}'
  if isinstance(error, (TypeError, ValueError)):
    return f'bad config override: {error}'
  return None


def _config_file_error(error: BaseException, path: Optional[str]) -> Optional[str]:
  """'FILE:LINE: ...' for an error raised in loading the config file `path` (a syntax error, or what
  its code raised, at its line that raised or called what raised), None for another error.

  config_flags re-raises a ValueError or TypeError of get_config wrapped in another with the traceback
  as text, and absl wraps that once more: the config file's frames are in the chain of causes.
  """
  if path is None:
    return None
  target = os.path.abspath(path)
  shown = lambda name: path if os.path.abspath(name) == target else os.path.relpath(name)
  for error in _causes(error):  # Outermost first: what the file raised last.
    if isinstance(error, SyntaxError) and error.filename and os.path.isfile(error.filename):
      return f'{shown(error.filename)}:{error.lineno}: {type(error).__name__}: {error.msg}'
    frames = [
        f
        for f in traceback.extract_tb(error.__traceback__)
        if os.path.abspath(f.filename) == target
    ]
    if frames:
      # ml_collections' AttributeError quotes its KeyError's "'name'" once more.
      text = str(error).strip().strip('"')
      detail = f'{type(error).__name__}: {text.splitlines()[0]}' if text else type(error).__name__
      raised = 'get_config raised ' if any(f.name == 'get_config' for f in frames) else ''
      return f'{path}:{frames[-1].lineno}: {raised}{detail}'
  return None


def _causes(error: Optional[BaseException]) -> list[BaseException]:
  """`error` and the chain of exceptions it was raised from or while handling, outermost first."""
  causes = []
  while error is not None and all(error is not seen for seen in causes):
    causes.append(error)
    error = error.__cause__ or error.__context__
  return causes


def _unloadable_config_file(error: BaseException, path: Optional[str]) -> Optional[str]:
  """The one line for a --config file that is no config: not Python (a checkpoint given as
  --config), without get_config (a sweep file), or whose get_config takes no `:ARG`; else None."""
  for cause in _causes(error):
    text = str(cause)
    if isinstance(cause, SyntaxError) and 'null bytes' in text:
      return (
          f'cannot load the --config file {path}: it is not a Python config file (a file such as '
          'configs/demo.py); a checkpoint to start from is --config.init_from=FILE'
      )
    if isinstance(cause, AttributeError) and "has no attribute 'get_config'" in text:
      sweep = (
          f' (a sweep: run it with python launch/sweep.py --sweep={path} --workdir=ROOT)'
          if _defines(path, 'get_sweep')
          else ''
      )
      return f'--config file {path} has no get_config(){sweep}: pass a config file'
    if isinstance(cause, TypeError) and text.startswith('get_config() takes'):
      return f'--config={path}:ARG: its get_config() takes no argument ({text}): drop the :ARG'
  return None


def _defines(path: Optional[str], name: str) -> bool:
  try:
    with open(path, encoding='utf-8') as f:
      return f'def {name}(' in f.read()
  except (OSError, TypeError, UnicodeDecodeError):
    return False


def _unknown_field(argv: Sequence[str], overrides: dict[str, Optional[str]]) -> str:
  """The override that names no field of the config, with the field it likely meant."""
  given = lambda field, value: f'--config.{field}' + ('' if value is None else f'={value}')
  try:
    # config_flags raised before it kept the config: load the file again to look the names up.
    config = flags.FLAGS['config'].parser.parse(config_arg(argv))
  except Exception:  # pylint: disable=broad-except
    config = None
  for field, value in overrides.items():
    node, parts = config, field.split('.')
    for i, part in enumerate(parts):
      if not isinstance(node, ml_collections.ConfigDict):
        break
      if part not in node:
        bad = f'bad config override {given(field, value)}: the config has no field {field}'
        close = difflib.get_close_matches(part, list(node.keys()), n=1)
        if close:
          meant = '.'.join(parts[:i] + close + parts[i + 1 :])
          return f'{bad}. Did you mean "{meant}" ({given(meant, value)})?'
        parent = '.'.join(parts[:i])
        if parent and len(node) <= 20:
          return f'{bad}: config.{parent} has the fields {", ".join(node.keys())}'
        return f'{bad}: vit_jax/defaults.py lists the fields'
      node = node[part]
  return (
      f'bad config override: the config has no field of '
      f'{" ".join(given(f, v) for f, v in overrides.items())}; vit_jax/defaults.py lists the fields'
  )


def _unset(config: ml_collections.ConfigDict, field: str) -> None:
  """`--config.FIELD=None`: sets the field to None if it may be None (its default is, or its value)."""
  *parents, name = field.split('.')
  node, default = config, defaults.get_config()
  for parent in parents:
    node = node[parent]
    default = default.get(parent) if isinstance(default, ml_collections.ConfigDict) else None
  optional = node[name] is None or (
      isinstance(default, ml_collections.ConfigDict) and name in default and default[name] is None
  )
  if not optional:
    cli.fail(
        f'--config.{field}=None: config.{field} cannot be unset, only a field whose default is '
        f'unset (vit_jax/defaults.py) can: give it a value, e.g. --config.{field}={node[name]!r}'
    )
  node[name] = None


def _check_one_of(
    config: ml_collections.ConfigDict, path: Optional[str], overrides: dict[str, Optional[str]]
) -> None:
  """One of `_ONE_OF` given on the command line while the config file sets the other: the file's is
  in the way of the flag just given, so say how to clear it."""
  if not all(name in config for name in _ONE_OF) or any(config[name] is None for name in _ONE_OF):
    return
  given = [name for name in _ONE_OF if name in overrides]
  if len(given) != 1:  # Both from the file, or both given: train/setup.py says to set one.
    return
  other = next(name for name in _ONE_OF if name != given[0])
  cli.fail(
      f'--config.{given[0]}={config[given[0]]} is given, but {path} sets '
      f'config.{other}={config[other]}, and a run takes exactly one of them: add '
      f"--config.{other}=None to clear the file's"
  )
