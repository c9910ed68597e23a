"""Which files of a folder `datasets.load_dataset` reads as which split, and in which format, where
no README config names them: its rules (datasets.data_files, datasets.load), checked against it in
tests/data/test_hf_source.py on random trees.
"""

import collections
import glob
import os
import re
from typing import Callable

from etils import epath

from vit_jax.data import images
from vit_jax.runtime import paths

# datasets' data_files.SPLIT_KEYWORDS and NON_WORDS_CHARS: the words that name a split in a path.
_SPLIT_KEYWORDS = {
    'train': ('train', 'training'),
    'validation': ('validation', 'valid', 'dev', 'val'),
    'test': ('test', 'testing', 'eval', 'evaluation'),
}
_SEPARATOR = r'[-._ 0-9]'
_SHARDED = re.compile(r'data/(\w+(?:\.\w+)*)-[0-9]{5}-of-[0-9]{5}[^/]*\.[^/]*')
# datasets' data_files.FILES_TO_IGNORE: never data files.
_NOT_DATA = ('README.md', 'config.json', 'dataset_info.json', 'dataset_infos.json')
_NOT_DATA += ('dummy_data.zip', 'dataset_dict.json')
# datasets' ImageFolder.EXTENSIONS: the files of its `imagefolder` format (those PIL opens).
_IMAGEFOLDER = ('.blp', '.bmp', '.dib', '.bufr', '.cur', '.pcx', '.dcx', '.dds', '.ps', '.eps')
_IMAGEFOLDER += ('.fit', '.fits', '.fli', '.flc', '.ftc', '.ftu', '.gbr', '.gif', '.grib', '.png')
_IMAGEFOLDER += ('.apng', '.jp2', '.j2k', '.jpc', '.jpf', '.jpx', '.j2c', '.icns', '.ico', '.im')
_IMAGEFOLDER += ('.iim', '.tif', '.tiff', '.jfif', '.jpe', '.jpg', '.jpeg', '.mpg', '.mpeg', '.msp')
_IMAGEFOLDER += ('.pcd', '.pxr', '.pbm', '.pgm', '.ppm', '.pnm', '.psd', '.bw', '.rgb', '.rgba')
_IMAGEFOLDER += ('.sgi', '.ras', '.tga', '.icb', '.vda', '.vst', '.webp', '.wmf', '.emf', '.xbm')
_IMAGEFOLDER += ('.xpm',)
# The formats vit_jax reads: datasets' module -> its data files' extensions.
FORMATS = {
    'parquet': ('.parquet', '.geoparquet', '.gpq'),
    'arrow': ('.arrow',),
    'webdataset': ('.tar',),
    'imagefolder': _IMAGEFOLDER,
}
# An image folder's files that list its images and their columns, and its zip archives of images.
METADATA_FILES = ('metadata.csv', 'metadata.jsonl', 'metadata.parquet')
ARCHIVE = '.zip'
# datasets' other modules, by the extensions of _EXTENSION_TO_MODULE an image dataset may hold beside
# its data (tables, text): the name of the format a one-line error then gives.
_OTHER_FORMATS = {
    **{e: 'csv' for e in ('.csv', '.tsv')},
    **{e: 'json' for e in ('.json', '.jsonl', '.ndjson')},
    **{e: 'hdf5' for e in ('.h5', '.hdf5')},
    '.txt': 'text',
    '.xml': 'xml',
    '.md': 'harbor',
    '.toml': 'harbor',
    '.eval': 'eval',
    '.lance': 'lance',
    '.vortex': 'vortex',
}
# Files that datasets counts last in a split's extensions: an image folder's metadata.
_METADATA = (*METADATA_FILES, 'latest_version_hint.json')
_METADATA += ('instruction.md', 'task.toml')


def _hidden(relative: str) -> bool:
  """Whether datasets leaves the file out: its name or a folder's starts with '.', or a folder's
  with '__' (__pycache__)."""
  *folders, name = relative.split('/')
  return name.startswith('.') or any(f.startswith(('.', '__')) for f in folders)


def glob_files(directory: str, pattern: str) -> list[str]:
  """The files under `directory` (local, or gs://...) that `pattern` matches, relative to it."""
  if not paths.is_url(directory):
    found = glob.glob(pattern, root_dir=directory, recursive=True)
    return [f for f in found if os.path.isfile(os.path.join(directory, f))]
  # epath refuses '**' on GCS; fsspec lists the objects once.
  import fsspec  # pylint: disable=g-import-not-at-top

  fs, base = fsspec.core.url_to_fs(directory)
  base = base.rstrip('/')
  found = fs.glob(f'{base}/{pattern}', detail=True)
  return [p[len(base) + 1 :] for p, info in found.items() if info['type'] == 'file']


def exists(path: str) -> bool:
  return epath.Path(path).exists() if paths.is_url(path) else os.path.exists(path)


def open_file(path: str, mode: str = 'rb'):
  """`path` opened, on local disk or cloud storage."""
  return epath.Path(path).open(mode) if paths.is_url(path) else open(path, mode)


def read_range(path: str, offset: int, size: int) -> bytes:
  """`size` bytes of file `path` from `offset` (fewer where it ends before), on local disk or cloud
  storage (one ranged request)."""
  if paths.is_url(path):
    import fsspec  # pylint: disable=g-import-not-at-top

    fs, name = fsspec.core.url_to_fs(path)
    return fs.cat_file(name, start=offset, end=offset + size)
  with open(path, 'rb') as f:
    f.seek(offset)
    return f.read(size)


def unreadable(path: str, error: Exception, what: str, fix: str) -> ValueError:
  """The one-line error for data file `path` that is not a readable `what`: a git-lfs pointer says
  to fetch the files, anything else the first line of `error` and `fix`."""
  try:
    with open_file(path) as f:
      lfs = f.read(len(images.LFS_POINTER)) == images.LFS_POINTER
  except OSError:  # A file of a zip archive (zip_members.py): no pointer.
    lfs = False
  reason = 'a git-lfs pointer' if lfs else str(error).strip().splitlines()[0]
  return ValueError(
      f'{path} is not a readable {what} ({reason}): '
      f'{"fetch the files (`git lfs pull`)" if lfs else fix}'
  )


def is_data(relative: str) -> bool:
  return not _hidden(relative) and os.path.basename(relative) not in _NOT_DATA


def data_files(directory: str) -> list[str]:
  """The files under `directory` that may be data, relative to it, sorted."""
  return sorted(f for f in glob_files(directory, '**/*') if is_data(f))


# datasets' default patterns around a split's word, in its order: its
# KEYWORDS_IN_DIR_NAME_BASE_PATTERNS (a folder's whole name, its start, its end, inside it) and
# KEYWORDS_IN_FILENAME_BASE_PATTERNS (the file name's start, inside it), the word between
# separators.
_IN_DIRECTORY = ('{k}', '{k}{s}.*', '.*{s}{k}', '.*{s}{k}{s}.*')
_IN_FILE_NAME = ('{k}{s}.*', '.*{s}{k}{s}.*')


def _matches(relative: str, pattern: str, *, in_directory: bool) -> bool:
  *directories, name = relative.split('/')
  if in_directory:
    return any(re.fullmatch(pattern, d) for d in directories)
  return bool(re.fullmatch(pattern, name))


def split_by_paths(files: list[str]) -> dict[str, list[str]]:
  """`datasets`' splits of files without a configured split (data_files._get_data_files_patterns),
  each in its order: pattern by pattern, a pattern's files sorted (a file twice where two patterns
  match it, as datasets lists it: counted twice to infer the format; `read` keeps it once, where
  datasets 5.2 reads its rows twice)."""
  for split, names in (('logs', r'.*\.eval'), ('test', r'(.*/)?(task\.toml|instruction\.md)')):
    if found := [f for f in files if re.fullmatch(names, f)]:  # DEFAULT_PATTERNS_LOGS, _HARBOR.
      return {split: found}
  sharded: dict[str, list[str]] = {}
  for f in files:
    if match := _SHARDED.fullmatch(f):
      sharded.setdefault(match.group(1), []).append(f)
  if sharded:  # train, validation, test, then the others in code-point order.
    named = [s for s in _SPLIT_KEYWORDS if s in sharded] + sorted(
        set(sharded) - set(_SPLIT_KEYWORDS)
    )
    return {split: sharded[split] for split in named}
  for in_directory, forms in ((True, _IN_DIRECTORY), (False, _IN_FILE_NAME)):
    splits = {}
    for split, words in _SPLIT_KEYWORDS.items():
      patterns = [f.format(k=re.escape(k), s=_SEPARATOR) for k in words for f in forms]
      found = [f for p in patterns for f in files if _matches(f, p, in_directory=in_directory)]
      if found:
        splits[split] = found
    if splits:
      return splits
  return {'train': files} if files else {}


def format_of(
    root: str, splits: dict[str, list[str]], archived: Callable[[list[str]], str | None]
) -> str:
  """The format of the splits' files, as datasets infers it (infer_module_for_data_files): each
  split's most common extension that names one (every extension of a name counts: x.tar.gz is .tar
  and .gz), on a draw Parquet's, then Arrow's (and others'), then the last in code-point order; an
  image folder's metadata.csv last; where zip archives come first, that of the most common
  extension in them, `archived(zips)`. A one-line ValueError where it is not one vit_jax reads, or
  the splits' differ."""
  modules = {e: module for module, extensions in FORMATS.items() for e in extensions}
  modules.update(_OTHER_FORMATS)
  preferred = ('.parquet', '.lance', '.vortex', '.arrow', '.jsonl', '.json', '.csv')
  found = {}
  for split, files in splits.items():
    counts = collections.Counter(
        ('.' + suffix.lower(), os.path.basename(f) in _METADATA)
        for f in files
        for suffix in os.path.basename(f).split('.')[1:]
    )
    ranked = sorted(
        counts.items(),
        key=lambda c: (not c[0][1], c[1], *(c[0][0] == e for e in preferred), c[0][0]),
        reverse=True,
    )
    ranked = [e for (e, _), _ in ranked if e in modules or e == ARCHIVE]
    if ranked and ranked[0] == ARCHIVE:
      ranked = [archived([f for f in files if f.endswith(ARCHIVE)])]
    found[split] = modules.get(ranked[0]) if ranked else None
  if len(set(found.values())) > 1:
    raise ValueError(
        f'config.data_dir={root!r}: its splits hold files of different formats ({found}): keep one '
        'format'
    )
  module = next(iter(found.values()), None)
  if module not in FORMATS:
    raise ValueError(
        f'config.data_dir={root!r} holds no Parquet, Arrow, WebDataset (.tar) or image files of a '
        f"Hugging Face dataset{f' (its files are {module})' if module else ''}: download its "
        "Parquet files (the hub converts most datasets on refs/convert/parquet: try 'hf-hub:NAME"
        "@refs/convert/parquet'), write it with save_to_disk, or make class folders for "
        '--config.dataset=folder'
    )
  return module


def read_as(module: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """The extensions and the file names of the files datasets reads as `module`
  (_MODULE_TO_EXTENSIONS, _MODULE_TO_METADATA_FILE_NAMES): an image folder's images in lower or
  upper case, and its metadata files."""
  if module != 'imagefolder':
    return FORMATS[module], ()
  return (*FORMATS[module], *(e.upper() for e in FORMATS[module])), METADATA_FILES


def of_format(files: list[str], module: str) -> list[str]:
  """The files datasets reads as `module` (DataFilesList.filter: x.parquet, x.parquet.gz; an image
  folder's images and its metadata files; zip archives, of any format), each once."""
  extensions, names = read_as(module)
  extensions += (ARCHIVE,)
  pattern = rf'.*({"|".join(re.escape(e) for e in extensions)})(\..+)?'
  if names:  # datasets' file-name pattern: any path that ends with one.
    pattern += rf'|.*({"|".join(re.escape(n) for n in names)})'
  return list(dict.fromkeys(f for f in files if re.fullmatch(pattern, f)))
