"""Schedules and optimizers built from the config."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax.train import optim


def _lr(**fields):
  return helpers.load_config('demo', {f'lr.{k}': v for k, v in fields.items()}).lr


def test_linear_warmup_then_linear_decay():
  schedule = optim.make_schedule(_lr(base=1.0, warmup_steps=10, decay='linear', end=0.0), 110)
  np.testing.assert_allclose(
      [schedule(s) for s in (0, 5, 10, 60, 110)], [0, 0.5, 1.0, 0.5, 0.0], atol=1e-6
  )


def test_cosine_decay_reaches_end_value():
  schedule = optim.make_schedule(_lr(base=2.0, warmup_steps=0, decay='cosine', end=0.2), 100)
  np.testing.assert_allclose([schedule(0), schedule(50), schedule(100)], [2.0, 1.1, 0.2], atol=1e-5)


def test_unknown_decay_is_an_error():
  with pytest.raises(ValueError, match="Unknown lr.decay 'step'"):
    optim.make_schedule(_lr(decay='step'), 10)


def _one_update(overrides, grads, params):
  config = helpers.load_config('demo', overrides)
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  updates, _ = tx.update(grads, tx.init(params), params)
  return updates


def test_sgd_momentum_with_clipping_and_no_decay():
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}}
  grads = jax.tree.map(lambda p: 10 * p, params)  # Global norm sqrt(6) * 10, clipped to 1.
  updates = _one_update(
      {
          'optim.name': 'sgd',
          'optim.weight_decay': 0.0,
          'lr.base': 0.5,
          'lr.warmup_steps': 0,
          'lr.decay': 'constant',
          'grad_clip_norm': 1.0,
      },
      grads,
      params,
  )
  expected = -0.5 * 10 / np.sqrt(600)
  jax.tree.map(lambda u: np.testing.assert_allclose(u, expected, rtol=1e-6), updates)


def test_adamw_decays_kernels_only():
  params = {'dense': {'kernel': jnp.ones((2, 2)), 'bias': jnp.ones(2)}}
  grads = jax.tree.map(jnp.zeros_like, params)
  updates = _one_update(
      {
          'optim.name': 'adamw',
          'optim.weight_decay': 0.1,
          'lr.base': 1.0,
          'lr.warmup_steps': 0,
          'lr.decay': 'constant',
      },
      grads,
      params,
  )
  np.testing.assert_allclose(updates['dense']['kernel'], -0.1)
  np.testing.assert_allclose(updates['dense']['bias'], 0.0)


def test_unknown_optimizer_is_an_error():
  config = helpers.load_config('demo', {'optim.name': 'lamb'})
  with pytest.raises(
      ValueError,
      match="^Unknown optim.name 'lamb': use one of adamw, sgd, lion, adafactor, big_vision_adafactor$",
  ):
    optim.check_optim(config, helpers.model_config(config))
  with pytest.raises(ValueError, match="Unknown optim.name 'lamb'"):
    optim.make_optimizer(config, 10, helpers.model_config(config))


def test_registries_name_what_the_config_accepts():
  assert set(optim.OPTIMIZERS) == {'adamw', 'sgd', 'lion', 'adafactor', 'big_vision_adafactor'}
  assert set(optim.DECAYS) == {'linear', 'cosine', 'constant'}
  demo = helpers.load_config('demo')
  optim.check_optim(demo, helpers.model_config(demo))  # A valid config passes.


@pytest.mark.parametrize(
    'field,value,match',
    [
        (
            'lr.base',
            -1e-3,
            r'^config.lr.base=-0.001 must be a finite number >= 0: set it to e.g. 1e-3$',
        ),
        ('lr.warmup_steps', -1, r'config.lr.warmup_steps=-1 must be a finite number >= 0'),
        ('lr.end', -0.1, r'config.lr.end=-0.1 must be a finite number >= 0'),
        ('lr.base', float('nan'), r'config.lr.base=nan must be a finite number >= 0'),
        ('optim.b1', 1.0, r'^config.optim.b1=1.0 must be in \[0, 1\): set it to e.g. 0.9$'),
        ('optim.b2', -0.5, r'config.optim.b2=-0.5 must be in \[0, 1\)'),
        (
            'optim.weight_decay',
            -0.1,
            r'config.optim.weight_decay=-0.1 must be a finite number >= 0',
        ),
        ('optim.momentum', 1.5, r'config.optim.momentum=1.5 must be in \[0, 1\)'),
        ('grad_clip_norm', -1.0, r'config.grad_clip_norm=-1.0 must be a finite number >= 0'),
        ('lr.base', float('inf'), r'config.lr.base=inf must be a finite number >= 0'),
    ],
)
def test_bad_numbers_are_one_line_errors(field, value, match):
  config = helpers.load_config('demo', {field: value})
  for check in (
      lambda: optim.check_optim(config, helpers.model_config(config)),
      lambda: optim.make_optimizer(config, 10, helpers.model_config(config)),
  ):
    with pytest.raises(ValueError, match=match) as e:
      check()
    assert '\n' not in str(e.value)


@pytest.mark.parametrize('name', ['adamw', 'sgd', 'adafactor', 'big_vision_adafactor'])
@pytest.mark.parametrize('frozen', [(), ('^frozen$',)])
def test_schedule_step_is_the_step_whose_rate_the_update_applies(name, frozen):
  # A step skipped for non-finite gradients leaves the optimizer's count behind the train state's
  # step: from then on the update applies schedule(step - 1), which the logged rate must show.
  config = helpers.load_config(
      'demo',
      {
          'optim.name': name,
          **({'optim.momentum': 0.0} if name in ('sgd', 'big_vision_adafactor') else {}),
          'optim.weight_decay': 0.0,
          'optim.frozen': frozen,
          'grad_clip_norm': 0.0,
          'skip_nonfinite_steps': 3,
          'lr.base': 1.0,
          'lr.warmup_steps': 2,
          'lr.decay': 'linear',
          'lr.end': 0.0,
      },
  )
  tx, schedule = optim.make_optimizer(config, 8, helpers.model_config(config))
  params = {'w': jnp.ones(()), 'frozen': jnp.ones(())}
  state = tx.init(params)
  one_step = jax.jit(tx.update)
  applied, reported = [], []
  for step in range(6):
    grad = jnp.nan if step == 2 else 1.0  # Step 2 is skipped.
    reported.append(float(schedule(optim.schedule_step(state, jnp.asarray(step)))))
    updates, state = one_step({'w': jnp.asarray(grad), 'frozen': jnp.ones(())}, state, params)
    # A gradient of 1 on a parameter of 1: each optimizer's update is -lr (Adam's m / sqrt(v) is 1,
    # Adafactor's relative step is scaled by the parameter's RMS of 1, big_vision's g / sqrt(g^2)).
    applied.append(-float(updates['w']))
    if frozen:  # A frozen parameter is in no count and never moves.
      assert not np.any(updates['frozen'])
  assert reported == pytest.approx([0.0, 0.5, 1.0, 1.0, 5 / 6, 4 / 6], abs=1e-6)
  assert applied == pytest.approx([0.0, 0.5, 0.0, 1.0, 5 / 6, 4 / 6], abs=1e-5)
  assert float(schedule(5)) == pytest.approx(0.5)  # The train state's step is one ahead.


def test_schedule_step_without_skipping_is_the_train_step():
  config = helpers.load_config('demo', {'lr.warmup_steps': 0})
  tx, _ = optim.make_optimizer(config, 8, helpers.model_config(config))
  params = {'dense': {'kernel': jnp.ones((2, 2))}}
  state = tx.init(params)
  for step in range(3):
    assert int(optim.schedule_step(state, jnp.asarray(step))) == step
    _, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
