"""The training loop: global batches through the jitted step, evaluators, checkpoints, metrics.

Everything a run depends on is a function of (config, step): the batch of step s is batch s of the data
stream, the dropout key of step s is fold_in(seed, s). A run killed after a checkpoint and started again
therefore continues exactly as if it had never stopped.
"""

import collections
import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
from absl import logging
from clu import parameter_overview

from vit_jax import data, evaluators, sharding
from vit_jax.checkpoints import checkpoint, run_dir
from vit_jax.runtime import dispatch
from vit_jax.train import best_checkpoint, event_writer, memory_fit, observe, pace, param_groups
from vit_jax.train import preemption
from vit_jax.train import progress, workdir_lock
from vit_jax.train.setup import Setup
from vit_jax.train.state import TrainState, check_resumable, create_state
from vit_jax.train.step import TrainStep, jit_train_step
from vit_jax.train.watchdog import Watchdog


def evaluate(evaluator: Any, state: TrainState) -> dict[str, float]:
  """`<name>_<metric>` of the parameters and, with Polyak averaging, `<name>_polyak_<metric>` of
  their average (not at step 0, where it is the parameters: total_steps=0 measures each once)."""
  measured = {False: evaluator(state.params)}
  averaged = state.ema_params is not None and evaluators.measures_average(evaluator)
  if averaged and int(state.step) > 0:
    measured[True] = evaluator(param_groups.with_trained(state.ema_params, state.params))
  for values in measured.values():  # config.best_checkpoint was checked against `metrics`.
    if set(values) != set(evaluator.metrics):
      raise RuntimeError(
          f'Evaluator {evaluator.name!r} returned {sorted(values)}, not its metrics '
          f'{sorted(evaluator.metrics)}'
      )
  return {
      evaluators.metric_name(evaluator.name, metric, averaged): value
      for averaged, values in measured.items()
      for metric, value in values.items()
  }


class DivergedError(RuntimeError):
  """A non-finite loss or gradient norm: the run stops before the poisoned state is saved."""


class InputError(RuntimeError):
  """The train data could not be read mid-run (its files gone, a mount lost): the run saved the step
  before, where one process trains."""


def _input_error(step: int, error: Exception, saved: bool) -> InputError:
  """`saved`: whether step - 1 is saved."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  said = lines[-1] if lines else type(error).__name__  # A worker's error ends its traceback.
  if step == 1:
    kept = 'nothing was trained; the same command starts the run'
  elif saved:
    kept = f'step {step - 1} is saved, where the same command resumes'
  else:
    kept = 'the same command resumes from the last checkpoint'
  return InputError(
      f'the train data could not be read for step {step} ({said}): {kept} once the data is back'
  )


def _checked_history(
    history: list[dict[str, jax.Array]], first_step: int, budget: int
) -> list[dict[str, float]]:
  """The train metrics of steps first_step, first_step + 1, ... on the host; raises DivergedError at
  the first step whose loss or gradient norm is not finite, or, when the run skips such steps, at the
  first step at which more than `budget` of them were skipped."""
  history = jax.device_get(history)
  for step, metrics in enumerate(history, first_step):
    if 'skipped_steps' in metrics:
      if metrics['skipped_steps'] > budget:
        raise DivergedError(
            f'{int(metrics["skipped_steps"])} steps had non-finite gradients by step {step}, more than '
            f'config.skip_nonfinite_steps={budget} allows: the run stopped there and saved nothing '
            'after it; lower the learning rate (config.lr.base), then resume from the last checkpoint'
        )
      continue
    for name in ('train_loss', 'grad_norm'):
      if not np.isfinite(metrics[name]):
        raise DivergedError(
            f'{name} is {float(metrics[name])} at step {step}: the run stopped there and saved nothing '
            'after it; lower the learning rate (config.lr.base) or raise config.lr.warmup_steps, then '
            'resume from the last checkpoint'
        )
  return history


# Metrics of the logged step itself, not means over the window: the rate its update applied (as
# big_vision and timm log it; a mean mixes a warmup's end with what follows), the run's count.
_AT_THE_STEP = ('learning_rate', 'skipped_steps')


def _mean_metrics(history: list[dict[str, float]]) -> dict[str, float]:
  """Means over the window's steps, of the finite values (skipped steps have none), but for
  `_AT_THE_STEP`'s, the last step's."""
  means = {}
  for k in history[0]:
    values = [metrics[k] for metrics in history]
    finite = [v for v in values if np.isfinite(v)]
    means[k] = float(values[-1] if k in _AT_THE_STEP else np.mean(finite) if finite else np.nan)
  return means


def device_batches(
    local_batches: Iterator[dict[str, np.ndarray]], mesh: jax.sharding.Mesh, ahead: int
) -> Iterator[dict[str, jax.Array]]:
  """The global batches of `local_batches` (`sharding.global_batch`), each put on the devices `ahead`
  batches before it is taken, so that its copy has the steps before it to arrive in.

  Through the CLI on an H200, ViT-B/16 steps fed this way at their own step took ~8 ms longer than
  the same steps on batches already on the device, about one batch's copy there (6.9 ms for 256 uint8
  images at 224 px; benchmarks/RESULTS.md): as if each copy waited behind the step before it.
  """
  queue = collections.deque()
  for local_batch in local_batches:
    queue.append(sharding.global_batch(local_batch, mesh))
    if len(queue) > ahead:
      yield queue.popleft()
  yield from queue


def train_and_evaluate(setup: Setup) -> dict[str, float]:
  """Runs (or resumes) training to `setup.total_steps`; returns the last metrics of every evaluator."""
  with Watchdog(setup.config.hang_timeout_s, jax.process_index(), jax.process_count()) as watchdog:
    with workdir_lock.held(setup.workdir):
      return _train(setup, watchdog)


def _train(setup: Setup, watchdog: Watchdog) -> dict[str, float]:
  config = setup.config
  changes = check_resumable(setup)  # Before anything in the workdir is written.
  run_dir.write_run_info(setup.workdir, config, setup.info, changes)
  writer = event_writer.create_writer(setup.workdir, config, just_logging=jax.process_index() > 0)
  writer.write_hparams({k: str(v) for k, v in config.items()})
  manager = checkpoint.make_manager(setup.workdir, config.keep_checkpoints)
  state, state_shardings, to_checkpoint = create_state(setup, manager)
  start_step = int(state.step)
  if start_step == 0 and logging.level_debug():  # Its statistics read every parameter.
    logging.debug('%s', parameter_overview.get_parameter_overview(state.params))
  step_fn = jit_train_step(setup, state_shardings)
  best = best_checkpoint.Keeper(setup.workdir, setup.best, setup.model) if setup.best else None

  stopped_early = best is not None and best.exhausted(start_step)
  # No batch is read: no workers are started.
  evaluating_only = start_step >= setup.total_steps or stopped_early
  train_iter = (
      iter(())
      if evaluating_only
      else data.train_iterator(
          config,
          local_batch_size=config.batch_size // jax.process_count(),
          start_step=start_step,
          process_index=jax.process_index(),
          process_count=jax.process_count(),
      )
  )
  run_pace = pace.Pace(setup.total_steps, config.log_every_steps, writer)
  if setup.total_steps == 0 and start_step == 0:
    what = f'Evaluating config.init_from={config.init_from} (total_steps=0: nothing is trained):'
  elif stopped_early:
    what = (
        f'Run stopped early at step {start_step} of {setup.total_steps} '
        '(config.best_checkpoint.patience): evaluating only;'
    )
  elif evaluating_only:  # A finished run started again.
    what = f'Run already at step {start_step} of {setup.total_steps}: evaluating only;'
  else:
    what = f'Training {setup.total_steps} steps from step {start_step}:'
  logging.info('%s %s', what, observe.run_header(setup, state.params))

  notice = preemption.PreemptionNotice(manager)
  saver = checkpoint.Saver(manager)
  bar = progress.for_run(setup.total_steps, start_step, config.batch_size, jax.process_index())
  try:
    eval_metrics = _run_steps(
        setup,
        state,
        start_step if evaluating_only else setup.total_steps,
        step_fn,
        train_iter,
        writer,
        run_pace,
        notice,
        lambda step, state: saver.save(step, to_checkpoint(state)),
        best,
        watchdog,
        bar,
    )
  except jax.errors.JaxRuntimeError as e:
    if not memory_fit.out_of_memory(e):
      raise
    raise memory_fit.ran_out(e, watchdog.current, config) from None
  finally:  # Also when the run stops early: the saves in flight complete, or stay unread temporaries.
    # Now, not when the interpreter ends, where grain's clean-up of its worker processes would find
    # its modules gone (a traceback on the console per worker).
    if not evaluating_only:
      train_iter.close()
    for evaluator in setup.evaluators:
      evaluator.close()
    notice.close()
    watchdog.phase('waiting for the checkpoint saves to finish')
    try:
      try:
        saver.close()
      finally:
        if best:
          best.close()
    finally:
      try:
        writer.close()
      finally:
        bar.close()  # After the writer thread's last lines, so that they print above the last bar.
  return eval_metrics


def _run_steps(
    setup: Setup,
    state: TrainState,
    end_step: int,
    step_fn: TrainStep,
    train_iter: Iterator,
    writer: event_writer.MetricWriter,
    run_pace: pace.Pace,
    notice: preemption.PreemptionNotice,
    save: Callable[[int, TrainState], None],
    best: best_checkpoint.Keeper | None,
    watchdog: Watchdog,
    bar: progress.Bar,
) -> dict[str, float]:
  """Steps int(state.step) + 1 .. end_step with their logging, evaluations and saves; raises
  preemption.Preempted after saving the step at which the run was asked to stop. `best` (None: not
  kept) saves the parameters of each evaluation that beats the run's best, and stops the run when
  its patience is exhausted."""
  config = setup.config
  eval_metrics: dict[str, float] = {}
  history, window_start = [], time.time()
  first = int(state.step) + 1
  budget = config.skip_nonfinite_steps
  profiler = observe.StepProfiler(setup.workdir, first + 2, config.profile_steps)
  in_flight = dispatch.BoundedDispatch()
  batches = device_batches(train_iter, setup.mesh, config.device_prefetch)
  saved = first - 1  # The step of the latest checkpoint.
  try:
    for step in range(first, end_step + 1):
      # Steps are dispatched ahead of the devices: a hung step stops the loop dispatch.AHEAD later.
      watchdog.phase(f'train step {step}' + (' (compiling)' if step == first else ''))
      profiler.before(step)
      with jax.profiler.StepTraceAnnotation('train', step_num=step):
        with run_pace.waiting_for_input():
          try:
            batch = next(batches)
          # Not a config's error found late in the pipeline (an augmentation's range): a traceback.
          except (OSError, data.UnreadableSplit) as e:
            # The steps since the last save are kept. Not with several processes: the others wait
            # in this step's collectives, and a save waits for every process.
            save_now = jax.process_count() == 1 and step - 1 > saved
            if save_now:
              _checked_history(history, step - len(history), budget)  # Never a poisoned state.
              watchdog.phase(f'saving checkpoint {step - 1}')
              writer.flush()
              save(step - 1, state)
            raise _input_error(step, e, save_now or step - 1 == saved) from e
        if step == first:  # Before the step runs out of memory (on CPU, the OOM killer's SIGKILL).
          memory_fit.check_train_step(step_fn, state, batch, config)
        state, metrics = step_fn(state, batch)
      profiler.after(step, state)
      if step == first:
        jax.block_until_ready(metrics)
        observe.log_memory(step)
      history.append(metrics)
      in_flight.add(metrics)
      bar.advance(step)
      run_pace(step)
      last = step == setup.total_steps
      # The metrics are fetched (and checked) only here and before a save, so steps stay asynchronous.
      if step % config.log_every_steps == 0 or last:
        summary = _mean_metrics(_checked_history(history, step - len(history) + 1, budget))
        summary['images_per_sec'] = len(history) * config.batch_size / (time.time() - window_start)
        writer.write_scalars(step, summary)
        bar.show(summary)
        history, window_start = [], time.time()
      measured = {}
      for evaluator in setup.evaluators:
        if step % evaluator.every_steps == 0 or last:
          watchdog.phase(f'evaluation {evaluator.name} at step {step}')
          with run_pace.timed(evaluator.name, after=state):
            measured.update(evaluate(evaluator, state))
      if measured:
        writer.write_scalars(step, measured)
        bar.show(measured)
        eval_metrics.update(measured)
        if best and best.beaten(measured):
          _checked_history(history, step - len(history) + 1, budget)  # Never save a poisoned state.
          watchdog.phase(f'saving the best parameters of step {step}')
          best.save(step, measured, state)
      stop = notice(step) and not last
      exhausted = best is not None and not last and best.exhausted(step)
      if step % config.checkpoint_every_steps == 0 or last or stop or exhausted:
        _checked_history(history, step - len(history) + 1, budget)  # Never save a poisoned state.
        watchdog.phase(f'saving checkpoint {step}')
        writer.flush()  # The curves up to a checkpoint are kept with it: a resumed run has no gap.
        with run_pace.timed('checkpoint', after=state):
          save(step, state)
        saved = step
      if stop:
        raise preemption.Preempted(step)
      if exhausted:
        logging.info(
            "No better %s than step %d's in %d evaluations: stopping early at step %d of %d "
            '(config.best_checkpoint.patience)',
            setup.best.metric,
            best.step,
            setup.best.patience,
            step,
            setup.total_steps,
        )
        break
  finally:  # A run that ends (or stops) inside the traced steps still writes its trace.
    profiler.stop()
  if not eval_metrics:  # Resumed at the end: report the final model all the same.
    for evaluator in setup.evaluators:
      watchdog.phase(f'evaluation {evaluator.name} at step {int(state.step)}')
      eval_metrics.update(evaluate(evaluator, state))
    writer.write_scalars(int(state.step), eval_metrics)
  return eval_metrics
