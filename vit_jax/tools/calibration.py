"""How far a softmax classifier's confidence is from its accuracy, and the temperature that mends it
(Guo et al. 2017, "On Calibration of Modern Neural Networks"): the expected calibration error over
equal-width bins of confidence, and temperature scaling, one scalar T that divides the logits, fit
to minimise the negative log-likelihood of a split. The confusion tool reports both; predict
`--temperature=T` applies T.
"""

import numpy as np

BINS = 15  # Guo et al.'s.
# The temperatures searched: far beyond what a trained classifier needs either way.
_LOG_BETA_RANGE = (np.log(1e-2), np.log(1e2))


def reliability(
    probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS
) -> list[tuple[float, float, int, float, float]]:
  """(lower, upper, examples, mean confidence, accuracy) of each bin (lower, upper] of the top class's
  probability; the mean and accuracy of an empty bin are NaN."""
  confidence = probabilities.max(-1)
  correct = probabilities.argmax(-1) == labels
  edges = np.linspace(0.0, 1.0, bins + 1)
  which = np.clip(np.searchsorted(edges, confidence, side='left') - 1, 0, bins - 1)
  rows = []
  for b in range(bins):
    inside = which == b
    count = int(inside.sum())
    rows.append(
        (
            float(edges[b]),
            float(edges[b + 1]),
            count,
            float(confidence[inside].mean()) if count else float('nan'),
            float(correct[inside].mean()) if count else float('nan'),
        )
    )
  return rows


def table(logits: np.ndarray, labels: np.ndarray) -> list[list]:
  """`reliability`'s bins of softmax(logits), those `summary`'s ECE is of, as rows of a CSV file
  with its header."""
  return [
      ['lower', 'upper', 'examples', 'confidence', 'accuracy'],
      *(
          [f'{lower:.4f}', f'{upper:.4f}', count, f'{mean:.6f}', f'{accuracy:.6f}']
          for lower, upper, count, mean, accuracy in reliability(softmax(logits), labels)
      ),
  ]


def expected_calibration_error(
    probabilities: np.ndarray, labels: np.ndarray, bins: int = BINS
) -> float:
  """Sum over the bins of |accuracy - mean confidence|, weighted by the share of examples in each."""
  return float(
      sum(
          count * abs(accuracy - mean)
          for _, _, count, mean, accuracy in reliability(probabilities, labels, bins)
          if count
      )
      / len(labels)
  )


def _log_softmax(logits: np.ndarray) -> np.ndarray:
  shifted = logits - logits.max(-1, keepdims=True)
  return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def softmax(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
  """softmax(logits / temperature) in float64."""
  return np.exp(_log_softmax(logits.astype(np.float64) / temperature))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float = 1.0) -> float:
  """The mean negative log-likelihood of `labels` under softmax(logits / temperature)."""
  log_p = _log_softmax(logits.astype(np.float64) / temperature)
  return max(0.0, float(-np.mean(log_p[np.arange(len(labels)), labels])))  # Not -0.0.


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
  """The temperature T in [0.01, 100] of the least `nll`: the NLL is convex in 1 / T, so its
  derivative, the mean over examples of E_softmax[z] - z_label (z the scaled logits), is increasing
  in 1 / T and bisected to its zero (or the range's end it stays on one side of)."""
  logits = logits.astype(np.float64)
  picked = logits[np.arange(len(labels)), labels]

  def slope(log_beta: float) -> float:
    beta = np.exp(log_beta)
    p = np.exp(_log_softmax(beta * logits))
    return float(np.mean((p * logits).sum(-1) - picked))

  low, high = _LOG_BETA_RANGE
  if slope(low) >= 0:
    return float(np.exp(-low))
  if slope(high) <= 0:
    return float(np.exp(-high))
  for _ in range(60):  # The range's width halved 60 times: far below float64's 1e-16.
    middle = (low + high) / 2
    low, high = (middle, high) if slope(middle) < 0 else (low, middle)
  return float(np.exp(-(low + high) / 2))


def summary(logits: np.ndarray, labels: np.ndarray) -> str:
  """One line: the ECE and NLL as they are, and at the temperature that minimises the NLL here."""
  temperature = fit_temperature(logits, labels)
  measures = []
  for t in (1.0, temperature):
    probabilities = softmax(logits, t)
    measures.append(
        f'ECE {expected_calibration_error(probabilities, labels):.4f}, '
        f'NLL {nll(logits, labels, t):.4f}'
    )
  bounds = np.exp(-np.array(_LOG_BETA_RANGE))
  fit = (
      'the end of the range searched: this split, all right or all wrong, cannot set it'
      if np.isclose(temperature, bounds).any()
      else 'of the least NLL on this split: predict --temperature'
  )
  return (
      f'calibration: {measures[0]} ({BINS} bins of confidence); at temperature '
      f'{temperature:.3f} ({fit}): {measures[1]}'
  )
