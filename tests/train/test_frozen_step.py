"""A step with frozen parameters computes no gradient for them: a linear probe (the backbone frozen)
costs its forward pass, not a whole backward pass; what trains trains as before."""

import jax
import numpy as np
import pytest

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import checkpoint
from vit_jax.train import setup as train_setup, state as train_state, step as train_step

_PROBE = ('^(?!head/)',)  # Every parameter but the head's.


def _step_and_state(tmp_path, overrides):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': str(tmp_path / 'tfds'),
          'batch_size': 32,
          'lr.warmup_steps': 0,
          **overrides,
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  manager = checkpoint.make_manager(str(tmp_path / 'run'), 1)
  state, shardings, _ = train_state.create_state(setup, manager)
  rng = np.random.default_rng(0)
  batch = {
      'image': rng.integers(0, 256, (32, 8, 8, 3), np.uint8),
      'label': rng.integers(0, 10, 32).astype(np.int32),
  }
  return (
      train_step.jit_train_step(setup, shardings),
      state,
      sharding.global_batch(batch, setup.mesh),
  )


def _flops(step, state, batch):
  costs = step.lower(state, batch).compile().cost_analysis()
  return (costs[0] if isinstance(costs, list) else costs)['flops']


@pytest.mark.parametrize('accum_steps', [1, 2])
def test_a_linear_probes_step_computes_no_backward_pass_of_the_backbone(tmp_path, accum_steps):
  full = _flops(*_step_and_state(tmp_path / 'full', {'accum_steps': accum_steps}))
  probe = _flops(
      *_step_and_state(tmp_path / 'probe', {'accum_steps': accum_steps, 'optim.frozen': _PROBE})
  )
  # A backward pass costs about twice the forward: the whole step ~3x the forward alone. Before
  # the frozen gradients were zeros from the start, the probe's step cost 99.7% of the full one's.
  assert probe < 0.45 * full, (probe, full)


@pytest.mark.parametrize('skip_nonfinite_steps', [0, 2])
def test_frozen_parameters_stay_and_the_others_train_as_with_every_gradient_computed(
    tmp_path, monkeypatch, skip_nonfinite_steps
):
  overrides = {
      'optim.frozen': ('^embedding/', 'encoderblock_0/'),
      'skip_nonfinite_steps': skip_nonfinite_steps,
      # SGD: Adam's first steps are about lr * sign(grad), which turns float noise in zero
      # gradients (the keys' bias: the softmax ignores it) into differences of 2 * lr.
      'optim.name': 'sgd',
  }
  step, ours, batch = _step_and_state(tmp_path / 'ours', overrides)
  before = _flat(ours.params)
  # Three steps: at the first the head is zeros, and so is every gradient before it.
  for _ in range(3):
    ours, metrics = step(ours, batch)
  # The step as it was: every gradient computed, the optimizer alone freezing.
  monkeypatch.setattr(train_step, '_trained_only', lambda grad_fn, labels: grad_fn)
  step, reference, batch = _step_and_state(tmp_path / 'every_gradient', overrides)
  for _ in range(3):
    reference, reference_metrics = step(reference, batch)
  ours, reference = _flat(ours.params), _flat(reference.params)
  trained = 0
  for path, value in ours.items():
    if path.startswith('embedding/') or 'encoderblock_0/' in path:
      np.testing.assert_array_equal(value, before[path], err_msg=path)
    else:
      np.testing.assert_allclose(value, reference[path], rtol=1e-5, atol=1e-7, err_msg=path)
      trained += not np.array_equal(value, before[path])
  assert trained >= 10
  assert float(metrics['train_loss']) == pytest.approx(float(reference_metrics['train_loss']))
  # The gradient norm is the trained parameters' (clipping's), no longer the frozen ones' too.
  assert 0 < float(metrics['grad_norm']) < float(reference_metrics['grad_norm'])


def _flat(params):
  return {
      jax.tree_util.keystr(path, simple=True, separator='/'): np.asarray(value)
      for path, value in jax.tree_util.tree_leaves_with_path(jax.device_get(params))
  }
