"""The runs under workdirs, read for comparing them (tools/report.py, tools/vtab.py): each run's
flat config and every scalar its TensorBoard event files hold."""

import dataclasses
import json
import os
from typing import Any, Sequence

from etils import epath

from vit_jax.runtime import paths, workdir_files
from vit_jax.train.events import EVENTS, read_scalars

# What the training loop logs about itself (vit_jax/train/loop.py and pace.py); every other
# scalar comes from an evaluator, e.g. eval_top1, eval_polyak_loss, fewshot_5shot, minival_top1.
TRAIN_TAGS = (
    'train_loss',
    'learning_rate',
    'grad_norm',
    'images_per_sec',
    'steps_per_sec',
    'uptime',
    'input_wait',
    'skipped_steps',
)


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  config: dict[str, Any]  # Flat, dotted field names; {} when the workdir holds no config.json.
  scalars: dict[str, dict[int, float]]  # tag -> step -> value.


def _is_export(path: epath.Path) -> bool:
  return (path / workdir_files.EXPORT).exists()


def _is_run(path: epath.Path) -> bool:
  if _is_export(path):  # Its config.json is the export's description.
    return False
  return (path / 'config.json').exists() or any(path.glob(EVENTS))


def find_runs(workdirs: Sequence[str]) -> list[tuple[str, epath.Path]]:
  """(name, path) of the run each of `workdirs` is or holds, or a one-line ValueError."""
  found = []
  for workdir in workdirs:
    root = epath.Path(paths.absolute(workdir))
    if not root.is_dir():
      problem = 'is not a directory' if root.exists() else 'does not exist'
      raise ValueError(f'{workdir!r} {problem}: pass run workdirs or the root of a sweep')
    if _is_export(root):  # Its timm/ (a config.json of its own) would pass for a run.
      raise ValueError(
          f'{workdir!r} holds an export, not a run: pass the workdir it was exported from'
      )
    if _is_run(root):
      found.append((root.name, root))
      continue
    under, stack = [], [root]
    while stack:  # A run's own subdirectories (checkpoints/) are never entered, nor an export's.
      for child in (p for p in stack.pop().iterdir() if p.is_dir()):
        if (child / workdir_files.SOUP).exists():  # A soup of the runs beside it is no run.
          continue
        if _is_run(child):
          under.append(child)
        elif not _is_export(child):  # Its timm/ and peft/ hold config.json files of their own.
          stack.append(child)
    if not under:
      raise ValueError(
          f'{workdir!r} holds no run: neither it nor any directory under it has a '
          f'config.json or {EVENTS} files'
      )
    found.extend(sorted((os.path.relpath(str(run), str(root)), run) for run in under))
  names = [name for name, _ in found]
  if len(set(names)) < len(names):  # Runs of different sweeps named alike: their full paths.
    found = [(str(path), path) for _, path in found]
  return found


def _flat(tree: dict[str, Any], prefix: str = '') -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    flat.update(
        _flat(value, f'{prefix}{key}.') if isinstance(value, dict) else {f'{prefix}{key}': value}
    )
  return flat


def load_run(name: str, path: epath.Path) -> Run:
  """A run's scalars and config; a resumed run's latest config.resume_<k>.json is what it runs now."""
  configs = sorted(path.glob('config.resume_*.json'), key=lambda p: int(p.stem.split('_')[-1]))
  configs = configs or [path / 'config.json']
  config, why = {}, ''
  if configs[-1].exists():
    try:
      config = json.loads(configs[-1].read_text())
    except json.JSONDecodeError as e:
      config, why = None, f': {e}'
    if not isinstance(config, dict):
      raise ValueError(
          f'{configs[-1]} is not the config a vit_jax run writes (a JSON object of its fields'
          f'{why}): pass the workdirs of runs'
      )
  return Run(name, _flat(config), read_scalars(str(path)))


def eval_metrics(runs: Sequence[Run]) -> list[str]:
  return sorted({tag for run in runs for tag in run.scalars} - set(TRAIN_TAGS))
