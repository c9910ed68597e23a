"""A kept head's classes in the dataset's order (config.keep_head). A classifier checkpoint names its
classes (transformers' config.json `id2label`, timm's `label_names` there or in `pretrained_cfg`, a vit_jax run's
dataset), and a dataset may hold the same classes in another order (an image folder's are its folder
names, sorted): logit i would be read as the dataset's class i, another class. Where the names are
the same set, the head's outputs are permuted to the dataset's order; where they are not, a warning
says so (a dataset of other names, e.g. WordNet ids for ImageNet's words, is read in the head's
order, as before).
"""

import re
from typing import Any, Optional, Sequence

from absl import logging
import numpy as np

from vit_jax.checkpoints import run_dir, saved_state, torch_files

_HEADS = ('head', 'head_dist')  # The classifiers whose outputs are the classes (DeiT's two).
_UNNAMED = re.compile(r'LABEL_\d+')  # transformers' names of a config that names no class.


def checkpoint_classes(path: str) -> Optional[list[str]]:
  """The class names of the checkpoint at `path` (a local path), in its head's order; None where it
  names none."""
  if torch_files.is_state_dict_path(path):
    config = torch_files.beside(path, 'config.json')
    names = _listed(config.get('id2label'))
    if names and all(_UNNAMED.fullmatch(str(n)) for n in names):
      names = None
    # timm's: save_for_hf writes label_names beside pretrained_cfg (timm reads it from there);
    # vit_jax's export, inside it.
    return (
        names
        or _listed(config.get('label_names'))
        or _listed(config.get('pretrained_cfg', {}).get('label_names'))
    )
  workdir = saved_state.workdir_of(path) if saved_state.is_step_dir(path) else path
  if run_dir.is_workdir(workdir):
    try:
      return list(run_dir.load_run_info(workdir)[1].class_names) or None
    except ValueError:  # A soup, or files of an older vit_jax: no names to go by.
      return None
  return None


def _listed(names: Any) -> Optional[list[str]]:
  """Class names given as a list, or as a dict by index ({'0': 'cat'}: transformers' id2label,
  timm's label_names either way); None where there are none."""
  if isinstance(names, dict):
    try:
      return [names[k] for k in sorted(names, key=int)] or None
    except ValueError:  # Keys that are no indices.
      return None
  return list(names) if isinstance(names, (list, tuple)) and names else None


def aligned(
    params: dict[str, Any],
    checkpoint: Optional[Sequence[str]],
    dataset: Sequence[str],
    field: str = 'config.keep_head',
) -> dict[str, Any]:
  """`params` with its heads' outputs in the order of the `dataset`'s class names, where the
  `checkpoint`'s head names the same classes in another order; `field`: what kept the head, for
  the log (config.keep_head, config.distill.teacher)."""
  names = [str(name) for name in checkpoint or ()]
  if not names or names == list(dataset):
    return params
  if sorted(names) != sorted(dataset) or len(set(dataset)) != len(dataset):
    shared = set(names) & set(dataset)
    logging.warning(
        '%s: the checkpoint names %d classes (e.g. %s), the dataset %d (e.g. %s), %d '
        "of them the same: the head's output i is read as the dataset's class i",
        field,
        len(names),
        ', '.join(map(repr, names[:3])),
        len(dataset),
        ', '.join(map(repr, list(dataset)[:3])),
        len(shared),
    )
    return params
  order = [names.index(name) for name in dataset]
  permuted = dict(params)
  for head in _HEADS:
    if head in params:
      permuted[head] = {  # A kernel's and a bias's last axis: the classes.
          name: np.asarray(value)[..., order] if name in ('kernel', 'bias') else value
          for name, value in params[head].items()
      }
  logging.info(
      "%s: the checkpoint's head reordered to the dataset's classes (its own order: %s)",
      field,
      ', '.join(map(repr, names[:10])) + (', ...' if len(names) > 10 else ''),
  )
  return permuted


def _some(names: Sequence[str], shown: int = 3) -> str:
  """The first `shown` names, quoted, and how many more."""
  quoted = ', '.join(repr(name) for name in names[:shown])
  return quoted + (f' and {len(names) - shown} more' if len(names) > shown else '')


def class_changes(old: Sequence[str], new: Sequence[str]) -> str:
  """How the class names of a run (`old`) and of a dataset (`new`) differ, for a one-line error: the
  classes gone and new (a few of each, with their count), or the first label whose class moved."""
  old_set, new_set = set(old), set(new)  # Once: ImageNet-21k has 21,843 classes.
  gone = [name for name in old if name not in new_set]
  added = [name for name in new if name not in old_set]
  if not gone and not added:
    label = next(i for i, (was, now) in enumerate(zip(old, new)) if was != now)
    return f'the same classes in another order: label {label} is {new[label]!r}, was {old[label]!r}'
  counted = lambda names, what: f'{len(names)} {"class" if len(names) == 1 else "classes"} {what}'
  parts = [f'{counted(gone, "gone")} ({_some(gone)})'] if gone else []
  parts += [f'{counted(added, "new")} ({_some(added)})'] if added else []
  return ', '.join(parts)
