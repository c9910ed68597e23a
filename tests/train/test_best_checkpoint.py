"""config.best_checkpoint: the parameters of the run's best evaluation in workdir/best/<step>, found
from the logged metrics, measured again, across a resume, and read by the tools as --step=best."""

import os
import shutil
import types

import jax
import numpy as np
import pytest

import helpers
from etils import epath

from vit_jax.checkpoints import checkpoint, run_dir, saved_state
from vit_jax.tools import confusion, export
from vit_jax.train import best_checkpoint, loop, param_groups, setup as train_setup

# Evaluations every 2 steps, a checkpoint of each (none removed), so that any best has a checkpoint.
EVERY_2 = {
    **helpers.TINY,
    'eval_every_steps': 2,
    'checkpoint_every_steps': 2,
    'keep_checkpoints': 20,
}


def _run(workdir, data_dir, **overrides):
  config = helpers.load_config('demo', {**EVERY_2, 'data_dir': data_dir, **overrides})
  loop.train_and_evaluate(train_setup.prepare(config, str(workdir)))
  return config


def _best_steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'best')) if d.isdigit())


def _arg_best(values: dict[int, float], mode: str) -> int:
  pick = max if mode == 'max' else min
  return pick(values, key=lambda step: (values[step], -step))  # The first of equal values.


def _tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_the_best_evaluation_is_kept_measured_again_and_kept_across_a_resume(
    tmp_path, data_dir, caplog
):
  """The worst loss (mode max) is the first evaluation's on a run that learns: the best must stay at
  the step whose logged value is the highest, also after a resume (which must not take its own first
  evaluation as the best), and hold that step's parameters, which measure that value again."""
  workdir = str(tmp_path / 'run')
  config = _run(
      workdir, data_dir, **{'best_checkpoint.metric': 'eval_loss', 'best_checkpoint.mode': 'max'}
  )
  first = helpers.read_scalars(workdir)['eval_loss']
  assert sorted(first) == [2, 4, 6, 8, 10, 12]
  caplog.set_level('INFO')
  caplog.clear()
  _run(
      workdir,
      data_dir,
      total_steps=20,
      **{'best_checkpoint.metric': 'eval_loss', 'best_checkpoint.mode': 'max'},
  )
  losses = helpers.read_scalars(workdir)['eval_loss']
  before = _arg_best(first, 'max')
  assert f'Best eval_loss so far: {first[before]:.6g} at step {before}' in caplog.text
  # The resumed run's evaluations are measured against it: none is saved unless it beats it.
  saved = [step for step in range(14, 21, 2) if losses[step] > first[before]]
  assert caplog.text.count('New best eval_loss') == len(saved)
  assert sorted(losses) == list(range(2, 21, 2))
  step = _arg_best(losses, 'max')
  assert _best_steps(workdir) == [step]
  best_dir, found = saved_state.find_checkpoint(workdir, 'best')
  assert (best_dir, found) == (os.path.join(workdir, 'best', str(step)), step)
  params, name = saved_state.restore_params(best_dir)
  assert name == 'params'
  _tree_equal(params, helpers.checkpoint_params(workdir, step))
  evaluator, _ = helpers.evaluator(config, 'eval')
  try:
    assert evaluator(params)['loss'] == pytest.approx(losses[step], rel=1e-5)
  finally:
    evaluator.close()
  # The confusion tool's --step=best reads best/<step>, also once keep_checkpoints has removed
  # checkpoints/<step>.
  shutil.rmtree(os.path.join(workdir, 'checkpoints', str(step)))
  predictions, found, _ = confusion.predict_split(workdir, 'best', None)
  top1 = np.mean(predictions.probabilities.argmax(-1) == predictions.labels)
  assert found == step
  assert top1 == pytest.approx(helpers.read_scalars(workdir)['eval_top1'][step], abs=1e-6)


def test_a_loss_is_minimised_by_default_and_a_polyak_metric_keeps_the_average(tmp_path, data_dir):
  workdir = str(tmp_path)
  _run(workdir, data_dir, polyak_decay=0.5, **{'best_checkpoint.metric': 'eval_polyak_loss'})
  losses = helpers.read_scalars(workdir)['eval_polyak_loss']
  step = _arg_best(losses, 'min')
  assert _best_steps(workdir) == [step]
  trained = run_dir.load_trained(workdir, 'best')
  assert (trained.step, trained.parameters) == (step, 'polyak')
  saved = helpers.checkpoint_state(workdir, step)
  _tree_equal(trained.params, param_groups.with_trained(saved['ema_params'], saved['params']))
  description = export.export(workdir, str(tmp_path / 'export'), 'best')
  assert (description['step'], description['parameters']) == (step, 'polyak')
  # A run from it (its head kept, nothing trained) measures what the run measured of the average.
  config = helpers.load_config(
      'demo',
      {
          **EVERY_2,
          'data_dir': data_dir,
          'init_from': os.path.join(workdir, 'best', str(step)),
          'keep_head': True,
          'total_steps': 0,
      },
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'from_best')))
  assert metrics['eval_loss'] == pytest.approx(losses[step], rel=1e-5)


@pytest.mark.slow  # Runs of the loop killed and resumed: make test-all's.
def test_a_best_the_resumed_run_retraces_is_kept_and_another_metric_replaces_it(tmp_path, data_dir):
  """Checkpoints after 4 lost: the best of step 12 stays while steps 6..12 are retrained (bit-exact,
  no evaluation beats it); a resume that keeps the best by another metric replaces it at its first
  evaluation, a step before it (orbax saves no step at or before its latest unless it is removed).
  """
  workdir = str(tmp_path)
  overrides = {'best_checkpoint.metric': 'eval_loss'}
  _run(workdir, data_dir, **overrides)
  losses = helpers.read_scalars(workdir)['eval_loss']
  step = _arg_best(losses, 'min')
  assert step > 4 and _best_steps(workdir) == [step]
  kept = saved_state.restore_params(os.path.join(workdir, 'best', str(step)))[0]
  for lost in range(6, 13, 2):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(lost)))
  _run(workdir, data_dir, **overrides)
  assert _best_steps(workdir) == [step]
  _tree_equal(saved_state.restore_params(os.path.join(workdir, 'best', str(step)))[0], kept)
  for lost in range(6, 13, 2):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(lost)))
  _run(workdir, data_dir, **{'best_checkpoint.metric': 'eval_top1'})
  top1 = {s: v for s, v in helpers.read_scalars(workdir)['eval_top1'].items()}
  assert _best_steps(workdir) == [_arg_best({s: top1[s] for s in range(6, 13, 2)}, 'max')]


class _Killed(Exception):
  pass


@pytest.mark.slow  # Runs of the loop killed and resumed: make test-all's.
def test_a_best_being_replaced_at_or_after_the_new_step_survives_a_run_killed_in_that_save(
    tmp_path, data_dir, monkeypatch
):
  """Orbax saves no step at or before its latest, so the best a resumed run passes is moved aside
  (it was deleted) and removed once its replacement is saved: a run killed in that save left no
  best at all; the next start puts it back."""
  workdir = str(tmp_path)
  _run(workdir, data_dir, **{'best_checkpoint.metric': 'eval_loss'})
  (step,) = _best_steps(workdir)
  assert step > 4
  kept = saved_state.restore_params(os.path.join(workdir, 'best', str(step)))[0]
  for lost in range(6, 13, 2):
    shutil.rmtree(os.path.join(workdir, 'checkpoints', str(lost)))
  save = checkpoint.Saver.save

  def killed_in_best_saves(saver, *args, **kwargs):
    if os.path.basename(str(saver._manager.directory)) == 'best':  # pylint: disable=protected-access
      raise _Killed
    return save(saver, *args, **kwargs)

  monkeypatch.setattr(checkpoint.Saver, 'save', killed_in_best_saves)
  with pytest.raises(_Killed):  # Another metric: its first evaluation, at step 6, is its best.
    _run(workdir, data_dir, **{'best_checkpoint.metric': 'eval_top1'})
  assert not _best_steps(workdir)
  replaced = os.path.join(workdir, 'best', f'{step}.replaced')
  assert saved_state.find_checkpoint(workdir, 'best') == (replaced, step)  # What the tools read.
  monkeypatch.undo()
  best_checkpoint._settle_replaced(epath.Path(workdir) / 'best')  # pylint: disable=protected-access
  assert os.listdir(os.path.join(workdir, 'best')) == [str(step)]
  _tree_equal(saved_state.restore_params(os.path.join(workdir, 'best', str(step)))[0], kept)
  _run(workdir, data_dir, **{'best_checkpoint.metric': 'eval_top1'})  # Replaced, nothing left.
  assert len(_best_steps(workdir)) == 1 and len(os.listdir(os.path.join(workdir, 'best'))) == 1


def test_tools_read_the_best_as_a_step_and_name_what_is_missing(tmp_path, data_dir):
  workdir = str(tmp_path)
  _run(workdir, data_dir, total_steps=4)
  with pytest.raises(
      ValueError, match=r'holds no best parameters .*--config\.best_checkpoint\.metric'
  ):
    saved_state.find_checkpoint(workdir, 'best')
  with pytest.raises(
      ValueError, match=r'^--step=last: pass a checkpoint step \(a number\) or best$'
  ):
    saved_state.find_checkpoint(workdir, 'last')
  assert saved_state.find_checkpoint(workdir, '2')[1] == 2


def test_resolve_orders_losses_down_and_the_rest_up_and_refuses_a_run_that_trains_nothing():
  config = helpers.load_config('demo', helpers.TINY)
  every_2, every_5 = types.SimpleNamespace(every_steps=2), types.SimpleNamespace(every_steps=5)
  logged = {
      'eval_loss': (every_2, False),
      'eval_polyak_map': (every_2, True),
      'fewshot_5shot': (every_5, False),
  }
  resolved = {}
  for metric in logged:
    config.best_checkpoint.metric = metric
    resolved[metric] = best_checkpoint.resolve(config, logged, 12)
  assert resolved == {
      'eval_loss': best_checkpoint.Best('eval_loss', 'min', False, 2),
      'eval_polyak_map': best_checkpoint.Best('eval_polyak_map', 'max', True, 2),
      'fewshot_5shot': best_checkpoint.Best('fewshot_5shot', 'max', False, 5),
  }
  with pytest.raises(
      ValueError, match=r'has 0 steps: unset it, or train \(--config\.total_steps\)$'
  ):
    best_checkpoint.resolve(config, logged, 0)
  config.best_checkpoint.metric = None
  assert best_checkpoint.resolve(config, logged, 12) is None


def test_patience_stops_the_run_and_a_stopped_run_started_again_only_evaluates(
    tmp_path, data_dir, caplog
):
  """The worst loss (mode max) is the first evaluation's, at step 2: with a patience of 2 evaluations
  (every 2 steps) the run stops at step 6 with its checkpoint, whatever total_steps says; started
  again, it trains no step."""
  workdir = str(tmp_path)
  overrides = {
      'best_checkpoint.metric': 'eval_loss',
      'best_checkpoint.mode': 'max',
      'best_checkpoint.patience': 2,
      'log_every_steps': 1,
      'total_steps': 20,
  }
  caplog.set_level('INFO')
  _run(workdir, data_dir, **overrides)
  losses = helpers.read_scalars(workdir)['eval_loss']
  assert max(losses, key=losses.get) == 2, losses  # The premise: the run learns.
  assert sorted(losses) == [2, 4, 6]
  assert sorted(helpers.read_scalars(workdir)['train_loss']) == list(range(1, 7))
  assert saved_state.saved_steps(workdir) == [2, 4, 6] and _best_steps(workdir) == [2]
  assert "No better eval_loss than step 2's in 2 evaluations: stopping early at step 6 of 20" in (
      caplog.text
  )
  caplog.clear()
  _run(workdir, data_dir, **overrides)
  assert 'Run stopped early at step 6 of 20 (config.best_checkpoint.patience)' in caplog.text
  assert saved_state.saved_steps(workdir) == [2, 4, 6]
  assert max(helpers.read_scalars(workdir)['train_loss']) == 6
  # A longer patience goes on from there.
  _run(workdir, data_dir, **{**overrides, 'best_checkpoint.patience': 3})
  assert saved_state.saved_steps(workdir)[-1] == 8
