"""Image folders: `root/<split>/<class>/*.{jpg,jpeg,png}`.

Class names are the sorted sub-folder names of the train split's folder and a label is the index of its
class name. Paths go through `tf.io.gfile`, so a root on GCS (gs://...) works like a local one.
"""
import os

import numpy as np
import tensorflow as tf

from vit_jax.data import order
from vit_jax.data.as_written import as_written
from vit_jax.data import preprocess

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')


def _sub_folders(path: str) -> list[str]:
  return sorted(name.rstrip('/') for name in tf.io.gfile.listdir(path)
                if tf.io.gfile.isdir(os.path.join(path, name)))


def _image_files(path: str) -> list[str]:
  return sorted(name for name in tf.io.gfile.listdir(path)
                if name.lower().endswith(IMAGE_EXTENSIONS))


def _check_folder(path: str, what: str) -> None:
  if not tf.io.gfile.isdir(path):
    raise ValueError(f'Image folder {path} does not exist: config.data_dir must hold {what}')


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
    self._train_dir = train_dir = os.path.join(root, train_split)
    _check_folder(train_dir, f'a {train_split}/ sub-folder of class folders')
    self.class_names = tuple(_sub_folders(train_dir))
    if not self.class_names:
      raise ValueError(f'Image folder {train_dir} has no class sub-folders: put the images of each '
                       f'class in {train_dir}/<class name>/')
    self._files = {}

  def _split_files(self, split: str) -> tuple[list[str], list[int]]:
    """All image paths of a split, sorted by class then name, with their labels."""
    if split not in self._files:
      split_dir = os.path.join(self._root, split)
      _check_folder(split_dir, f'a {split}/ sub-folder of class folders')
      labels = {name: label for label, name in enumerate(self.class_names)}
      paths, path_labels = [], []
      for name in _sub_folders(split_dir):
        if name not in labels:
          raise ValueError(f'Class folder {os.path.join(split_dir, name)} has no counterpart in '
                           f'{self._train_dir}: every class needs a folder of train images')
        class_dir = os.path.join(split_dir, name)
        files = _image_files(class_dir)
        paths += [os.path.join(class_dir, f) for f in files]
        path_labels += [labels[name]] * len(files)
      if not paths:
        raise ValueError(f'No {"/".join(IMAGE_EXTENSIONS)} images in the class folders of {split_dir}')
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
