"""config.loss='asl', the asymmetric loss of multi-label classification (Ridnik et al. 2021), against
timm's AsymmetricLossMultiLabel: its value and its gradient, on label sets and on soft targets."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import torch
from timm.loss import asymmetric_loss

from vit_jax.tasks import classification


def _config(**asl) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
      {'loss': 'asl', 'asl': {'gamma_neg': None, 'gamma_pos': None, 'clip': None, **asl}}
  )


def _timm(logits, targets, **kwargs):
  x = torch.tensor(logits, requires_grad=True)
  loss = asymmetric_loss.AsymmetricLossMultiLabel(**kwargs)(x, torch.tensor(targets))
  loss.backward()
  return loss.item(), x.grad.numpy()


@pytest.mark.parametrize(
    'asl',
    [
        {},  # timm's defaults: gamma_neg 4, gamma_pos 1, clip 0.05.
        {'gamma_neg': 2.0, 'gamma_pos': 0.0, 'clip': 0.0},
        {'gamma_neg': 0.0, 'gamma_pos': 0.0, 'clip': 0.0},  # Sigmoid cross-entropy.
        {'gamma_neg': 3.0, 'gamma_pos': 2.0, 'clip': 0.2},
    ],
)
@pytest.mark.parametrize('soft', [False, True])
def test_asl_is_timms(asl, soft):
  rng = np.random.default_rng(len(asl) + soft)
  # Within +-8: beyond, timm's float32 1 - sigmoid(x) loses digits (the last test).
  logits = np.clip(rng.normal(0, 4, (16, 12)), -8, 8).astype(np.float32)
  targets = rng.random((16, 12)) < 0.3
  targets = rng.random((16, 12)).astype(np.float32) if soft else targets.astype(np.float32)
  per_example = classification.loss_of_examples(_config(**asl))
  ours, grad = jax.value_and_grad(lambda x: per_example(x, jnp.asarray(targets)).mean())(logits)
  expected, expected_grad = _timm(logits, targets, **asl)
  assert float(ours) == pytest.approx(expected, rel=1e-5)
  np.testing.assert_allclose(grad, expected_grad, rtol=1e-4, atol=1e-7)
  if not asl.get('gamma_neg', 4.0) and not asl.get('gamma_pos', 1.0) and not asl.get('clip', 0.05):
    xent = classification.loss_of_examples(ml_collections.ConfigDict({'loss': 'sigmoid_xent'}))
    assert float(ours) == pytest.approx(float(xent(logits, targets).mean()), rel=1e-5)


def test_a_confident_wrong_logit_costs_what_it_should_where_timms_clamps():
  """A negative at logit 17 costs -log(1 - sigmoid(17)) = 17 + log1p(e^-17) (gamma 0, no clip), which
  float32 keeps as a log-sigmoid; timm's float32 1 - sigmoid(17) is 0, clamped to its eps 1e-8: 18.42.
  """
  logits, targets = np.array([[17.0, -17.0]], np.float32), np.array([[0.0, 1.0]], np.float32)
  settings = {'gamma_neg': 0.0, 'gamma_pos': 0.0, 'clip': 0.0}
  ours = classification.loss_of_examples(_config(**settings))(logits, targets)
  assert float(ours[0]) == pytest.approx(2 * (17 + np.log1p(np.exp(-17.0))), rel=1e-6)
  # The positive at -17 is p = 4e-8, above timm's eps: its loss is right.
  expected = 17 + np.log1p(np.exp(-17.0)) - np.log(1e-8)
  assert _timm(logits, targets, **settings)[0] == pytest.approx(expected, rel=1e-6)
