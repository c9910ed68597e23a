"""Config files that import their siblings (`from configs import demo`) from any working directory.

ml_collections loads `--config=FILE` by its path, but the imports inside it are resolved on `sys.path`,
where only the current directory stands for the repository: `configs/demo_finetune.py` loaded from
elsewhere failed with "No module named 'configs'". So, as pytest does for a test file, the directory
above the file's outermost package (the last parent holding an `__init__.py`) goes on `sys.path`.

`flags_parser` parses a command's flags with them: a config file that cannot be loaded, or a bad
flag, is one `error:` line naming the fix; the overrides config_flags does not parse are
config_overrides.py's.
"""

import ast
import functools
import os
import re
import sys
import traceback
from typing import Callable, Optional, Sequence

from absl import flags

from vit_jax.runtime import cli, config_overrides


def _config_args(argv: Sequence[str], flag: str = 'config') -> list[str]:
  """The values of every `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`."""
  values = []
  for i, arg in enumerate(argv):
    for prefix in (f'--{flag}', f'-{flag}'):
      if arg.startswith(prefix + '='):
        values.append(arg[len(prefix) + 1 :])
      elif arg == prefix and i + 1 < len(argv):
        values.append(argv[i + 1])
  return values


def config_arg(argv: Sequence[str], flag: str = 'config') -> Optional[str]:
  """The value of `--config=FILE[:ARG]` (or `--config FILE[:ARG]`) in `argv`, None if not given."""
  return next(iter(_config_args(argv, flag)), None)


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
  `usage`), and so is an empty directory flag (cli.check_directory_flags); `--config.FIELD=None`
  unsets a field that may be unset; `--help` exits with status 0."""
  return functools.partial(_parse_flags, usage=usage)


def _parse_flags(argv: list[str], usage: str) -> list[str]:
  argv = config_overrides.with_values_joined(argv)
  files = _config_args(argv)
  if len(files) > 1:  # absl keeps the last, or with an override fails on its flags defined twice.
    cli.fail(f'--config is given {len(files)} times ({", ".join(files)}): pass one config file')
  make_importable(argv)  # The config file's `from configs import ...`, from any directory.
  given = list(argv)  # absl returns the arguments that are not flags.
  overrides = config_overrides.overrides(argv)
  # config_flags would parse 'None' as the field's type ("could not convert string to float"): those
  # flags are left out here and applied below, when the last value given for the field is None.
  unset = [field for field, value in overrides.items() if value == 'None']
  # An evaluator given whole (config.evals is a dict of them, and the file's config is locked): added
  # or replaced below, after the file's config is read.
  evaluators = {
      field: value
      for field, value in overrides.items()
      if config_overrides.evaluator_name(field) and value != 'None'
  }
  parsed = [
      arg
      for arg in argv
      if not config_overrides.is_unset(arg)
      and not config_overrides.evaluator_name(config_overrides.field_of(arg) or '')
  ]
  given_argv, sys.argv = sys.argv, parsed  # config_flags finds the override flags in sys.argv.
  try:
    argv = flags.FLAGS(parsed)
  except SystemExit as exit_:
    cli.help_exits_0(exit_, given)
    raise
  except Exception as e:  # pylint: disable=broad-except
    message = _parse_error(e, given, overrides, usage)
    if message is None:
      raise
    cli.fail(message)
  finally:
    sys.argv = given_argv
  try:
    # config_flags keeps a file it could not load as an object that raises on first use, a traceback
    # of many lines: ask now, and say its last line (e.g. "[Errno 2] No such file or directory: ...").
    flags.FLAGS.config.get('variant')
  except OSError as e:
    cli.fail(_cannot_load(e))
  cli.check_directory_flags()
  config_overrides.refuse_dicts(flags.FLAGS.config, overrides)
  config_overrides.split_bare_words(flags.FLAGS.config, overrides)
  for field, value in evaluators.items():
    config_overrides.set_evaluator(flags.FLAGS.config, field, value)
  for field in unset:
    config_overrides.unset(flags.FLAGS.config, field, argv=given)
  config_overrides.check_one_of(flags.FLAGS.config, config_path(given), overrides)
  return argv


def _cannot_load(error: OSError) -> str:
  """The line for a --config file that cannot be read: the last of config_flags' message (e.g.
  "[Errno 2] No such file or directory: ...")."""
  return f'cannot load the --config file: {str(error).strip().splitlines()[-1].strip()}'


def _parse_error(
    error: Exception, argv: Sequence[str], overrides: dict[str, Optional[str]], usage: str
) -> Optional[str]:
  """The one line that says what went wrong in parsing the flags, None for an unexpected error."""
  path = config_path(argv)
  located = _config_file_error(error, path)
  if located is not None:
    return located
  unloadable = _unloadable_config_file(error, path, ':' in (config_arg(argv) or ''))
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
    said = cli.flag_error(error)
    if said == '--config is required' and path is not None:  # Given: config_flags read None.
      return f'{path}: its get_config() returned None: return the config (a missing return?)'
    bad_value = re.match(r'flag --config\.([\w.]+)=(.*?): ', said)
    if bad_value:
      return f'{said}: {config_overrides.expected_value(bad_value[1])}'
    return f'{said}: use {usage}'
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
      text = '. '.join(line.strip() for line in _unquoted(str(error)).splitlines() if line.strip())
      detail = f'{type(error).__name__}: {text}' if text else type(error).__name__
      raised = 'get_config raised ' if any(f.name == 'get_config' for f in frames) else ''
      return f'{path}:{frames[-1].lineno}: {raised}{detail}'
  return None


def _unquoted(text: str) -> str:
  """An exception's text that quotes a KeyError's once more (ml_collections' AttributeError: the
  repr of "'name'", with a newline and "Did you mean ..." after it) as that KeyError's; other text
  (a KeyError's own "'name'") as it is."""
  text = text.strip()
  if len(text) > 1 and text[0] == text[-1] and text[0] in '"\'':
    try:
      unquoted = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      return text
    return unquoted if isinstance(unquoted, str) and unquoted[:1] in '"\'' else text
  return text


def _causes(error: Optional[BaseException]) -> list[BaseException]:
  """`error` and the chain of exceptions it was raised from or while handling, outermost first."""
  causes = []
  while error is not None and all(error is not seen for seen in causes):
    causes.append(error)
    error = error.__cause__ or error.__context__
  return causes


def _unloadable_config_file(
    error: BaseException, path: Optional[str], arg_given: bool
) -> Optional[str]:
  """The one line for a --config file that is no config: not Python (a checkpoint given as
  --config), without get_config (a sweep file), whose get_config takes no `:ARG`, or needs one not
  given, or more than the one `:ARG` gives (a recipe other config files call); else None."""
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
    missing = re.match(r'get_config\(\) missing (\d+) required', text)
    if isinstance(cause, TypeError) and missing:
      if missing[1] == '1' and not arg_given:
        return f'--config={path}: its get_config() needs an argument ({text}): pass --config={path}:ARG'
      return (
          f'--config={path}: its get_config() needs more arguments than the one :ARG gives ({text}): '
          'it is a recipe other config files call (its docstring names them): pass one of those'
      )
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
    unknown = config_overrides.unknown_field(config, field, value)
    if unknown:
      return unknown
  return (
      f'bad config override: the config has no field of '
      f'{" ".join(given(f, v) for f, v in overrides.items())}; vit_jax/defaults.py lists the fields'
  )
