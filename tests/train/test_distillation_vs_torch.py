"""Distillation against DeiT's own code: its `DistillationLoss` (facebookresearch/deit losses.py, copied
below as the reference) on fixed logits, and teachers read from timm checkpoints."""

import ml_collections
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import helpers
from torch_references import timm_saved
from vit_jax.tasks import classification, distillation
from vit_jax.train import setup as train_setup


def _deit_loss(outputs, outputs_kd, labels, teacher_outputs, *, kind, alpha, tau, smoothing):
  """DeiT's DistillationLoss.forward, its base criterion the label-smoothed cross-entropy."""
  base_loss = F.cross_entropy(outputs, labels, label_smoothing=smoothing)
  if kind == 'soft':
    T = tau
    distillation_loss = (
        F.kl_div(
            F.log_softmax(outputs_kd / T, dim=1),
            F.log_softmax(teacher_outputs / T, dim=1),
            reduction='sum',
            log_target=True,
        )
        * (T * T)
        / outputs_kd.numel()
    )
  else:
    distillation_loss = F.cross_entropy(outputs_kd, teacher_outputs.argmax(dim=1))
  return base_loss * (1 - alpha) + distillation_loss * alpha


@pytest.mark.parametrize(
    'kind,alpha,tau,smoothing',
    [
        ('hard', 0.5, 1.0, 0.0),
        ('hard', 0.3, 1.0, 0.1),
        ('soft', 0.5, 1.0, 0.0),
        ('soft', 0.7, 3.0, 0.1),
    ],
)
def test_the_distillation_loss_is_deits_on_fixed_logits(kind, alpha, tau, smoothing):
  rng = np.random.RandomState(0)
  outputs, outputs_kd, teacher = (3 * rng.randn(6, 7).astype(np.float32) for _ in range(3))
  labels = rng.randint(0, 7, 6)
  distill = ml_collections.ConfigDict(dict(teacher='t', kind=kind, alpha=alpha, temperature=tau))
  base = classification.compute_loss(
      outputs, labels, loss=optax.softmax_cross_entropy, label_smoothing=smoothing
  )
  ours = distillation.combine(distill, base, outputs_kd, teacher)
  expected = _deit_loss(
      *(torch.from_numpy(x) for x in (outputs, outputs_kd)),
      torch.from_numpy(labels),
      torch.from_numpy(teacher),
      kind=kind,
      alpha=alpha,
      tau=tau,
      smoothing=smoothing,
  )
  np.testing.assert_allclose(float(ours), float(expected), rtol=1e-5)


@pytest.mark.parametrize('tau', [1.0, 2.5])
def test_the_kl_distillation_loss_is_pytorchs_batchmean_kl_divergence(tau):
  """kind='kl': Hinton's distillation loss as PyTorch users write it (`F.kl_div(..., 'batchmean')`
  times T^2), as big_vision's `kl` distance averages it: the KL summed over the classes, a mean over
  the examples; with alpha 1 the labels do not count."""
  rng = np.random.RandomState(1)
  student, teacher = (3 * rng.randn(6, 7).astype(np.float32) for _ in range(2))
  distill = ml_collections.ConfigDict(dict(teacher='t', kind='kl', alpha=1.0, temperature=tau))
  ours = distillation.combine(distill, np.float32(123.0), student, teacher)
  expected = F.kl_div(
      F.log_softmax(torch.from_numpy(student) / tau, dim=1),
      F.softmax(torch.from_numpy(teacher) / tau, dim=1),
      reduction='batchmean',
  ) * (tau * tau)
  np.testing.assert_allclose(float(ours), float(expected), rtol=1e-5)


def test_a_timm_teacher_predicts_as_timm_and_must_know_the_runs_classes(tmp_path):
  reference = timm_saved(tmp_path / 'teacher')
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'distill.teacher': str(tmp_path / 'teacher')}
  )
  run = train_setup.prepare(config, str(tmp_path / 'w'))
  images = np.random.RandomState(1).uniform(-1, 1, (3, 8, 8, 3)).astype(np.float32)
  with torch.no_grad():
    expected = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  np.testing.assert_allclose(
      run.teacher.model.apply({'params': run.teacher.params}, images), expected, atol=1e-4
  )
  timm_saved(tmp_path / 'other', num_classes=3)
  config.distill.teacher = str(tmp_path / 'other')
  with pytest.raises(
      ValueError,
      match=r"^config.distill.teacher='.*other' predicts 3 classes, and the run has 10: the "
      r'teacher must be a classifier of the same classes',
  ):
    train_setup.prepare(config, str(tmp_path / 'w'))
