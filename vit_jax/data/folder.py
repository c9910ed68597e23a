"""Image folders: `root/<split>/<class>/**/<image>`, the image formats of `IMAGE_EXTENSIONS`.

Class names are the sorted sub-folder names of the train split's folder (Python's sort: by code point,
so upper case before lower case) and a label is the index of its class name. A class's images are the
files under its folder at any depth (as torchvision's ImageFolder). Hidden entries (a name starting
with '.': Jupyter's .ipynb_checkpoints, macOS's ._x.png) are not data, at any level. Paths go through
`tf.io.gfile`, so a root on GCS (gs://...) works like a local one.
"""
import concurrent.futures
import os
import re

from absl import logging
import numpy as np
import tensorflow as tf

from vit_jax.data import order
from vit_jax.data.as_written import as_written
from vit_jax.data import preprocess

# What `preprocess.decode` reads (each checked against a file PIL wrote: tests/test_data.py).
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')
# Images of formats torchvision's ImageFolder reads (through PIL) but TensorFlow cannot decode: a
# folder of them would lose those files without a word, so each such extension is warned of once.
UNREAD_EXTENSIONS = ('.tif', '.tiff', '.ppm', '.pgm', '.pbm', '.pnm', '.jp2', '.heic', '.avif', '.ico')
_warned_extensions: set[str] = set()


def _is_folder(path: str, entry: str) -> bool:
  """Whether `entry` of `path`'s listing is a folder."""
  if entry.endswith('/'):
    return True  # Cloud storage marks the folders of a listing so.
  if '://' in path and entry.lower().endswith(IMAGE_EXTENSIONS + UNREAD_EXTENSIONS):
    # Unmarked there is a file: asking would be a request per image (hours for ImageNet on GCS).
    return False
  # A stat on a local disk: 4 us an image (16,000 listed in 0.07 s instead of 0.013 s; 2-core VM).
  return tf.io.gfile.isdir(os.path.join(path, entry))


def _listing(path: str) -> tuple[list[str], list[str]]:
  """The sub-folders and the image files of `path`, each sorted, without hidden entries."""
  folders, images = [], []
  try:
    entries = tf.io.gfile.listdir(path)
  except UnicodeDecodeError as e:
    # tf.io.gfile decodes names as UTF-8 (a zip from Windows may hold Latin-1 or Shift-JIS names);
    # uncaught, the run would stop on the codec's message, which names neither file nor folder.
    raise ValueError(f'Image folder {path} holds a name that is not UTF-8: {e.object!r}; rename it '
                     '(e.g. `convmv -f latin1 -t utf8 --notest -r ROOT`)') from None
  for entry in entries:
    name = entry.rstrip('/')
    if name.startswith('.'):
      continue
    if _is_folder(path, entry):
      folders.append(name)
    elif name.lower().endswith(IMAGE_EXTENSIONS):
      images.append(name)
    elif name.lower().endswith(UNREAD_EXTENSIONS):
      _warn_unread(os.path.join(path, name))
  return sorted(folders), sorted(images)


def _warn_unread(path: str) -> None:
  extension = os.path.splitext(path)[1].lower()
  if extension not in _warned_extensions:
    _warned_extensions.add(extension)
    logging.warning('Image folders: %s files are not read (e.g. %s), only %s: convert them, e.g. to '
                    'PNG with PIL', extension, path, ', '.join(IMAGE_EXTENSIONS))


def _sub_folders(path: str) -> list[str]:
  return _listing(path)[0]


def _image_files(path: str) -> list[str]:
  """The images under `path` at any depth, relative to it: its own (sorted), then each sub-folder's."""
  folders, images = _listing(path)
  for sub in folders:
    images += [os.path.join(sub, name) for name in _image_files(os.path.join(path, sub))]
  return images


def _split_dir(root: str, split: str) -> str:
  path = os.path.join(root, split)
  if tf.io.gfile.isdir(path):
    return path
  if '[' in split or '+' in split:  # A tensorflow_datasets slice or union, as 'train[:90%]'.
    raise ValueError(f'Image folder splits are sub-folder names, not slices: {root} has no {split}/; '
                     f'make a folder of class folders (e.g. {root}/val/), then --config.eval_split=val')
  raise ValueError(f'Image folder {path} does not exist: config.data_dir must hold a {split}/ '
                   'sub-folder of class folders')


# The readability probe decodes this many files of a class, of this many classes of a split (each
# evenly spread over the sorted ones): at most 192 files, whatever the size of the split. 192 JPEGs of
# 375x500 on a local disk take 0.2 s (0.45 s the first time in a process) on a loaded 2-core VM; reads
# run _PROBE_THREADS at a time, so the latency of cloud storage is paid about 12 times, not 192.
_PROBE_PER_CLASS = 3
_PROBE_CLASSES = 64
_PROBE_THREADS = 16


def _spread(items: list, k: int) -> list:
  """`k` of `items`, evenly spread, in order (all of them if there are no more)."""
  n = len(items)
  return list(items) if n <= k else [items[i * n // k] for i in range(k)]


def _why_unreadable(path: str) -> str | None:
  """None if the file decodes as the pipeline decodes it, else why not, in one line."""
  try:
    data = tf.io.read_file(path)
    if data.numpy().startswith(b'version https://git-lfs'):
      return 'a git-lfs pointer, not the image'
    preprocess.decode(data)
    return None
  except tf.errors.OpError as e:
    # TensorFlow's message without its op's prefix {{function_node ...}} and suffix [Op:...].
    return re.sub(r'^\{\{.*?\}\}\s*|\s*\[Op:.*$', '', ' '.join(e.message.split()))


def _check_readable(split: str, split_dir: str, files: dict[str, list[str]], *, train: bool) -> None:
  """Raises a ValueError if none of a sample of the split's images decodes, or in the train split none
  of a class's: without it a folder of files that are not images (a git-lfs checkout without `git lfs
  pull`) would train on nothing, forever, each file skipped with a warning."""
  probed = {name: _spread(names, _PROBE_PER_CLASS)
            for name, names in _spread([(n, f) for n, f in files.items() if f], _PROBE_CLASSES)}
  paths = [os.path.join(split_dir, name, f) for name, names in probed.items() for f in names]
  with concurrent.futures.ThreadPoolExecutor(_PROBE_THREADS) as pool:
    reasons = dict(zip(paths, pool.map(_why_unreadable, paths)))
  fix = 'check that they are images (a git-lfs checkout needs `git lfs pull`)'
  if all(reasons.values()):
    raise ValueError(f'No image of split {split!r} decodes: none of {len(paths)} sampled, e.g. '
                     f'{paths[0]} ({reasons[paths[0]]}); {fix}')
  if not train:
    return  # An evaluation skips unreadable files; a class without images is no obstacle there.
  for name, names in probed.items():
    path = os.path.join(split_dir, name, names[0])
    if all(reasons[os.path.join(split_dir, name, f)] for f in names):
      raise ValueError(f'Class {name!r} has no readable train image: none of {len(names)} sampled '
                       f'decodes, e.g. {path} ({reasons[path]}); {fix}, or remove the class folder')


# Examples decoded by one dataset: a dataset per example would cost more than decoding it.
_CHUNK = 64


def _read_and_decode(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
  rest = {k: v for k, v in example.items() if k != 'record'}
  return {**rest, 'image': preprocess.decode(tf.io.read_file(example['record']))}


def _load_chunk(chunk: dict[str, tf.Tensor]) -> tf.data.Dataset:
  """The chunk's examples decoded, without those that cannot be (`ignore_errors` skips an element
  whose map raised, and only that one)."""
  return tf.data.Dataset.from_tensor_slices(chunk).map(as_written(_read_and_decode)).ignore_errors()


class FolderSource:
  """The images under `root`, split by sub-folder name."""

  def __init__(self, root: str, train_split: str):
    self._root = root
    self._train_split = train_split
    self._train_dir = train_dir = _split_dir(root, train_split)
    self.class_names = tuple(_sub_folders(train_dir))
    if not self.class_names:
      raise ValueError(f'Image folder {train_dir} has no class sub-folders: put the images of each '
                       f'class in {train_dir}/<class name>/')
    self._files = {}

  def _split_files(self, split: str) -> tuple[list[str], list[int]]:
    """All image paths of a split, sorted by class then name, with their labels. Listing a split
    checks that its images can be read (a sample of them: `_check_readable`)."""
    if split not in self._files:
      split_dir = _split_dir(self._root, split)
      labels = {name: label for label, name in enumerate(self.class_names)}
      files = {}
      for name in _sub_folders(split_dir):
        if name not in labels:
          raise ValueError(f'Class folder {os.path.join(split_dir, name)} has no counterpart in '
                           f'{self._train_dir}: every class needs a folder of train images')
        files[name] = _image_files(os.path.join(split_dir, name))
      if not any(files.values()):
        raise ValueError(f'No {"/".join(IMAGE_EXTENSIONS)} images in the class folders of {split_dir}')
      train = split == self._train_split
      empty = [name for name, names in files.items() if not names]
      if train and empty:  # A class without train images cannot be learned.
        raise ValueError(f'Class folders of {split_dir} without {"/".join(IMAGE_EXTENSIONS)} images: '
                         f'{", ".join(map(repr, empty[:5]))}{" ..." if len(empty) > 5 else ""}; '
                         'put images in each or remove it')
      _check_readable(split, split_dir, files, train=train)
      paths = [os.path.join(split_dir, name, f) for name, names in files.items() for f in names]
      path_labels = [labels[name] for name, names in files.items() for _ in names]
      self._files[split] = (paths, path_labels)
    return self._files[split]

  def examples(self, split: str, shard: int = 0, num_shards: int = 1) -> order.RandomAccess:
    """Shard `shard` of `num_shards` of `split` as {'record': path, 'label': int32}, by index.

    Striding (not contiguous blocks) keeps the classes balanced across shards. Unreadable files are
    only found (and skipped) when read.
    """
    paths, labels = self._split_files(split)
    paths = tf.constant(np.array(paths[shard::num_shards], dtype=object), tf.string)
    labels = tf.constant(labels[shard::num_shards], tf.int32)
    return order.RandomAccess(
        int(paths.shape[0]),
        lambda indices: {'record': tf.gather(paths, indices), 'label': tf.gather(labels, indices)})

  def load(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Reads and decodes each 'record' into 'image'; an unreadable file is dropped (the pipeline names
    it: unreadable.py). Chunks of examples decode in parallel, in order: a chunk yields all it has
    before the next one starts, whether or not it dropped one."""
    return ds.batch(_CHUNK).interleave(as_written(_load_chunk), cycle_length=tf.data.AUTOTUNE,
                                       block_length=_CHUNK, num_parallel_calls=tf.data.AUTOTUNE,
                                       deterministic=True)
