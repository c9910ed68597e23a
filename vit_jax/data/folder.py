"""Image folders: `root/<split>/<class>/**/<image>`, the image formats of `images.IMAGE_EXTENSIONS`.

Class names are the sorted sub-folder names of the train split's folder (Python's sort: by code point,
so upper case before lower case) and a label is the index of its class name. A class's images are the
files under its folder at any depth (as torchvision's ImageFolder). Hidden entries (a name starting
with '.': Jupyter's .ipynb_checkpoints, macOS's ._x.png) are not data, at any level. A root on cloud
storage (gs://...) is read through `etils.epath`, a local one through `os`; a zip archive is read as
the folder it holds (`pets.zip`, or `pets.zip/pets` for a folder in it), unextracted
(zip_members.py).
"""

import concurrent.futures
import os
from typing import Sequence

from absl import logging
from etils import epath
import numpy as np

from vit_jax.data import images as data_images
from vit_jax.data import order
from vit_jax.data import packed_strings
from vit_jax.data import readable
from vit_jax.data import zip_members
from vit_jax.runtime import paths

# Files that are images but that PIL cannot read here: a folder of them would lose those files
# without a word, so each such extension is warned of once.
UNREAD_EXTENSIONS = tuple(
    e
    for e in ('.heic', '.heif', '.avif', '.jxl', '.svg', '.raw', '.cr2', '.nef', '.dng')
    if e not in data_images.IMAGE_EXTENSIONS
)
_warned_extensions: set[str] = set()


def _listing(path: str) -> tuple[list[str], list[str]]:
  """The sub-folders and the image files of `path`, each sorted, without hidden entries."""
  folders, images = [], []
  try:
    if archived := zip_members.in_archive(path):
      archive, inside = archived
      sub_folders, files = zip_members.folders(archive).get(inside, ((), ()))
      entries = [(name, True) for name in sub_folders] + [(name, False) for name in files]
    elif paths.is_url(path):
      # A listing on cloud storage says nothing of what an entry is, and asking costs a request an
      # image (hours for ImageNet on GCS): a name with an image's extension is taken for a file.
      entries = [
          (
              p.name,
              not p.name.lower().endswith(data_images.IMAGE_EXTENSIONS + UNREAD_EXTENSIONS)
              and p.is_dir(),
          )
          for p in epath.Path(path).iterdir()
      ]
    else:
      with os.scandir(path) as scan:
        # Python gives a name that is not UTF-8 surrogates for its bytes: encoding it fails.
        entries = [(e.name.encode().decode(), e.is_dir()) for e in scan]
  except UnicodeEncodeError as e:
    raise ValueError(
        f'Image folder {path} holds a name that is not UTF-8: '
        f'{os.fsencode(e.object)!r}; rename it (e.g. `convmv -f latin1 -t utf8 --notest '
        '-r ROOT`)'
    ) from None
  except UnicodeDecodeError as e:
    # A zip from Windows may hold Latin-1 or Shift-JIS names; uncaught, the run would stop on the
    # codec's message, which names neither file nor folder.
    raise ValueError(
        f'Image folder {path} holds a name that is not UTF-8: {e.object!r}; rename it '
        '(e.g. `convmv -f latin1 -t utf8 --notest -r ROOT`)'
    ) from None
  except OSError as e:  # A folder this user may not read, a broken mount.
    raise ValueError(f'Image folder {path} cannot be listed: {e.strerror or e}') from None
  for name, is_dir in entries:
    if name.startswith('.'):
      continue
    if is_dir:
      folders.append(name)
    elif name.lower().endswith(data_images.IMAGE_EXTENSIONS):
      images.append(name)
    elif name.lower().endswith(UNREAD_EXTENSIONS):
      _warn_unread(os.path.join(path, name))
  return sorted(folders), sorted(images)


def _warn_unread(path: str) -> None:
  extension = os.path.splitext(path)[1].lower()
  if extension not in _warned_extensions:
    _warned_extensions.add(extension)
    logging.warning(
        'Image folders: %s files are not read (e.g. %s), only %s: convert them, e.g. to ' 'PNG',
        extension,
        path,
        ', '.join(data_images.IMAGE_EXTENSIONS),
    )


def _sub_folders(path: str) -> list[str]:
  return _listing(path)[0]


def image_files(path: str) -> list[str]:
  """The images under `path` at any depth, relative to it: its own (sorted), then each sub-folder's."""
  folders, images = _listing(path)
  local = not paths.is_url(path) and not zip_members.in_archive(path)
  for sub in folders:
    sub_path = os.path.join(path, sub)
    # A symbolic link to a folder that holds this one (itself included) would be listed without end.
    if local and _holds(os.path.realpath(sub_path), os.path.realpath(path)):
      raise ValueError(
          f'Image folder {sub_path} is a symbolic link to {os.path.realpath(sub_path)}, which '
          'holds it: its images would be listed without end; remove the link'
      )
    images += [os.path.join(sub, name) for name in image_files(sub_path)]
  return images


def _holds(folder: str, path: str) -> bool:
  return os.path.commonpath([folder, path]) == folder


def _is_dir(path: str) -> bool:
  if archived := zip_members.in_archive(path):
    archive, inside = archived
    return inside in zip_members.folders(archive)
  return epath.Path(path).is_dir() if paths.is_url(path) else os.path.isdir(path)


def read_file(path: str) -> bytes:
  """A file's bytes, from local disk, cloud storage (gs://...) or a zip archive read as a folder;
  raises OSError (data_images.UnreadableImage for a file of an archive)."""
  if archived := zip_members.in_archive(path):
    return zip_members.read(*archived)
  if paths.is_url(path):
    return epath.Path(path).read_bytes()
  with open(path, 'rb') as f:
    return f.read()


def _split_dir(root: str, split: str, train_split: str = 'train') -> str:
  path = os.path.join(root, split)
  if _is_dir(path):
    return path
  if '[' in split or '+' in split:  # A tensorflow_datasets slice or union, as 'train[:90%]'.
    raise ValueError(
        f'Image folder splits are sub-folder names, not slices: {root} has no {split}/; '
        f'make a folder of class folders (e.g. {root}/val/), then --config.eval_split=val'
    )
  archived = zip_members.in_archive(root)
  if archived and not archived[1]:  # The archive of a folder: its sub-folders one level down.
    tops = [t for t in _sub_folders(root) if not zip_members.hidden(t)]  # Not macOS's __MACOSX/.
    if tops:
      raise ValueError(
          f'Zip archive {root} has no {split}/ folder at its top, which holds {tops[:3]}: set '
          f'config.data_dir={os.path.join(root, tops[0])} (a folder in the archive)'
      )
  if not _is_dir(root):
    what = 'is a file' if os.path.isfile(root) else 'does not exist'
    raise ValueError(f'config.data_dir={root} {what}: set it to a folder of split folders')
  present = [name for name in _sub_folders(root) if name != split]
  if present and all(_listing(os.path.join(root, name))[1] for name in present[:3]):
    raise ValueError(
        f'Image folder {path} does not exist, and the sub-folders of {root} hold images '
        f"({present[:3]}): they are one split's class folders; set config.data_dir to the folder "
        f"that holds {split}/ and the other splits' folders"
    )
  if present:
    if split == train_split:
      field, others = 'train_split', [name for name in present if 'train' in name.lower()]
    else:
      field, others = 'eval_split', [name for name in present if name != train_split]
    others = others or present
    raise ValueError(
        f'Image folder {path} does not exist; {root} holds {present[:5]}: name one with '
        f'--config.{field}={others[0]} (a split is a sub-folder of class folders)'
    )
  raise ValueError(
      f'Image folder {path} does not exist: config.data_dir must hold a {split}/ '
      'sub-folder of class folders'
  )


# Class folders listed at once: on cloud storage each is a request or more, and ImageNet's 1000
# one by one would wait on a thousand round trips at every start.
_LISTING_THREADS = 16


class FolderSource:
  """The images under `root`, split by sub-folder name (sources.Source): records are
  (path, label) pairs."""

  def __init__(self, root: str, train_split: str):
    self._root = root
    self._train_split = train_split
    self._train_dir = train_dir = _split_dir(root, train_split, train_split)
    self.class_names = tuple(_sub_folders(train_dir))
    if not self.class_names:
      raise ValueError(
          f'Image folder {train_dir} has no class sub-folders: put the images of each '
          f'class in {train_dir}/<class name>/'
      )
    self._files = {}

  def split_files(self, split: str) -> tuple[packed_strings.PackedStrings, np.ndarray]:
    """All image paths of a split, sorted by class then name, and their int32 labels. Listing a split
    checks that its images can be read (a sample of them: readable.check_classes). Its class folders are
    listed _LISTING_THREADS at a time: on cloud storage, a request or more each."""
    if split not in self._files:
      split_dir = _split_dir(self._root, split, self._train_split)
      labels = {name: label for label, name in enumerate(self.class_names)}
      class_folders = _sub_folders(split_dir)
      for name in class_folders:
        if name not in labels:
          raise ValueError(
              f'Class folder {os.path.join(split_dir, name)} has no counterpart in '
              f'{self._train_dir}: every class needs a folder of train images'
          )
      with concurrent.futures.ThreadPoolExecutor(_LISTING_THREADS) as pool:
        listings = pool.map(lambda name: image_files(os.path.join(split_dir, name)), class_folders)
        files = dict(zip(class_folders, listings))
      if not any(files.values()):
        raise ValueError(
            f'No {"/".join(data_images.IMAGE_EXTENSIONS)} images in the class folders of '
            f'{split_dir}'
        )
      train = split == self._train_split
      empty = [name for name, names in files.items() if not names]
      if train and empty:  # A class without train images cannot be learned.
        raise ValueError(
            f'Class folders of {split_dir} without images: '
            f'{", ".join(map(repr, empty[:5]))}{" ..." if len(empty) > 5 else ""}; '
            'put images in each or remove it'
        )
      readable.check_classes(split, split_dir, files, read_file, train=train)
      listed = [os.path.join(split_dir, name, f) for name, names in files.items() for f in names]
      path_labels = [labels[name] for name, names in files.items() for _ in names]
      self._files[split] = (packed_strings.PackedStrings(listed), np.array(path_labels, np.int32))
    return self._files[split]

  def examples(
      self, split: str, shard: int = 0, num_shards: int = 1, with_shards: Sequence[int] = ()
  ) -> order.Records:
    """Shard `shard` of `num_shards` of `split` as (path, label) records, by index.

    Striding (not contiguous blocks) keeps the classes balanced across shards. Unreadable files are
    only found when read."""
    del with_shards  # Each file is read where it is.
    files, labels = self.split_files(split)
    return order.Records(
        len(files[shard::num_shards]),
        _StridedFiles(files[shard::num_shards], labels[shard::num_shards]),
    )

  def load(self, record: tuple[str, int]) -> dict[str, np.ndarray]:
    """The image file of `record`, and its label; `images.UnreadableImage` if it cannot be read."""
    path, label = record
    try:
      data = read_file(path)
    except OSError as e:
      raise data_images.UnreadableImage(e.strerror or str(e)) from None
    return {'image': data_images.Encoded(data), 'label': np.int32(label)}

  def describe(self, record: tuple[str, int]) -> str:
    return record[0]


class _StridedFiles:
  """Record k of a shard: (path, label). A class, not a closure, so that it pickles by value."""

  def __init__(self, files: packed_strings.PackedStrings, labels: np.ndarray):
    self._paths = files
    self._labels = labels

  def __call__(self, k: int) -> tuple[str, int]:
    return self._paths[k], int(self._labels[k])
