"""What a column of a Hugging Face dataset is to a source, by `datasets`' feature JSON (a Parquet or
Arrow schema's, a save_to_disk split's, a README's as hf_card.py reads it): an image, a label, or a
list of labels an example (a set of classes: multi-label)."""

import re
from typing import Any

# Label kinds: one class an example; their '_set' kinds, a list of them an example (multi-label).
LABEL_KINDS = ('class_label', 'integer', 'string')
SET = '_set'


def element_feature(feature: Any) -> Any:
  """The feature of each element of a list feature (datasets' List, or Sequence, or a JSON list of
  one feature as older datasets write it); None for another feature."""
  if isinstance(feature, list) and len(feature) == 1:
    return feature[0]
  if isinstance(feature, dict) and feature.get('_type') in ('List', 'LargeList', 'Sequence'):
    return feature.get('feature')
  return None


def is_list(arrow_type) -> bool:
  """Whether a column of this pyarrow type holds a list a row (datasets' List, Sequence, a Sequence
  of a fixed length)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top  # Only these datasets need it.

  return any(
      test(arrow_type)
      for test in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list)
  )


def feature_kind(feature: Any) -> str:
  """What a column of datasets' feature JSON is to a source: 'image', a label kind (LABEL_KINDS), a
  list of labels (a label kind + SET), or '' (none of these)."""
  element = element_feature(feature)
  if element is not None:
    kind = feature_kind(element)
    return kind + SET if kind in LABEL_KINDS else ''
  if not isinstance(feature, dict):
    return ''
  kind, dtype = feature.get('_type'), feature.get('dtype', '')
  if kind == 'Image':
    return 'image'
  if kind == 'ClassLabel':
    return 'class_label'
  if kind == 'Value' and re.fullmatch(r'u?int\d+', dtype):
    return 'integer'
  return 'string' if kind == 'Value' and dtype in ('string', 'large_string') else ''


def unlabelled(root: str, split: str, missing: int, label_column: str) -> ValueError:
  """The one-line error for a split with `missing` examples without a label."""
  return ValueError(
      f'Split {split!r} of dataset {root} has {missing} examples without a {label_column!r}: use '
      'a labelled split'
  )
