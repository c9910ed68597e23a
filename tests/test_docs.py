"""The README and docs/ name only what exists: commands, config fields, files and pages."""

import glob
import importlib.util
import os
import re

import ml_collections
import pytest

import helpers
from vit_jax import defaults

PAGES = [
    os.path.join(helpers.REPO, 'README.md'),
    *sorted(glob.glob(os.path.join(helpers.REPO, 'docs', '*.md'))),
]
# Dicts whose keys a config chooses: any name below them is valid.
_OPEN = ('evals',)
# What the docs name on purpose as the misspelling a config check catches.
_MISSPELT = {'lr.warmup'}
# `config.` followed by these is a run's file (config.json, config.resume_<k>.json), not a field.
_FILE = r'(?!json\b|resume_)'


def _text(page: str) -> str:
  with open(page) as f:
    return f.read()


def _names(pattern: str) -> list[tuple[str, str]]:
  """(page, match) for each distinct match of `pattern`'s first group on each page."""
  return sorted(
      {
          (os.path.relpath(page, helpers.REPO), m)
          for page in PAGES
          for m in re.findall(pattern, _text(page))
      }
  )


def _is_field(path: str) -> bool:
  node = defaults.get_config()
  for part in path.split('.'):
    if not isinstance(node, ml_collections.ConfigDict) or part not in node:
      return False
    if part in _OPEN:
      return True
    node = node[part]
  return True


def test_the_pages_exist_and_the_readme_is_short():
  assert len(PAGES) > 5
  assert len(_text(PAGES[0]).splitlines()) <= 250
  for page, link in _names(r'\]\(((?:docs/)?[\w/]+\.(?:md|png))\)'):
    folder = helpers.REPO if page == 'README.md' else os.path.join(helpers.REPO, 'docs')
    assert os.path.exists(os.path.join(folder, link)), (page, link)


def test_every_command_named_exists():
  commands = _names(r'-m (vit_jax(?:\.\w+)+)')
  assert len({c for _, c in commands}) >= 9
  for page, module in commands:
    assert importlib.util.find_spec(module) is not None, (page, module)


@pytest.mark.parametrize(
    'pattern',
    [
        r'--config\.([a-z_]\w*(?:\.\w+)*)=',
        r'`config\.' + _FILE + r'([a-z_]\w*(?:\.[a-z_]\w*)*)',
        r'\bconfig\.' + _FILE + r'([a-z_]\w*(?:\.[a-z_]\w*)*)\s*=[^=]',
    ],
)
def test_every_config_field_named_exists(pattern):
  fields = _names(pattern)
  assert fields
  missing = [
      (page, field) for page, field in fields if not _is_field(field) and field not in _MISSPELT
  ]
  assert not missing, missing


def test_every_file_named_exists():
  files = _names(
      r'\b((?:configs|benchmarks|launch|vit_jax|tests)/[a-z0-9_/]+\.(?:py|sh|sbatch|md))'
  )
  assert len(files) > 20
  missing = [(page, f) for page, f in files if not os.path.exists(os.path.join(helpers.REPO, f))]
  assert not missing, missing
