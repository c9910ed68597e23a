"""The rows of a Hugging Face image folder (`datasets`' imagefolder format: a repository of image
files), as `datasets.load_dataset` reads it (its folder_based_builder):

- with metadata files (`metadata.csv`, `.jsonl` or `.parquet`, beside the images): a row of a
  split's metadata files is an example; its `file_name` column names the image (relative to the
  metadata file's folder; `<column>_file_name` names column <column>'s), the other columns are its
  features (a label: integers or strings, or the README's ClassLabel; a list of them, in `.jsonl`
  and `.parquet` files, a set of classes an example);
- without: each image file is an example, labelled by the name of its folder (a ClassLabel of the
  folders' sorted names) where the images lie at one depth in more than one folder.
"""

import os
from typing import Any

import numpy as np

from vit_jax.data import folder
from vit_jax.data import hf_features
from vit_jax.data import hf_layout
from vit_jax.data import images
from vit_jax.data import label_sets
from vit_jax.data import packed_strings
from vit_jax.data import readable

_PROBED = 16  # Images of a split decoded before the run: a git-lfs checkout's pointers fail here.


def column_kinds(layout: hf_layout.Layout) -> dict[str, str]:
  """Each column's kind (hf_features.feature_kind)."""
  return {name: hf_features.feature_kind(feature) for name, feature in layout.features.items()}


def _inside(metadata: str, name: Any) -> str:
  """The path of the image that a metadata file names, which must lie under its folder."""
  relative = os.path.normpath(str(name)).replace('\\', '/')
  if '://' in str(name) or os.path.isabs(relative) or relative.split('/')[0] == '..':
    raise ValueError(
        f'{metadata} names image {name!r}, which is not a path inside its folder: name each image '
        'relative to the metadata file'
    )
  return os.path.join(os.path.dirname(metadata), relative)


class Rows:
  """The examples of every split: their labels, and each one's image bytes."""

  def __init__(self, layout: hf_layout.Layout, image_column: str, label_column: str):
    feature = layout.features.get(label_column, {})
    self._sets = hf_features.feature_kind(feature).endswith(hf_features.SET)
    element = hf_features.element_feature(feature) or feature
    names = element.get('names') if element.get('_type') == 'ClassLabel' else None
    classes = None if names is None else {name: k for k, name in enumerate(names)}
    self._root = layout.root
    self._label_column = label_column
    # Split -> its image paths; its labels (where every example has one); its examples without one.
    self._files, self._labels, self._unlabelled = {}, {}, {}
    for split, files in layout.splits.items():
      listed = [f for f in files if hf_layout.is_metadata(f)]
      if listed:
        paths, values = self._listed(listed, image_column, label_column)
      else:
        paths = files
        values = [os.path.basename(os.path.dirname(f)) for f in files]
      self._files[split] = packed_strings.PackedStrings(paths)
      where = f'split {split!r} of dataset {layout.root}'
      if self._sets:  # A missing list is no label; an empty one, an empty set.
        labels = [None if v is None else [_label(x, classes, where) for x in v] for v in values]
      else:
        labels = [_label(v, classes, where) for v in values]
      self._unlabelled[split] = sum(label is None for label in labels)
      if self._unlabelled[split]:
        self._labels[split] = None
      elif self._sets:
        self._labels[split] = label_sets.from_lengths(
            np.array([len(v) for v in labels], np.int64),
            np.array([x for v in labels for x in v]),
        )
      else:
        self._labels[split] = np.array(labels)
      readable.probe(split, readable.spread(self._files[split], _PROBED), folder.read_file)
    self.sizes = {split: len(files) for split, files in self._files.items()}

  @staticmethod
  def _listed(
      metadata: list[str], image_column: str, label_column: str
  ) -> tuple[list[str], list[Any]]:
    """The images and label values of a split's metadata files, row by row (datasets reads a
    column's image from `file_name`, else from `<column>_file_name`)."""
    paths, labels = [], []
    for path in metadata:
      table = hf_layout.metadata_table(path)
      columns = (hf_layout.FILE_NAME, f'{image_column}_{hf_layout.FILE_NAME}')
      named = [n for n in columns if n in table.column_names]
      if not named:
        raise ValueError(
            f'{path} has no column naming the images of column {image_column!r} ({columns}): add '
            'one'
        )
      images_named = table.column(named[0]).to_pylist()
      paths += [_inside(path, name) for name in images_named]
      if label_column in table.column_names:
        labels += table.column(label_column).to_pylist()
      else:
        labels += [None] * table.num_rows
    return paths, labels

  def labels(self, split: str) -> np.ndarray | label_sets.LabelSets:
    """The label of every example of `split`, as written (integers or strings), or of a list
    column, each example's list."""
    if self._unlabelled[split]:
      raise hf_features.unlabelled(self._root, split, self._unlabelled[split], self._label_column)
    return self._labels[split]

  def describe(self, split: str, row: int) -> str:
    return self._files[split][row]

  def image(self, split: str, row: int) -> bytes:
    """The encoded image of example `row` of `split`; `images.UnreadableImage` where it cannot be
    read."""
    try:
      return folder.read_file(self._files[split][row])
    except OSError as e:
      raise images.UnreadableImage(e.strerror or str(e)) from None


def _label(value: Any, classes: dict[str, int] | None, where: str) -> int | str | None:
  """A label as written (a number or a name), or its class's number where a ClassLabel names the
  `classes` (datasets' ClassLabel.str2int)."""
  if value is None or classes is None or not isinstance(value, str):
    return value
  if value not in classes:
    raise ValueError(
        f"{where}: label {value!r} is not one of its ClassLabel's names: add it to the README's "
        'class_label names'
    )
  return classes[value]
