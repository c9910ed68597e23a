"""The best parameters of a run by an evaluation metric (config.best_checkpoint), in
`workdir/best/<step>`: saved when an evaluation beats every earlier one of the run, after which the
one before is removed.

It holds the parameters that metric measured, in the checkpoints' per-block layout: `params`, or for a
metric of the Polyak average (<evaluator>_polyak_<metric>) `ema_params`, the average with the frozen
parameters in their places; with the value, metric and mode (orbax's metrics of the step). The tools
read it as a step of the run (`--step=best`, saved_state.find_checkpoint), and
config.init_from=W/best/<step> fine-tunes from it.

With `patience`, the run stops early at the evaluation `patience` evaluations after the best's.

A resumed run goes on from the value saved. A best saved after the checkpoint the run resumes from (the
run was stopped between them) is kept: the same steps retrace it; an evaluation that beats it there
(only a changed config does) replaces it.
"""

import dataclasses
import math
from typing import Any, Mapping, Optional

from absl import logging
import jax
import ml_collections
import orbax.checkpoint as ocp
from etils import epath

from vit_jax.checkpoints import checkpoint, saved_state
from vit_jax.models import scan_layout
from vit_jax.runtime import paths
from vit_jax.train import events, param_groups

MODES = ('max', 'min')


@dataclasses.dataclass(frozen=True)
class Best:
  """config.best_checkpoint, resolved against the metrics the run's evaluators log."""

  metric: str
  mode: str  # One of MODES.
  polyak: bool  # Whether `metric` measures the Polyak average of the parameters.
  every_steps: int = 1  # Of the evaluator that logs `metric`.
  patience: Optional[int] = (
      None  # Evaluations of `metric` without a new best to stop at; None: never.
  )

  def better(self, value: float, than: Optional[float]) -> bool:
    """Whether `value` beats `than` (None: nothing yet); a NaN never does."""
    if math.isnan(value):
      return False
    return than is None or (value > than if self.mode == 'max' else value < than)


def resolve(
    config: ml_collections.ConfigDict, logged: Mapping[str, tuple[Any, bool]], total_steps: int
) -> Optional[Best]:
  """config.best_checkpoint checked against `logged` (evaluators.logged_metrics: each metric the run
  logs -> its evaluator, whether it measures the Polyak average); None when unset. Raises a one-line
  ValueError."""
  metric, mode = config.best_checkpoint.metric, config.best_checkpoint.mode
  patience = config.best_checkpoint.patience
  if patience is not None and (isinstance(patience, bool) or patience < 1):
    raise ValueError(
        f'config.best_checkpoint.patience={patience} must be a number of evaluations >= 1 (unset: '
        'the run trains to the end)'
    )
  if mode is not None and mode not in MODES:
    raise ValueError(
        f'config.best_checkpoint.mode={mode!r} must be one of {", ".join(MODES)} (unset: min for '
        'a metric ending in loss, else max)'
    )
  if metric is None:
    for field, value in (('mode', mode), ('patience', patience)):
      if value is not None:
        raise ValueError(
            f'config.best_checkpoint.{field}={value!r} acts on config.best_checkpoint.metric, which '
            f'is unset: set it too (e.g. --config.best_checkpoint.metric=eval_top1) or unset the '
            f'{field}'
        )
    return None
  if metric not in logged:
    polyak = '' if config.polyak_decay is not None else ' (_polyak_ ones: set config.polyak_decay)'
    raise ValueError(
        f'config.best_checkpoint.metric={metric!r} is not a metric this run logs: use one of '
        f'{", ".join(sorted(logged))}{polyak}'
    )
  if total_steps == 0:
    raise ValueError(
        f'config.best_checkpoint.metric={metric!r} keeps the best of the evaluations of a run '
        'that trains, and this one has 0 steps: unset it, or train (--config.total_steps)'
    )
  if mode is None:
    mode = 'min' if events.lower_is_better(metric) else 'max'
  evaluator, polyak = logged[metric]
  return Best(metric, mode, polyak, evaluator.every_steps, patience)


class Keeper:
  """Saves the parameters of each evaluation that beats the run's best so far, async.

  Every process makes the same decisions: they read the same saved value and evaluators return the
  same (replicated) numbers on every host.
  """

  def __init__(self, workdir: str, best: Best, model: Any):
    self._best = best
    worst = -math.inf if best.mode == 'max' else math.inf
    options = ocp.CheckpointManagerOptions(
        max_to_keep=1,
        create=True,
        enable_async_checkpointing=True,
        cleanup_tmp_directories=True,
        # A best saved for another metric or mode (the config changed on resume) is the first to go.
        best_fn=lambda saved: saved[best.metric] if self._measures(saved) else worst,
        best_mode=best.mode,
    )
    directory = epath.Path(paths.absolute(workdir)) / saved_state.BEST
    _settle_replaced(directory)
    self._manager = ocp.CheckpointManager(directory, options=options)
    self._replaced: list[epath.Path | None] = []  # Bests moved aside for a save in flight.
    self._saver = checkpoint.Saver(self._manager)
    self._layout = jax.jit(scan_layout.unstack_blocks) if scan_layout.scanned(model) else None
    self.value, self.step = None, None
    for step in self._manager.all_steps():
      saved = self._manager.metrics(step)  # None if it cannot be read: the next best replaces it.
      if (
          saved is not None
          and self._measures(saved)
          and best.better(saved[best.metric], self.value)
      ):
        self.value, self.step = saved[best.metric], step
    if self.step is not None:
      logging.info(
          'Best %s so far: %.6g at step %d (%s)',
          best.metric,
          self.value,
          self.step,
          self._manager.directory / str(self.step),
      )

  def _measures(self, saved: Mapping[str, Any]) -> bool:
    return saved.get('metric') == self._best.metric and saved.get('mode') == self._best.mode

  def beaten(self, measured: Mapping[str, float]) -> bool:
    """Whether an evaluation's metrics beat the best so far (not all evaluators run at every step)."""
    value = measured.get(self._best.metric)
    return value is not None and self._best.better(value, self.value)

  def save(self, step: int, measured: Mapping[str, float], state: Any) -> None:
    """Saves the parameters of `state` that `measured` (metrics that are `beaten`) measured."""
    value = measured[self._best.metric]
    params = (
        param_groups.with_trained(state.ema_params, state.params)
        if self._best.polyak
        else state.params
    )
    if self._layout is not None:
      params = self._layout(params)
    self._saver.wait()
    self._drop_replaced()
    # Orbax saves no step at or before its latest: a best the resumed run passed is moved aside,
    # and removed once this save is complete (a run killed in it gets it back: `_settle_replaced`).
    stale = [s for s in self._manager.all_steps() if s >= step]
    if stale:
      if jax.process_index() == 0:
        self._replaced = [_moved_or_deleted(self._manager, s) for s in stale]
      ocp.multihost.sync_global_processes('vit_jax_best_moved_aside')
      self._manager.reload()
    logging.info(
        'New best %s: %.6g at step %d (was %s): saving its parameters to %s',
        self._best.metric,
        value,
        step,
        'none' if self.value is None else f'{self.value:.6g} at step {self.step}',
        self._manager.directory / str(step),
    )
    self._saver.save(
        step,
        {'ema_params' if self._best.polyak else 'params': params},
        metrics={
            self._best.metric: float(value),
            'metric': self._best.metric,
            'mode': self._best.mode,
        },
    )
    self.value, self.step = value, step

  def exhausted(self, step: int) -> bool:
    """Whether the run stops at `step`: an evaluation of the metric `patience` evaluations after that
    of the best. True again at that step when the run is started again (it saved its checkpoint
    there): it has stopped."""
    best = self._best
    return (
        best.patience is not None
        and self.step is not None
        and step % best.every_steps == 0
        and step - self.step >= best.patience * best.every_steps
    )

  def _drop_replaced(self) -> None:
    """Removes the bests moved aside once their replacement is saved (after a failed save, the next
    start puts them back: `_settle_replaced`)."""
    if saved_state.steps_in(self._manager.directory):
      for replaced in self._replaced:
        if replaced is not None:
          replaced.rmtree()
    self._replaced = []

  def close(self) -> None:
    """Waits for the save in flight (a failed one raises checkpoint.SaveError)."""
    self._saver.close()
    self._drop_replaced()


def _move(path: epath.Path) -> epath.Path:
  """`path` renamed to `<path>.replaced` (or `-2`, `-3`... when taken), a name orbax neither lists
  as a step nor removes as a temporary; the new path."""
  target, k = path.parent / f'{path.name}{saved_state.REPLACED}', 1
  while target.exists():
    k += 1
    target = path.parent / f'{path.name}{saved_state.REPLACED}-{k}'
  path.rename(target)
  return target


def _moved_or_deleted(manager: ocp.CheckpointManager, step: int) -> epath.Path | None:
  """Best `step` moved aside (`_move`); deleted (None) on storage that cannot rename a directory."""
  path = epath.Path(manager.directory) / str(step)
  try:
    return _move(path)
  except Exception:  # pylint: disable=broad-except  # A file system's errors, of any kind.
    path.rmtree()
    return None


def _settle_replaced(directory: epath.Path) -> None:
  """A best moved aside for a save that the run was killed in comes back (its step was the best
  saved); where a best was saved since, it is removed. Process 0 decides; the others wait for it."""
  if jax.process_index() == 0 and directory.is_dir():
    for path in sorted(directory.glob(f'*{saved_state.REPLACED}*')):
      if saved_state.steps_in(directory):
        path.rmtree()
        continue
      step = directory / path.name.split('.')[0]
      if step.exists():  # The killed save's own (cloud storage writes there, uncommitted).
        step.rmtree()
      path.rename(step)
  ocp.multihost.sync_global_processes('vit_jax_best_settled')
