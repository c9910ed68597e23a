"""Weights & Biases (`config.wandb`): the run's scalars and config logged to a W&B project beside the
event files, by the process that writes them. W&B is optional (`pip install "wandb==0.31.0"`); its own
environment variables (WANDB_MODE=offline, WANDB_DIR, WANDB_API_KEY, ...) apply.

A run started again in its workdir (resumed, requeued) logs to the same W&B run: its id is kept in
WORKDIR/wandb_run.json. W&B keeps one value a step and refuses, with a warning, a step below the last
one it holds: a resumed run's steps up to the last one logged before it stopped (from its last
checkpoint, computed again to the same values; the timings aside) are left as they were logged and
not sent again.

A run of a sweep (its workdir listed in the sweep.json that launch/sweep.py writes in the folder
above it) is in the group named after that folder, unless config.wandb.group names one.
"""

import importlib.util
import json
import os
import uuid
from typing import Any, Mapping

from absl import logging
from etils import epath
import ml_collections

from vit_jax.runtime import paths

RUN_FILE = 'wandb_run.json'
SWEEP_FILE = 'sweep.json'  # launch/sweep.py's, in the root of its runs' workdirs.
_INSTALL = 'pip install "wandb==0.31.0" (into .venv: .venv/bin/pip install "wandb==0.31.0")'


def enabled(config: ml_collections.ConfigDict) -> bool:
  return config.wandb.project is not None


def check(config: ml_collections.ConfigDict) -> None:
  """One-line ValueErrors for config.wandb: its fields' types, fields set without a project, and a
  project without W&B installed."""
  fields = config.wandb
  for name in ('project', 'entity', 'name', 'group'):
    if fields[name] is not None and not (isinstance(fields[name], str) and fields[name]):
      raise ValueError(f'config.wandb.{name}={fields[name]!r} must be a non-empty string, or unset')
  if not (
      isinstance(fields.tags, (tuple, list)) and all(isinstance(t, str) and t for t in fields.tags)
  ):
    raise ValueError(
        f"config.wandb.tags={fields.tags!r} must be a tuple of strings, e.g. \"('vit', 'i1k')\""
    )
  if not enabled(config):
    named = [f for f in ('entity', 'name', 'group', 'tags') if fields[f]]
    if named:
      raise ValueError(
          f'config.wandb.{named[0]} is for a Weights & Biases run, and config.wandb.project is '
          'unset, so nothing is logged there: set --config.wandb.project=PROJECT'
      )
    return
  if importlib.util.find_spec('wandb') is None:
    raise ValueError(
        f'config.wandb.project={fields.project!r} logs to Weights & Biases, which is not '
        f'installed: {_INSTALL}, or unset config.wandb.project'
    )


def run_id(workdir: str) -> str:
  """The W&B run id of `workdir`'s run: the one kept in its RUN_FILE, else a new one, kept there."""
  path = epath.Path(workdir) / RUN_FILE
  if path.exists():
    return json.loads(path.read_text())['id']
  new = uuid.uuid4().hex[:16]
  path.write_text(json.dumps({'id': new}))
  return new


def sweep_group(workdir: str) -> str | None:
  """The name of the sweep `workdir` is a run of (the folder above it, if its SWEEP_FILE lists the
  run), else None."""
  run = epath.Path(workdir if paths.is_url(workdir) else os.path.abspath(workdir))
  listing = run.parent / SWEEP_FILE
  if not listing.exists():
    return None
  return run.parent.name if run.name in json.loads(listing.read_text()).get('runs', {}) else None


class CannotStart(ValueError):
  """W&B could not start the run (no login, no network): raised as the loop starts, a one-line error."""


class WandbWriter:
  """A MetricWriter (event_writer.py) logging to a W&B run of config.wandb."""

  def __init__(self, workdir: str, config: ml_collections.ConfigDict):
    import wandb  # pylint: disable=g-import-not-at-top

    fields = config.wandb
    # Outside the try: the workdir's storage failing is not W&B's, and says so itself.
    kept_id = run_id(workdir)
    group = fields.group or sweep_group(workdir)
    try:
      self._run = wandb.init(
          project=fields.project,
          entity=fields.entity,
          name=fields.name or epath.Path(workdir).name,
          group=group,
          tags=list(fields.tags) or None,
          id=kept_id,
          resume='allow',
          config=config.to_dict(),
      )
    except Exception as e:  # pylint: disable=broad-exception-caught
      # W&B's errors (no API key, no network) are many and their own: one line says which.
      first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CannotStart(
          f'Weights & Biases could not start the run of config.wandb.project={fields.project!r} '
          f'({first}): log in with `wandb login` (or set WANDB_API_KEY), run offline with '
          'WANDB_MODE=offline, or unset config.wandb.project'
      ) from None
    # The step after the last one the W&B run holds (0: a new run, or one offline).
    self._first_new_step = self._run.starting_step
    if self._first_new_step:
      logging.info(
          'Weights & Biases run %s holds steps before %d: they are not sent again',
          kept_id,
          self._first_new_step,
      )

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    if step < self._first_new_step:
      return
    self._run.log({k: float(v) for k, v in scalars.items()}, step=step)

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    del hparams  # The config went to wandb.init with its values, not these strings.

  def flush(self) -> None:
    pass

  def close(self) -> None:
    self._run.finish()
