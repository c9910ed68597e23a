"""Which files of a Hugging Face dataset on disk hold which split, in which format, and what its
columns are.

Two layouts, as the `datasets` library writes them:
- A dataset repository, as `hf download --repo-type dataset NAME --local-dir DIR` downloads it (or
  'hf-hub:NAME[@REVISION]': its data files and README.md, into the Hugging Face cache), or any
  folder of data files: split as `datasets.load_dataset(DIR)` splits them: by the `configs` of the
  YAML header of its README.md (the default config's `data_files` and `data_dir`), else by their
  paths: the hub's `data/<split>-00000-of-00002.parquet`, else a directory then a file name holding
  a split's word (train, training; validation, valid, val, dev; test, testing, eval, evaluation)
  between separators, else all of them are 'train'. Their format is their most common extension, as
  datasets infers it: Parquet, Arrow, or WebDataset tar files (hf_webdataset.py).
- A `save_to_disk` directory: `dataset_dict.json` and a folder of Arrow files a split, or one
  split's Arrow files beside its `state.json`.

The columns' features (which one is an Image, which a ClassLabel and its names) are `datasets`' own
metadata: a Parquet or Arrow schema's 'huggingface' entry, a save_to_disk split's
`dataset_info.json`, or the README's `dataset_info`.
"""

import dataclasses
import json
import os
import re
from typing import Any

import yaml

from vit_jax.data import hf_data_files
from vit_jax.runtime import hf_hub
from vit_jax.runtime import paths


@dataclasses.dataclass(frozen=True)
class Layout:
  """A dataset's splits: `splits[name]` its data files, in order, in `format` (a key of
  hf_data_files.FORMATS)."""

  root: str
  format: str
  splits: dict[str, tuple[str, ...]]
  features: dict[str, dict[str, Any]]  # Column -> datasets' feature JSON; {} where none is written.


def _card(root: str) -> dict[str, Any]:
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


def _default_config(root: str, configs: list[dict[str, Any]]) -> dict[str, Any]:
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


def _configured_splits(root: str, config: dict[str, Any]) -> dict[str, list[str]]:
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


def _card_features(card: dict[str, Any], config_name: str | None) -> dict[str, dict[str, Any]]:
  """The README's `dataset_info` features of the config, as datasets' feature JSON."""
  infos = card.get('dataset_info') or []
  infos = infos if isinstance(infos, list) else [infos]
  named = [i for i in infos if i.get('config_name') == config_name]
  info = (named or infos)[0] if named or len(infos) == 1 else None
  features = {}
  for feature in (info or {}).get('features') or []:
    dtype = feature.get('dtype')
    if dtype == 'image':
      features[feature['name']] = {'_type': 'Image'}
    elif isinstance(dtype, dict) and 'class_label' in dtype:
      names = dtype['class_label'].get('names') or {}
      ordered = [names[k] for k in sorted(names, key=int)] if isinstance(names, dict) else names
      features[feature['name']] = {'_type': 'ClassLabel', 'names': [str(n) for n in ordered]}
    elif isinstance(dtype, str):
      features[feature['name']] = {'_type': 'Value', 'dtype': dtype}
    else:
      features[feature['name']] = {'_type': 'List'}
  return features


def _read_json(path: str) -> Any:
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def _saved_split(directory: str) -> tuple[tuple[str, ...], dict[str, dict[str, Any]]]:
  """A save_to_disk split's Arrow files (state.json's) and its features (dataset_info.json's)."""
  state = _read_json(os.path.join(directory, 'state.json'))
  files = tuple(os.path.join(directory, f['filename']) for f in state['_data_files'])
  info_path = os.path.join(directory, 'dataset_info.json')
  features = _read_json(info_path).get('features') or {} if os.path.exists(info_path) else {}
  return files, features


def _saved(root: str) -> Layout | None:
  """The layout of a save_to_disk directory; None where `root` is not one."""
  if os.path.exists(os.path.join(root, 'dataset_dict.json')):
    names = _read_json(os.path.join(root, 'dataset_dict.json'))['splits']
    read = {name: _saved_split(os.path.join(root, name)) for name in names}
    features = next((f for _, f in read.values() if f), {})
    return Layout(root, 'arrow', {name: files for name, (files, _) in read.items()}, features)
  if os.path.exists(os.path.join(root, 'state.json')):
    files, features = _saved_split(root)
    split = _read_json(os.path.join(root, 'state.json')).get('_split') or 'train'
    return Layout(root, 'arrow', {split: files}, features)
  return None


def unreadable_parquet(path: str, error: Exception) -> ValueError:
  """The one-line error for a data file that pyarrow cannot read."""
  return hf_data_files.unreadable(path, error, 'Parquet file', 'download it again')


def parquet_file(path: str):
  """pyarrow's ParquetFile of `path` (its schema and row counts read); a one-line ValueError where
  it is not one."""
  import pyarrow  # pylint: disable=g-import-not-at-top  # Only these datasets need it.
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  try:
    return pq.ParquetFile(hf_data_files.open_file(path) if paths.is_url(path) else path)
  except (pyarrow.ArrowException, OSError) as e:
    raise unreadable_parquet(path, e) from None


def _schema_features(schema) -> dict[str, dict[str, Any]]:
  """The features `datasets` wrote into an Arrow schema; {} where none."""
  metadata = schema.metadata or {}
  if b'huggingface' not in metadata:
    return {}
  return json.loads(metadata[b'huggingface']).get('info', {}).get('features') or {}


def _parquet_features(path: str) -> dict[str, dict[str, Any]]:
  return _schema_features(parquet_file(path).schema_arrow)


def open_arrow(path: str, fix: str = 'write the dataset again with save_to_disk'):
  """The table of an Arrow file (datasets writes the stream format), memory-mapped; a one-line
  ValueError naming `fix` where it is not one."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  # Only these datasets need it.

  try:
    source = pa.memory_map(path)
    try:
      return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
      return pa.ipc.open_file(source).read_all()
  except (pa.ArrowException, OSError) as e:
    raise ValueError(
        f'{path} is not a readable Arrow file ({str(e).strip().splitlines()[0]}): {fix}'
    ) from None


def _arrow_features(path: str) -> dict[str, dict[str, Any]]:
  return _schema_features(open_arrow(path, 'download it again').schema)


def _hub_files(given: str, files: list[str]) -> list[str]:
  """What a dataset repository on the hub downloads: its data files and README.md."""
  module = hf_data_files.format_of(given, {'': [f for f in files if hf_data_files.is_data(f)]})
  return [f'*{e}' for e in hf_data_files.FORMATS[module]] + ['README.md']


def read(root: str) -> Layout:
  """The layout of the Hugging Face dataset in local directory `root`, or on the hub
  ('hf-hub:<repo>[@<revision>]', downloaded into the Hugging Face cache); a one-line ValueError
  where it is not one."""
  if hf_hub.is_hub(root):
    root = hf_hub.snapshot(root, 'dataset', _hub_files)
  if paths.is_url(root):
    if hf_data_files.exists(os.path.join(root, 'dataset_dict.json')) or hf_data_files.exists(
        os.path.join(root, 'state.json')
    ):
      raise ValueError(
          f'config.data_dir={root!r} is a save_to_disk directory on cloud storage, whose Arrow '
          'files are read memory-mapped: copy it to a local disk'
      )
  elif not os.path.isdir(root):
    raise ValueError(
        f'config.data_dir={root!r} is not a directory: set it to a Hugging Face dataset downloaded '
        'with `hf download --repo-type dataset NAME --local-dir DIR`, one written by save_to_disk, '
        'or a folder of Parquet or WebDataset (.tar) files'
    )
  try:
    saved = None if paths.is_url(root) else _saved(root)
  except (OSError, KeyError, TypeError, json.JSONDecodeError) as e:
    raise ValueError(
        f'config.data_dir={root!r} is not a whole save_to_disk directory ({type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}): write it again with save_to_disk'
    ) from None
  if saved:
    return saved
  card = _card(root)
  configs = card.get('configs') or []
  config = _default_config(root, configs) if configs else {}
  splits = (
      _configured_splits(root, config)
      if config
      else hf_data_files.split_by_paths(hf_data_files.data_files(root))
  )
  splits = {name: files for name, files in splits.items() if files}
  module = hf_data_files.format_of(root, splits)
  files = {
      name: tuple(os.path.join(root, f) for f in hf_data_files.of_format(found, module))
      for name, found in splits.items()
  }
  files = {name: found for name, found in files.items() if found}
  first = next(iter(files.values()))[0]
  written = {'parquet': _parquet_features, 'arrow': _arrow_features}.get(module, lambda _: {})
  features = written(first) or _card_features(card, config.get('config_name'))
  return Layout(root, module, files, features)
