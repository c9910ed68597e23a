"""A step with frozen parameters computes no gradient for them: a linear probe (the backbone frozen)
costs its forward pass, not a whole backward pass; what trains trains as before."""

import numpy as np
import pytest

import helpers
from vit_jax.train import step as train_step

_PROBE = ('^(?!head/)',)  # Every parameter but the head's.


@pytest.mark.parametrize('accum_steps', [1, 2])
def test_a_linear_probes_step_computes_no_backward_pass_of_the_backbone(tmp_path, accum_steps):
  full = helpers.compiled_flops(
      *helpers.jitted_step(tmp_path / 'full', {'accum_steps': accum_steps})
  )
  probe = helpers.compiled_flops(
      *helpers.jitted_step(tmp_path / 'probe', {'accum_steps': accum_steps, 'optim.frozen': _PROBE})
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
  step, ours, batch = helpers.jitted_step(tmp_path / 'ours', overrides)
  before = helpers.flat_params(ours.params)
  # Three steps: at the first the head is zeros, and so is every gradient before it.
  for _ in range(3):
    ours, metrics = step(ours, batch)
  # The step as it was: every gradient computed, the optimizer alone freezing.
  monkeypatch.setattr(train_step, '_trained_only', lambda grad_fn, labels: grad_fn)
  step, reference, batch = helpers.jitted_step(tmp_path / 'every_gradient', overrides)
  for _ in range(3):
    reference, reference_metrics = step(reference, batch)
  ours, reference = helpers.flat_params(ours.params), helpers.flat_params(reference.params)
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
