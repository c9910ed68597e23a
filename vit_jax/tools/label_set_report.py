"""The confusion tool's report of a multi-label run (a set of classes an image): each class's average
precision, and its precision, recall and F1 where a class is predicted at a probability of at least
`threshold`; their macro averages, the subset accuracy (every class of an image right); the most
confident mistakes (a class predicted that the image does not have, or one it has and was not)."""

import numpy as np

from vit_jax.evaluators import average_precision

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
    labels: np.ndarray, probabilities: np.ndarray, threshold: float
) -> dict[str, np.ndarray]:
  """Each class's AP (NaN without a positive), and `scores_of_counts` at `threshold`, from multi-hot
  `labels` and `probabilities` [n, classes]."""
  predicted = probabilities >= threshold
  return {
      'ap': average_precision.average_precisions(probabilities, labels),
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
) -> str:
  """The classes worst AP first (`top` of them), the averages, then the `top` most confident
  mistakes."""
  metrics = per_class(labels, probabilities, threshold)
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
) -> dict[str, list[list]]:
  """per_class.csv's and mistakes.csv's rows."""
  metrics = per_class(labels, probabilities, threshold)
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
  }
