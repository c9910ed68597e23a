"""vit_jax.tools.calibration: the expected calibration error against scikit-learn's reliability curve,
the temperature against scipy's minimiser of the NLL, and what the confusion and predict tools make
of them."""

import numpy as np
import pytest
import scipy.optimize
import scipy.special
from sklearn import calibration as sk_calibration

from vit_jax.tools import calibration


def _overconfident(seed: int, n: int = 2000, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
  """Logits of a classifier right about 70% of the time, three times too sure of itself."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, classes, n)
  logits = rng.normal(size=(n, classes))
  logits[np.arange(n), labels] += 1.5
  return 3.0 * logits, labels


@pytest.mark.parametrize('seed', range(3))
def test_the_ece_is_the_reliability_curves_gap(seed):
  logits, labels = _overconfident(seed)
  probabilities = scipy.special.softmax(logits, axis=-1)
  confidence = probabilities.max(-1)
  confidence[:5] = np.linspace(0, 1, calibration.BINS + 1)[[3, 7, 9, 14, 15]]  # On bin edges.
  probabilities[:5] = 0
  probabilities[np.arange(5), labels[:5]] = confidence[:5]
  correct = probabilities.argmax(-1) == labels
  accuracy, mean = sk_calibration.calibration_curve(
      correct, confidence, n_bins=calibration.BINS, strategy='uniform'
  )
  # scikit-learn's bins: its inner edges, searched from the left.
  bins = np.searchsorted(np.linspace(0, 1, calibration.BINS + 1)[1:-1], confidence)
  counts = np.bincount(bins, minlength=calibration.BINS)
  expected = np.sum(counts[counts > 0] * np.abs(accuracy - mean)) / len(labels)
  assert calibration.expected_calibration_error(probabilities, labels) == pytest.approx(
      expected, abs=1e-12
  )
  rows = calibration.reliability(probabilities, labels)
  assert [count for _, _, count, _, _ in rows] == list(counts)
  assert expected > 0.1  # Overconfident: the measure is not trivially small.


@pytest.mark.parametrize('seed', range(3))
def test_the_temperature_minimises_the_nll_as_scipy_finds(seed):
  logits, labels = _overconfident(seed)
  found = scipy.optimize.minimize_scalar(
      lambda t: calibration.nll(logits, labels, t),
      bounds=(0.01, 100),
      method='bounded',
      options={'xatol': 1e-10},
  )
  temperature = calibration.fit_temperature(logits, labels)
  assert temperature == pytest.approx(found.x, rel=1e-4)
  assert temperature > 1.5  # The logits were made three times too large.
  assert calibration.nll(logits, labels, temperature) < calibration.nll(logits, labels)
  probabilities = calibration.softmax(logits, temperature)
  assert (
      calibration.expected_calibration_error(probabilities, labels)
      < calibration.expected_calibration_error(calibration.softmax(logits), labels) / 3
  )


def test_a_separable_split_takes_the_end_of_the_range():
  logits = np.eye(4) * 10
  assert calibration.fit_temperature(logits, np.arange(4)) == pytest.approx(0.01)
  assert calibration.fit_temperature(logits, np.array([1, 2, 3, 0])) == pytest.approx(100)
  assert 'the end of the range searched' in calibration.summary(logits, np.arange(4))
  assert 'NLL 0.0000' in calibration.summary(logits, np.arange(4))  # Not -0.0000.
