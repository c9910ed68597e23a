"""Which files of a Hugging Face dataset on disk hold which split, in which format, and what its
columns are.

Two layouts, as the `datasets` library writes them:
- A dataset repository, as `hf download --repo-type dataset NAME --local-dir DIR` downloads it (or
  'hf-hub:NAME[@REVISION]': its data files and README.md, into the Hugging Face cache), or any
  folder of data files: split as `datasets.load_dataset(DIR)` splits them: by the `configs` of the
  YAML header of its README.md (hf_card.py: the default config's `data_files` and `data_dir`), else
  by their paths: the hub's `data/<split>-00000-of-00002.parquet`, else a directory then a file name
  holding a split's word (train, training; validation, valid, val, dev; test, testing, eval,
  evaluation) between separators, else all of them are 'train'. Their format is their most common
  extension, as datasets infers it: Parquet, Arrow, WebDataset tar files (hf_webdataset.py) or
  image files (hf_imagefolder.py).
- A `save_to_disk` directory: `dataset_dict.json` and a folder of Arrow files a split, or one
  split's Arrow files beside its `state.json`.

The columns' features (which one is an Image, which a ClassLabel and its names) are `datasets`' own
metadata: a Parquet or Arrow schema's 'huggingface' entry, a save_to_disk split's
`dataset_info.json`, or the README's `dataset_info`; an image folder's, else, its metadata files'
columns or its folders' names.
"""

import dataclasses
import json
import os
from typing import Any

from vit_jax.data import folder
from vit_jax.data import hf_card
from vit_jax.data import hf_data_files
from vit_jax.data import hf_features
from vit_jax.data import images
from vit_jax.data import zip_members
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


FILE_NAME = 'file_name'


def is_metadata(path: str) -> bool:
  return os.path.basename(path) in hf_data_files.METADATA_FILES


def metadata_table(path: str):
  """The pyarrow table of a metadata file; a one-line ValueError where it does not parse."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  # Only these datasets need it.
  from pyarrow import csv, json, parquet  # pylint: disable=g-import-not-at-top

  read = {'.csv': csv.read_csv, '.jsonl': json.read_json, '.parquet': parquet.read_table}
  try:  # Read as an image is: from local disk, cloud storage or a zip archive.
    return read[os.path.splitext(path)[1]](pa.BufferReader(folder.read_file(path)))
  except (pa.ArrowException, OSError, images.UnreadableImage) as e:
    raise hf_data_files.unreadable(
        path, e, 'metadata file', "write it again: a 'file_name' column, and a column a feature"
    ) from None


def _metadata(splits: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
  return {split: [f for f in files if is_metadata(f)] for split, files in splits.items()}


def _image_column(name: str) -> str:
  """The column that metadata column `name` names the images of ('' where it names none)."""
  if name == FILE_NAME:
    return 'image'
  return name[: -len('_' + FILE_NAME)] if name.endswith('_' + FILE_NAME) else ''


def _imagefolder_features(splits: dict[str, tuple[str, ...]]) -> dict[str, dict[str, Any]]:
  """The columns (datasets' feature JSON) of the image folder whose splits hold these files: those
  of its metadata files, else the image, and a ClassLabel of its folders' names where the images
  lie at one depth in more than one folder. One-line errors where datasets would fail."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  metadata = _metadata(splits)
  if not any(metadata.values()):
    files = [f for found in splits.values() for f in found]
    labels = {os.path.basename(os.path.dirname(f)) for f in files}
    found = {'image': {'_type': 'Image'}}
    if len(labels) > 1 and len({f.count('/') for f in files}) == 1:
      found['label'] = {'_type': 'ClassLabel', 'names': sorted(labels)}
    return found
  without = [split for split, files in metadata.items() if not files]
  if without:
    raise ValueError(
        f'Split {without[0]!r} has no metadata file where split {next(iter(metadata))!r} has one: '
        'give every split its metadata.csv (or .jsonl, .parquet), or none'
    )
  formats = sorted({os.path.splitext(f)[1] for files in metadata.values() for f in files})
  if len(formats) > 1:
    raise ValueError(f'The metadata files are of different formats ({formats}): keep one')
  schemas = {files[0]: metadata_table(files[0]).schema for files in metadata.values()}
  (first, schema), *others = schemas.items()
  for path, other in others:
    if not other.equals(schema):
      raise ValueError(
          f'Metadata files {path} and {first} have different columns or types: give every split '
          'the same columns'
      )
  found = {}
  for field in schema:
    column = _image_column(field.name)
    if column and (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
      found[column] = {'_type': 'Image'}
    elif hf_features.is_list(field.type):  # .jsonl, .parquet.
      found[field.name] = {
          '_type': 'List',
          'feature': {'_type': 'Value', 'dtype': str(field.type.value_type)},
      }
    else:
      found[field.name] = {'_type': 'Value', 'dtype': str(field.type)}
  if not any(f['_type'] == 'Image' for f in found.values()):
    raise ValueError(
        f"{first} has no 'file_name' column naming each image (relative to its folder): add one"
    )
  return found


def _hub_files(given: str, files: list[str]) -> list[str]:
  """What a dataset repository on the hub downloads: its data files and README.md."""
  # A zip's files cannot be seen before it is downloaded: an image folder's, checked once it is.
  module = hf_data_files.format_of(
      given, {'': [f for f in files if hf_data_files.is_data(f)]}, lambda _: '.jpg'
  )
  extensions, names = hf_data_files.read_as(module)
  if module == 'imagefolder':
    extensions += (hf_data_files.ARCHIVE,)
  return [f'*{e}' for e in (*extensions, *names)] + ['README.md']


def _with_archives_opened(files: tuple[str, ...]) -> tuple[str, ...]:
  """An image folder split's files, each zip archive's replaced by its images and metadata files
  (paths through the archive), after the split's other files (as datasets reads them)."""
  archives = [f for f in files if f.endswith(hf_data_files.ARCHIVE)]
  inside = [
      os.path.join(archive, name)
      for archive in archives
      for name in zip_members.names(archive)
      if is_metadata(name)
      or os.path.splitext(name)[1].lower() in hf_data_files.FORMATS['imagefolder']
  ]
  return tuple(f for f in files if f not in archives) + tuple(inside)


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
  card = hf_card.read(root)
  configs = card.get('configs') or []
  config = hf_card.default_config(root, configs) if configs else {}
  splits = (
      hf_card.configured_splits(root, config)
      if config
      else hf_data_files.split_by_paths(hf_data_files.data_files(root))
  )
  splits = {name: files for name, files in splits.items() if files}
  module = hf_data_files.format_of(
      root,
      splits,
      lambda zips: zip_members.most_common_extension([os.path.join(root, z) for z in zips]),
  )
  files = {
      name: tuple(os.path.join(root, f) for f in hf_data_files.of_format(found, module))
      for name, found in splits.items()
  }
  files = {name: found for name, found in files.items() if found}
  archives = [f for found in files.values() for f in found if f.endswith(hf_data_files.ARCHIVE)]
  if archives and module != 'imagefolder':
    raise ValueError(
        f'{archives[0]} is a zip archive of {module} files, which vit_jax reads unzipped only: '
        'unzip it where it is (and remove the archive)'
    )
  first = next(iter(files.values()))[0]
  written = {'parquet': _parquet_features, 'arrow': _arrow_features}.get(module, lambda _: {})
  features = written(first) or hf_card.features(card, config.get('config_name'))
  if module == 'imagefolder':  # The README's features, else the files' (datasets' order).
    files = {name: _with_archives_opened(found) for name, found in files.items()}
    features = features or _imagefolder_features(files)
  return Layout(root, module, files, features)
