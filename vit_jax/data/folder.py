"""Image folders: `root/<split>/<class>/*.{jpg,jpeg,png}`.

Class names are the sorted sub-folder names of the train split's folder and a label is the index of its
class name. Paths go through `tf.io.gfile`, so a root on GCS (gs://...) works like a local one.
"""
import os

from absl import logging
import numpy as np
import tensorflow as tf

from vit_jax.data import order
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


def _warn_unreadable(path: tf.Tensor) -> bool:
  logging.warning('Skipping unreadable image file %s', path.numpy().decode())
  return False


def _is_readable(image: tf.Tensor, path: tf.Tensor) -> tf.Tensor:
  """True for a decoded image; False, with a logged warning naming the file, for the empty stand-in."""
  return tf.cond(tf.size(image) > 0,
                 lambda: tf.constant(True),
                 lambda: tf.reshape(tf.py_function(_warn_unreadable, [path], tf.bool), []))


def _read_and_decode(path: tf.Tensor) -> tf.Tensor:
  return preprocess.decode(tf.io.read_file(path))


def _load_or_skip(example: dict[str, tf.Tensor]) -> tf.data.Dataset:
  """A dataset of the example with 'record' (a path) replaced by its decoded 'image', or no example.

  Decoding inside a one-element dataset lets `ignore_errors` turn a corrupt file into an empty
  dataset instead of an error that ends the run, and still know which file it was.
  """
  path = example['record']
  rest = {k: v for k, v in example.items() if k != 'record'}
  decoded = tf.data.Dataset.from_tensors(path).map(_read_and_decode).ignore_errors()
  unreadable = tf.data.Dataset.from_tensors(tf.zeros([0, 0, 3], tf.uint8))
  image = decoded.concatenate(unreadable).take(1).filter(lambda image: _is_readable(image, path))
  return image.map(lambda image: {**rest, 'image': image})


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
    """Reads and decodes each 'record' into 'image'; unreadable files are skipped with a warning."""
    return ds.interleave(_load_or_skip, cycle_length=tf.data.AUTOTUNE,
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
