"""The training loop: global batches through the jitted step, evaluators, checkpoints, metrics.

Everything a run depends on is a function of (config, step): the batch of step s is batch s of the data
stream, the dropout key of step s is fold_in(seed, s). A run killed after a checkpoint and started again
therefore continues exactly as if it had never stopped.
"""
import time
from typing import Any

import jax
import numpy as np
from absl import logging
from clu import metric_writers, parameter_overview, periodic_actions

from vit_jax import checkpoint, data, optim, run_dir, sharding
from vit_jax.train.setup import Setup
from vit_jax.train.state import TrainState, create_state
from vit_jax.train.step import jit_train_step


def evaluate(evaluator: Any, state: TrainState) -> dict[str, float]:
  """`<name>_<metric>` of the parameters and, with Polyak averaging, `<name>_polyak_<metric>` of
  their average."""
  metrics = {f'{evaluator.name}_{k}': v for k, v in evaluator(state.params).items()}
  if state.ema_params is not None:
    metrics.update({f'{evaluator.name}_polyak_{k}': v
                    for k, v in evaluator(state.ema_params).items()})
  return metrics


def _mean_metrics(history: list[dict[str, jax.Array]]) -> dict[str, float]:
  history = jax.device_get(history)
  return {k: float(np.mean([metrics[k] for metrics in history])) for k in history[0]}


def train_and_evaluate(setup: Setup) -> dict[str, float]:
  """Runs (or resumes) training to `setup.total_steps`; returns the last metrics of every evaluator."""
  config, mesh = setup.config, setup.mesh
  run_dir.write_run_info(setup.workdir, config, setup.info)
  writer = metric_writers.create_default_writer(setup.workdir, just_logging=jax.process_index() > 0)
  writer.write_hparams({k: str(v) for k, v in config.items()})
  tx, schedule = optim.make_optimizer(config, setup.total_steps)
  manager = checkpoint.make_manager(setup.workdir, config.keep_checkpoints)
  state, state_shardings, to_checkpoint = create_state(setup, tx, manager)
  start_step = int(state.step)
  if start_step == 0:
    parameter_overview.log_parameter_overview(state.params)
  step_fn = jit_train_step(setup, tx, schedule, state_shardings)

  train_iter = data.train_iterator(
      config, local_batch_size=config.batch_size // jax.process_count(), start_step=start_step,
      process_index=jax.process_index(), process_count=jax.process_count())
  report_progress = periodic_actions.ReportProgress(
      num_train_steps=setup.total_steps, writer=writer, every_steps=config.log_every_steps,
      every_secs=None)
  logging.info('Training %d steps from step %d: %d train / %d eval examples, %d classes, %d devices',
               setup.total_steps, start_step, setup.info.num_train, setup.info.num_eval,
               setup.info.num_classes, jax.device_count())

  eval_metrics: dict[str, float] = {}
  history, window_start = [], time.time()
  for step in range(start_step + 1, setup.total_steps + 1):
    with jax.profiler.StepTraceAnnotation('train', step_num=step):
      batch = sharding.global_batch(next(train_iter), mesh)
      state, metrics = step_fn(state, batch)
    history.append(metrics)
    report_progress(step)
    last = step == setup.total_steps
    if step % config.log_every_steps == 0 or last:
      summary = _mean_metrics(history)
      summary['images_per_sec'] = len(history) * config.batch_size / (time.time() - window_start)
      writer.write_scalars(step, summary)
      history, window_start = [], time.time()
    measured = {}
    for evaluator in setup.evaluators:
      if step % evaluator.every_steps == 0 or last:
        with report_progress.timed(evaluator.name):
          measured.update(evaluate(evaluator, state))
    if measured:
      writer.write_scalars(step, measured)
      eval_metrics.update(measured)
    if step % config.checkpoint_every_steps == 0 or last:
      with report_progress.timed('checkpoint'):
        checkpoint.save(manager, step, to_checkpoint(state))
  if not eval_metrics:  # Resumed at the end: report the final model all the same.
    for evaluator in setup.evaluators:
      eval_metrics.update(evaluate(evaluator, state))
    writer.write_scalars(int(state.step), eval_metrics)
  manager.wait_until_finished()
  manager.close()
  writer.flush()
  return eval_metrics
