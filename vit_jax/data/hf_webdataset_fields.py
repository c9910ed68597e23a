"""What the files of a WebDataset sample hold, as `datasets`' webdataset builder decodes them: a
column's kind by its extension (`field_kind`), the keys of its JSON file (`json_key_kinds`), a label
file's value (`label`: a class number, a name, or a JSON file's key `json.KEY`: one of them, or a
list of them, a set of classes)."""

import json
import re
from typing import Any

from vit_jax.data import hf_features
from vit_jax.data import images

# The columns `datasets` decodes to integers and to text; the image files PIL reads.
INTEGER_FIELDS = ('cls', 'cls2', 'index', 'inx', 'id')
_TEXT_FIELDS = ('txt', 'text', 'transcript')
_IMAGE_FIELDS = tuple(e[1:] for e in images.IMAGE_EXTENSIONS)
# A label inside a sample's `json` file: column `json.KEY`, a key of its object (a number or a name).
_JSON_KEY = re.compile(r'^(json)[.]([^.]+)$')


def field_kind(field: str) -> str:
  """'image', 'integer', 'string', or '' for a column no run reads: the kind `datasets` gives the
  files of a sample's column `field` (their extension)."""
  extension = field.rsplit('.', 1)[-1].lower()
  if extension in _IMAGE_FIELDS:
    return 'image'
  if extension in INTEGER_FIELDS:
    return 'integer'
  return 'string' if extension in _TEXT_FIELDS else ''


def _kind(value: Any) -> str:
  """'integer', 'string', a list of them ('integer_set', 'string_set'), or ''."""
  if isinstance(value, list):
    kinds = {_kind(v) for v in value}
    return (
        kinds.pop() + hf_features.SET if len(kinds) == 1 and kinds <= {'integer', 'string'} else ''
    )
  return 'integer' if type(value) is int else 'string' if isinstance(value, str) else ''


def json_key_kinds(samples: list[bytes]) -> dict[str, str]:
  """`json.KEY`: the kind (`_kind`) of each key of the samples' JSON objects, the first sample's
  that tells (an empty list does not)."""
  kinds = {}
  for data in samples:
    try:
      value = json.loads(data)
    except ValueError:
      continue
    for key, v in value.items() if isinstance(value, dict) else ():
      if not kinds.get(f'json.{key}'):
        kinds[f'json.{key}'] = _kind(v)
  return kinds


def file_and_key(label_column: str) -> tuple[str, str | None]:
  """The file a label column reads, and the key of its JSON object that holds the label, if any."""
  match = _JSON_KEY.match(label_column)
  return match.groups() if match else (label_column, None)


def _json_label(data: bytes, column: str, key: str, where: str, sets: bool) -> Any:
  """The label at `key` (of label `column`) of a JSON file, or where `sets`, the list of them there
  (None where the object has no such key)."""
  try:
    value = json.loads(data)
  except ValueError as e:
    raise ValueError(f'{where}: its {column!r} file is not JSON ({e}): write it again') from None
  value = value.get(key) if isinstance(value, dict) else None
  labels = value if sets and isinstance(value, list) else [value]
  if value is not None and (
      isinstance(value, list) != sets
      or any(type(v) is not int and not isinstance(v, str) for v in labels)
  ):
    raise ValueError(
        f'{where}: its {column!r} is {value!r}, not a '
        f'{"list of class numbers or names" if sets else "class number or name"}: set '
        '--config.label_feature to a key of class numbers or names, or of lists of them'
    )
  return value


def label(
    data: bytes, field: str, classes: dict[str, int] | None, where: str, sets: bool = False
) -> Any:
  """A label file's value as datasets decodes it (a class name as its number where the README
  names the `classes`); a JSON file's at the column's key (where `sets`, a list of labels)."""
  _, key = file_and_key(field)
  if key is not None:
    return _json_label(data, field, key, where, sets)
  if field.rsplit('.', 1)[-1].lower() in INTEGER_FIELDS:
    try:
      return int(data)
    except ValueError:
      raise ValueError(
          f'{where}: its {field!r} is {data[:20]!r}, not a class number: set '
          '--config.label_feature to a column of class numbers or names'
      ) from None
  text = data.decode('utf-8', errors='replace')
  if classes is None:
    return text
  if text not in classes:
    raise ValueError(f'{where}: its {field!r} {text!r} is not one of the classes the README names')
  return classes[text]
