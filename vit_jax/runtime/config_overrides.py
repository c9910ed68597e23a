"""`--config.FIELD=VALUE` overrides beyond what ml_collections' config_flags parses: `=None` unsets a
field that may be unset (`unset`), `evals.NAME=dict(...)` adds or replaces an evaluator and
`evals.NAME=None` drops one (`set_evaluator`), `a,b` of a tuple field is two words
(`split_bare_words`), total_steps over a file's num_epochs says how to clear it (`check_one_of`), and
a value of the wrong type says what the field takes (`expected_value`). config_files.py applies them
around config_flags' parsing.
"""

import ast
import difflib
import re
from typing import Optional, Sequence

import ml_collections

from vit_jax import defaults
from vit_jax.runtime import cli

_OVERRIDE = re.compile(r'^--?(?:no)?config\.([^=]+)(?:=(.*))?$')

# Fields of which a run takes exactly one (train/setup.py checks it too, without the command line).
_ONE_OF = ('total_steps', 'num_epochs')


def with_values_joined(argv: Sequence[str]) -> list[str]:
  """`--config.FIELD VALUE` (absl's other spelling of a flag's value) as `--config.FIELD=VALUE`, so
  that `=None` and an evaluator given whole are seen in it too. A boolean's `--config.FIELD` before
  another flag stays as it is; one before a word would leave the word an unexpected argument."""
  joined = []
  for arg in argv:
    previous = joined[-1] if joined else ''
    if (
        '--' not in joined
        and not arg.startswith('-')
        and '=' not in previous
        and _OVERRIDE.match(previous)
        and not previous.lstrip('-').startswith('no')
    ):
      joined[-1] = f'{previous}={arg}'
    else:
      joined.append(arg)
  return joined


def overrides(argv: Sequence[str]) -> dict[str, Optional[str]]:
  """field -> the last value given for it by `--config.FIELD=VALUE` (None for `--config.FIELD`)."""
  found = {}
  for arg in argv:
    match = _OVERRIDE.match(arg)
    if match:
      found.pop(match[1], None)  # Ordered as the last of each, as config_flags applies them.
      found[match[1]] = match[2]
  return found


def _parent(
    config: Optional[ml_collections.ConfigDict], field: str
) -> tuple[Optional[ml_collections.ConfigDict], str]:
  """The ConfigDict that holds dotted `field` in `config` (None where a parent is missing or not a
  ConfigDict), and the field's own name."""
  *parents, name = field.split('.')
  for parent in parents:
    config = config.get(parent) if isinstance(config, ml_collections.ConfigDict) else None
  return config, name


def split_bare_words(
    config: ml_collections.ConfigDict, overrides: dict[str, Optional[str]]
) -> None:
  """`--config.FIELD=a,b` of a tuple field as ('a', 'b'): config_flags keeps words it cannot read
  as literals whole, ('a,b',), where `2,4` is (2, 4)."""
  for field, value in overrides.items():
    node, name = _parent(config, field)
    if value and ',' in value and isinstance(node, ml_collections.ConfigDict):
      if name in node and isinstance(node[name], tuple) and node[name] == (value,):
        node[name] = tuple(word.strip() for word in value.split(','))


def refuse_dicts(config: ml_collections.ConfigDict, overrides: dict[str, Optional[str]]) -> None:
  """A dict given to a tuple field: config_flags takes it as the tuple of its keys
  (`--config.optim.frozen={'a': 1}` froze every parameter named with an 'a')."""
  for field, value in overrides.items():
    node, name = _parent(config, field)
    if (
        (value or '').lstrip().startswith('{')
        and isinstance(node, ml_collections.ConfigDict)
        and isinstance(node.get(name), tuple)
    ):
      cli.fail(f'bad config override --config.{field}={value}: {expected_value(field)}')


def field_of(arg: str) -> Optional[str]:
  match = _OVERRIDE.match(arg)
  return match[1] if match else None


def evaluator_name(field: str) -> Optional[str]:
  """NAME of an override `evals.NAME`, which gives an evaluator whole; None for another field."""
  parts = field.split('.')
  return parts[1] if len(parts) == 2 and parts[0] == 'evals' else None


EVALUATOR_EXAMPLE = "\"dict(type='classification', split='test', every_steps=1000)\""


def set_evaluator(config: ml_collections.ConfigDict, field: str, value: Optional[str]) -> None:
  """`--config.evals.NAME=dict(...)` (or `{...}`): adds the evaluator NAME, or replaces the file's."""
  bad = f'bad config override --config.{field}={value}: '
  try:
    tree = ast.parse(value or '', mode='eval').body
    if isinstance(tree, ast.Call) and getattr(tree.func, 'id', None) == 'dict' and not tree.args:
      evaluator = {keyword.arg: ast.literal_eval(keyword.value) for keyword in tree.keywords}
    else:
      evaluator = ast.literal_eval(tree)
  except (ValueError, SyntaxError, TypeError):
    evaluator = None
  if not isinstance(evaluator, dict) or not all(isinstance(k, str) for k in evaluator):
    cli.fail(f'{bad}an evaluator is a dict of literals: --config.{field}={EVALUATOR_EXAMPLE}')
  with config.evals.unlocked():
    config.evals[evaluator_name(field)] = evaluator


def is_unset(arg: str) -> bool:
  match = _OVERRIDE.match(arg)
  return bool(match) and match[2] == 'None' and not arg.lstrip('-').startswith('no')


# A field's type -> what to write for it on the command line.
_KINDS = {
    bool: 'True or False',
    int: 'an integer',
    float: 'a number',
    str: 'a string',
    tuple: 'values separated by commas',
    list: 'values separated by commas',
}


def expected_value(field: str) -> str:
  """What `--config.FIELD=` takes, from its type in vit_jax/defaults.py, with its default."""
  node, name = _parent(defaults.get_config(), field)
  if not isinstance(node, ml_collections.ConfigDict) or name not in node:
    return f'give config.{field} a value of its type'
  value = node[name]
  if isinstance(value, ml_collections.ConfigDict):  # Its fields are set one by one.
    first = next(iter(value.keys()), None)
    example = f', e.g. --config.{field}.{first}={value[first]}' if first else ''
    return f'config.{field} is a group of fields ({", ".join(value.keys())}): set each{example}'
  kind = _KINDS.get(node.get_type(name), node.get_type(name).__name__)
  if value is None:
    return f'config.{field} takes {kind}, or None (unset)'
  if isinstance(value, (tuple, list)) and not value:
    return f'config.{field} takes {kind}'
  example = ','.join(map(str, value)) if isinstance(value, (tuple, list)) else value
  return f'config.{field} takes {kind}, e.g. --config.{field}={example}'


def _given(field: str, value: Optional[str]) -> str:
  return f'--config.{field}' + ('' if value is None else f'={value}')


def unknown_field(
    config: Optional[ml_collections.ConfigDict], field: str, value: Optional[str]
) -> Optional[str]:
  """The one-line error of an override `--config.field[=value]` that names no field of `config`,
  with the field it likely meant; None where `field` is one (or `config` is None: unknown)."""
  node, parts = config, field.split('.')
  for i, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict):
      return None
    if part not in node:
      bad = f'bad config override {_given(field, value)}: the config has no field {field}'
      close = difflib.get_close_matches(part, list(node.keys()), n=1)
      if close:
        meant = '.'.join(parts[:i] + close + parts[i + 1 :])
        return f'{bad}. Did you mean "{meant}" ({_given(meant, value)})?'
      parent = '.'.join(parts[:i])
      if parent == 'evals':
        return (
            f"{bad}: the file's evaluators are {', '.join(node.keys()) or 'none'}; a new one is "
            f'given whole: --config.evals.{part}={EVALUATOR_EXAMPLE}'
        )
      if parent and len(node) <= 20:
        return f'{bad}: config.{parent} has the fields {", ".join(node.keys())}'
      return f'{bad}: vit_jax/defaults.py lists the fields'
    node = node[part]
  return None


def unset(config: ml_collections.ConfigDict, field: str, argv: Sequence[str] = ()) -> None:
  """`--config.FIELD=None`: sets the field to None if it may be None (its default is, or its value);
  `--config.evals.NAME=None` drops the evaluator NAME, of the file or added earlier in `argv`."""
  *parents, name = field.split('.')
  if evaluator_name(field):
    if name not in config.evals and any(
        field_of(arg) == field and not is_unset(arg) for arg in argv
    ):
      return  # Added, then dropped, on one command line.
    if name not in config.evals:
      cli.fail(
          f"--config.{field}=None: config.evals has no evaluator {name!r} to drop (the file's: "
          f'{", ".join(config.evals.keys()) or "none"})'
      )
    with config.evals.unlocked():
      del config.evals[name]
    return
  unknown = unknown_field(config, field, 'None')
  if unknown:
    cli.fail(unknown)
  node = config
  for parent in parents:
    node = node[parent]
  default, _ = _parent(defaults.get_config(), field)
  optional = node[name] is None or (
      isinstance(default, ml_collections.ConfigDict) and name in default and default[name] is None
  )
  if isinstance(node[name], ml_collections.ConfigDict):
    cli.fail(f'--config.{field}=None: {expected_value(field)}')
  if not optional:
    cli.fail(
        f'--config.{field}=None: config.{field} cannot be unset, only a field whose default is '
        f'unset (vit_jax/defaults.py) can: give it a value, e.g. --config.{field}={node[name]!r}'
    )
  node[name] = None


def check_one_of(
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
