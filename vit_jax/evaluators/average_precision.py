"""Average precision of multi-label predictions, the mAP of PASCAL VOC and COCO classification.

A class's AP is the mean, over its positive examples, of the precision among the examples scored at
least as high as that one for the class (all examples of equal scores count together): sklearn's
`average_precision_score`, no interpolation. The mAP is the mean over the classes with a positive.
"""

import numpy as np

# Classes sorted at once: the sort's [examples, classes] int64 indices bound the memory.
_CLASSES_AT_ONCE = 256


def _class_aps(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
  order = np.argsort(-scores, axis=0, kind='stable')
  ranked = np.take_along_axis(scores, order, axis=0)
  positive = np.take_along_axis(labels, order, axis=0)
  true_positives = np.cumsum(positive, axis=0)
  rank = np.arange(len(scores))[:, None]
  # Each example's precision is that at the last example of its group of equal scores.
  group_end = np.ones(ranked.shape, bool)
  group_end[:-1] = ranked[1:] != ranked[:-1]
  last = np.minimum.accumulate(np.where(group_end, rank, len(scores))[::-1], axis=0)[::-1]
  precision = np.take_along_axis(true_positives, last, axis=0) / (last + 1)
  with np.errstate(invalid='ignore'):  # 0 / 0 for a class with no positive: NaN.
    return np.sum(precision * positive, axis=0) / np.sum(positive, axis=0)


def average_precisions(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """The AP of each class [classes] from `scores` [examples, classes] (any monotone score: logits,
  probabilities) and `labels` (multi-hot bool, the same shape); NaN for a class with no positive."""
  if scores.shape != labels.shape or scores.ndim != 2:
    raise ValueError(f'scores {scores.shape} and labels {labels.shape} must be [examples, classes]')
  labels = labels.astype(bool)
  return np.concatenate(
      [
          _class_aps(scores[:, i : i + _CLASSES_AT_ONCE], labels[:, i : i + _CLASSES_AT_ONCE])
          for i in range(0, scores.shape[1], _CLASSES_AT_ONCE)
      ]
  )


def mean_average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
  """The mean AP of the classes with a positive among `labels`; NaN where none has one."""
  aps = average_precisions(scores, labels)
  return float(np.mean(aps[~np.isnan(aps)])) if np.any(~np.isnan(aps)) else float('nan')
