"""The YAML header of a Hugging Face dataset repository's README.md: its configs (which files
hold which split) and its features (`dataset_info`), as `datasets` reads them (MetadataConfigs,
DatasetInfo)."""

import os
import re
from typing import Any

import yaml

from vit_jax.data import hf_data_files


def read(root: str) -> dict[str, Any]:
  """The YAML header of the dataset's README.md; {} where there is none."""
  path = os.path.join(root, 'README.md')
  if not hf_data_files.exists(path):
    return {}
  with hf_data_files.open_file(path) as f:
    text = f.read().decode('utf-8')
  match = re.match(r'---\s*\n(.*?)\n---\s*(\n|$)', text, re.DOTALL)
  try:
    header = yaml.safe_load(match.group(1)) if match else None
  except yaml.YAMLError as e:
    raise ValueError(f'{path}: its YAML header does not parse: {str(e).splitlines()[0]}') from None
  return header if isinstance(header, dict) else {}


def default_config(root: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
  """The config `datasets.load_dataset` loads where none is named (MetadataConfigs)."""
  defaults = [c for c in configs if c.get('default')]
  named = [c for c in configs if c.get('config_name') == 'default']
  if defaults or named or len(configs) == 1:
    return (defaults or named or configs)[0]
  names = [c.get('config_name') for c in configs]
  raise ValueError(
      f'Dataset {root} has configs {names} in its README.md and none is the default: mark the one '
      "to read with `default: true` in its README.md's YAML header (or download only that one's "
      'files and remove the `configs` entry)'
  )


def configured_splits(root: str, config: dict[str, Any]) -> dict[str, list[str]]:
  """The splits of a README config: its data_files patterns (a pattern, a list, or split/path
  entries), under its data_dir."""
  data_dir = config.get('data_dir') or ''
  base = os.path.join(root, data_dir)
  data_files = config.get('data_files')
  if data_files is None:
    return {
        s: [os.path.normpath(os.path.join(data_dir, f)) for f in files]
        for s, files in hf_data_files.split_by_paths(hf_data_files.data_files(base)).items()
    }
  if isinstance(data_files, (str, list)) and not (
      isinstance(data_files, list) and data_files and isinstance(data_files[0], dict)
  ):
    data_files = [{'split': 'train', 'path': data_files}]
  splits = {}
  for entry in data_files:
    patterns = entry['path'] if isinstance(entry['path'], list) else [entry['path']]
    found = [
        os.path.normpath(os.path.join(data_dir, f))
        for pattern in patterns  # datasets' order: pattern by pattern, a pattern's files sorted.
        for f in sorted(hf_data_files.glob_files(base, pattern))
        if hf_data_files.is_data(f)
    ]
    splits[entry['split']] = found
  return splits


def features(card: dict[str, Any], config_name: str | None) -> dict[str, dict[str, Any]]:
  """The README's `dataset_info` features of the config, as datasets' feature JSON."""
  infos = card.get('dataset_info') or []
  infos = infos if isinstance(infos, list) else [infos]
  named = [i for i in infos if i.get('config_name') == config_name]
  info = (named or infos)[0] if named or len(infos) == 1 else None
  return _features((info or {}).get('features') or [])


def _features(card_features: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """A card's list of features as datasets' feature JSON: a struct's as a dict of its fields'."""
  return {
      feature['name']: _feature(feature['dtype'] if 'dtype' in feature else feature)
      for feature in card_features
  }


def _feature(dtype: Any) -> Any:
  """A card's dtype as datasets' feature JSON: 'image', a Value's dtype, {'class_label': ...}, or a
  dict of a 'struct' (its fields) or a 'list' (datasets 4 and up; 'sequence' before) of a dtype."""
  if dtype == 'image':
    return {'_type': 'Image'}
  if isinstance(dtype, str):
    return {'_type': 'Value', 'dtype': dtype}
  if isinstance(dtype, dict) and 'class_label' in dtype:
    names = dtype['class_label'].get('names') or {}
    ordered = [names[k] for k in sorted(names, key=int)] if isinstance(names, dict) else names
    return {'_type': 'ClassLabel', 'names': [str(n) for n in ordered]}
  if isinstance(dtype, dict) and 'struct' in dtype:
    return _features(dtype['struct'] or [])
  for key in ('list', 'large_list', 'sequence'):
    if isinstance(dtype, dict) and key in dtype:
      return {'_type': 'List', 'feature': _feature(dtype[key])}
  return {'_type': 'List'}
