"""The confusion tool's report of a multi-label run (a set of classes an image): each class's average
precision, and its precision, recall and F1 where a class is predicted at a probability of at least
`threshold`; their macro averages, the subset accuracy (every class of an image right); the most
confident mistakes (a class predicted that the image does not have, or one it has and was not); and
each class's threshold of the best F1 on the split (thresholds.csv, which `predict --thresholds` reads).
"""

import csv
import io
from typing import Optional

from etils import epath
import numpy as np

from vit_jax.evaluators import average_precision

THRESHOLDS = 'thresholds.csv'
MISSED, WRONG = 'missed', 'wrong'  # A class of the set not predicted; one predicted not in the set.


def scores_of_counts(
    correct: np.ndarray, predicted: np.ndarray, support: np.ndarray
) -> dict[str, np.ndarray]:
  """Each class's precision, recall and F1 (scikit-learn's definitions; 0 where a ratio has nothing
  to divide by, as its zero_division=0) and support, from its counts of right predictions,
  predictions and examples; of one class an image (the confusion tool's) and of label sets alike."""
  ratio = lambda a, b: np.divide(a, b, out=np.zeros_like(a, np.float64), where=b > 0)
  correct = correct.astype(np.float64)
  precision, recall = ratio(correct, predicted), ratio(correct, support)
  return {
      'precision': precision,
      'recall': recall,
      'f1': ratio(2 * precision * recall, precision + recall),
      'support': support,
  }


def per_class(
    labels: np.ndarray,
    probabilities: np.ndarray,
    threshold: float,
    logits: Optional[np.ndarray] = None,
) -> dict[str, np.ndarray]:
  """Each class's AP (NaN without a positive), and `scores_of_counts` at `threshold`, from multi-hot
  `labels` and `probabilities` [n, classes]; the AP ranks the `logits` where given, as the run's
  eval_map does (float32 sigmoids are all 1.0 from a logit of 16.6 on: tied)."""
  predicted = probabilities >= threshold
  return {
      'ap': average_precision.average_precisions(
          probabilities if logits is None else logits, labels
      ),
      **scores_of_counts(np.sum(predicted & labels, 0), predicted.sum(0), labels.sum(0)),
  }


def averages(
    metrics: dict[str, np.ndarray], labels: np.ndarray, probabilities: np.ndarray, threshold: float
) -> dict[str, float]:
  """The mAP (over the classes with a positive), the macro precision, recall and F1 (over every
  class, as scikit-learn's of a multi-label indicator) and the subset accuracy."""
  aps = metrics['ap'][~np.isnan(metrics['ap'])]
  return {
      'map': float(aps.mean()) if aps.size else float('nan'),
      **{name: float(metrics[name].mean()) for name in ('precision', 'recall', 'f1')},
      'subset_accuracy': float(np.all((probabilities >= threshold) == labels, axis=1).mean()),
  }


def f1_thresholds(labels: np.ndarray, probabilities: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Each class's threshold of the highest F1 on these examples [classes] (a class predicted at a
  probability >= it; of equal F1s the highest threshold, the fewest predictions), and that F1 (the
  best of sklearn's precision_recall_curve); inf and 0 for a class with no positive."""
  examples, classes = labels.shape
  order = np.argsort(-probabilities, axis=0, kind='stable')
  ranked = np.take_along_axis(probabilities, order, axis=0)
  true_positives = np.cumsum(np.take_along_axis(labels, order, axis=0), axis=0)
  support = labels.sum(0)
  # Only the last of equal probabilities is a threshold: they are predicted together.
  group_end = np.ones(ranked.shape, bool)
  group_end[:-1] = ranked[1:] != ranked[:-1]
  predicted = np.arange(1, examples + 1)[:, None]
  f1 = np.where(group_end, 2 * true_positives / (predicted + support), -1.0)
  best, columns = f1.argmax(0), np.arange(classes)
  has_positive = support > 0
  return (
      np.where(has_positive, ranked[best, columns], np.inf),
      np.where(has_positive, f1[best, columns], 0.0),
  )


def mistakes(
    labels: np.ndarray, probabilities: np.ndarray, threshold: float
) -> list[tuple[int, int, str, float]]:
  """(example, class, MISSED or WRONG, the probability) of each wrong decision, the most confident
  first (a missed class's confidence is 1 - its probability)."""
  predicted = probabilities >= threshold
  rows, classes = np.nonzero(predicted != labels)
  shown = probabilities[rows, classes]
  confidence = np.where(labels[rows, classes], 1 - shown, shown)
  order = np.argsort(-confidence, kind='stable')
  return [
      (
          int(rows[i]),
          int(classes[i]),
          MISSED if labels[rows[i], classes[i]] else WRONG,
          float(shown[i]),
      )
      for i in order
  ]


def format_report(
    labels: np.ndarray,
    probabilities: np.ndarray,
    examples: list[str],
    class_names: tuple[str, ...],
    top: int,
    threshold: float,
    logits: Optional[np.ndarray] = None,
) -> str:
  """The classes worst AP first (`top` of them), the averages, then the `top` most confident
  mistakes (`logits`: see per_class)."""
  metrics = per_class(labels, probabilities, threshold, logits)
  width = max(12, *(len(n) for n in class_names))
  lines = [f'{"class":{width}}  ap      precision  recall  f1      support']
  present = np.flatnonzero(metrics['support'] > 0)
  for c in present[np.argsort(metrics['ap'][present], kind='stable')][:top]:
    lines.append(
        f'{class_names[c]:{width}}  {metrics["ap"][c]:.4f}  {metrics["precision"][c]:.4f}     '
        f'{metrics["recall"][c]:.4f}  {metrics["f1"][c]:.4f}  {metrics["support"][c]:7d}'
    )
  average = averages(metrics, labels, probabilities, threshold)
  lines.append(
      f'{"macro avg":{width}}  {average["map"]:.4f}  {average["precision"]:.4f}     '
      f'{average["recall"]:.4f}  {average["f1"]:.4f}  {int(metrics["support"].sum()):7d}'
  )
  lines.append(
      f'mAP {average["map"]:.4f}; subset accuracy {average["subset_accuracy"]:.4f} of '
      f'{len(labels)} images, a class predicted at a probability >= {threshold:g}'
  )
  _, best_f1 = f1_thresholds(labels, probabilities)
  lines.append(
      f"macro F1 {best_f1.mean():.4f} at each class's threshold of its best F1 on this split "
      '(thresholds.csv of --out; pick them on a split you do not report)'
  )
  wrong = mistakes(labels, probabilities, threshold)
  lines.append(f'{len(wrong)} mistakes, the most confident first:' if wrong else 'no mistakes')
  lines += [f'  {p:.4f}  {kind} {class_names[c]}: {examples[i]}' for i, c, kind, p in wrong[:top]]
  return '\n'.join(lines)


def tables(
    labels: np.ndarray,
    probabilities: np.ndarray,
    examples: list[str],
    class_names: tuple[str, ...],
    threshold: float,
    logits: Optional[np.ndarray] = None,
) -> dict[str, list[list]]:
  """per_class.csv's, mistakes.csv's and thresholds.csv's rows (`logits`: see per_class)."""
  metrics = per_class(labels, probabilities, threshold, logits)
  thresholds, best_f1 = f1_thresholds(labels, probabilities)
  return {
      'per_class.csv': [
          ['class', 'ap', 'precision', 'recall', 'f1', 'support'],
          *(
              [
                  name,
                  *(f'{metrics[m][c]:.6f}' for m in ('ap', 'precision', 'recall', 'f1')),
                  metrics['support'][c],
              ]
              for c, name in enumerate(class_names)
          ),
      ],
      'mistakes.csv': [
          ['example', 'class', 'mistake', 'probability'],
          *(
              [examples[i], class_names[c], kind, f'{p:.6f}']
              for i, c, kind, p in mistakes(labels, probabilities, threshold)
          ),
      ],
      THRESHOLDS: [
          ['class', 'threshold', 'f1'],
          *(
              [name, f'{thresholds[c]:.9g}', f'{best_f1[c]:.6f}']
              for c, name in enumerate(class_names)
          ),
      ],
  }


def read_thresholds(path: str, class_names: tuple[str, ...]) -> np.ndarray:
  """The thresholds [classes] of a thresholds.csv (`tables`) of a run of `class_names`; a one-line
  ValueError for a file of other classes or that does not read."""
  try:
    rows = list(csv.DictReader(io.StringIO(epath.Path(path).read_text())))
    by_class = {row['class']: float(row['threshold']) for row in rows}
  except (OSError, KeyError, TypeError, ValueError) as e:
    raise ValueError(
        f'{path} is not a thresholds.csv of class,threshold rows ({e}): write one with '
        'python -m vit_jax.tools.confusion --out=DIR on a run on label sets'
    ) from None
  if sorted(by_class) != sorted(class_names):
    missing = [name for name in class_names if name not in by_class][:3]
    raise ValueError(
        f"{path} holds thresholds of {len(by_class)} classes, not of this model's "
        f'{len(class_names)}'
        + (f' (none for {", ".join(missing)})' if missing else '')
        + ': write it from a run of these classes'
    )
  # inf: a class no example had (f1_thresholds), never predicted.
  bad = [f'{name}: {t}' for name, t in by_class.items() if not (0 <= t <= 1 or t == np.inf)]
  if bad:
    raise ValueError(
        f'{path} holds thresholds that are no probability ({", ".join(bad[:3])}): each must be in '
        '[0, 1] (or inf: never)'
    )
  return np.array([by_class[name] for name in class_names])


def chosen(probs: np.ndarray, thresholds: np.ndarray) -> list[int]:
  """The classes whose probability is at or above their threshold, the most probable first."""
  return [int(c) for c in np.argsort(-probs, kind='stable') if probs[c] >= thresholds[c]]


def prediction_thresholds(
    loss: str, class_names: tuple[str, ...], threshold: float | None, path: str | None
) -> np.ndarray | None:
  """predict's --threshold (one for all classes) or --thresholds (a thresholds.csv) as each class's
  threshold [classes]; None for neither. A one-line ValueError for both, or for a model whose `loss`
  does not score each class on its own."""
  if threshold is None and path is None:
    return None
  from vit_jax.tasks import classification  # pylint: disable=g-import-not-at-top

  if threshold is not None and path is not None:
    raise ValueError('pass one of --threshold and --thresholds')
  given = '--threshold' if threshold is not None else '--thresholds'
  if loss not in classification.SIGMOID_LOSSES:
    raise ValueError(
        f'{given} picks a set of classes an image, of a model trained with a sigmoid loss '
        f'({", ".join(classification.SIGMOID_LOSSES)}); this one was trained with '
        f'{loss}: drop {given}'
    )
  if threshold is None:
    return read_thresholds(path, class_names)
  if not 0 < threshold < 1:
    raise ValueError(f'--threshold={threshold} must be a probability in (0, 1), e.g. 0.5')
  return np.full(len(class_names), threshold)
