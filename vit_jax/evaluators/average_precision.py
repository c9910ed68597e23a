"""Average precision of multi-label predictions, the mAP of PASCAL VOC and COCO classification.

A class's AP is the mean, over its positive examples, of the precision among the examples scored at
least as high as that one for the class (all examples of equal scores count together): sklearn's
`average_precision_score`, no interpolation. The mAP is the mean over the classes with a positive.

In jax, so that an evaluation computes it where the scores are, its classes split over the devices
(each sorts its classes' columns): a split's [examples, classes] scores need not fit one host.
"""

import jax
import jax.numpy as jnp
import numpy as np


def class_aps(scores: jax.Array, labels: jax.Array) -> jax.Array:
  """The AP of each class [classes] from `scores` [examples, classes] (any monotone score: logits,
  probabilities; -inf ranks last) and `labels` (multi-hot, the same shape); NaN for a class with no
  positive. Traceable; every step runs along the examples, so a split of the classes stays local."""
  examples = scores.shape[0]
  order = jnp.argsort(-scores, axis=0)
  ranked = jnp.take_along_axis(scores, order, axis=0)
  positive = jnp.take_along_axis(labels, order, axis=0).astype(jnp.float32)
  # Exact counts up to 2^24 examples.
  true_positives = jnp.cumsum(positive, axis=0)
  rank = jnp.arange(examples)[:, None]
  # Each example's precision is that at the last example of its group of equal scores.
  group_end = jnp.concatenate([ranked[1:] != ranked[:-1], jnp.ones_like(ranked[:1], bool)])
  last = jax.lax.cummin(jnp.where(group_end, rank, examples), axis=0, reverse=True)
  precision = jnp.take_along_axis(true_positives, last, axis=0) / (last + 1)
  return jnp.sum(precision * positive, axis=0) / jnp.sum(positive, axis=0)  # 0 / 0: NaN.


def mean_average_precision(scores: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """The mean AP over the classes with a positive of the rows of `mask` [examples] (the others, a
  batch's padding, left out); NaN where no class has one. Traceable."""
  scores = jnp.where(mask[:, None], scores, -jnp.inf)
  return jnp.nanmean(class_aps(scores, labels & mask[:, None]))


def average_precisions(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
  """`class_aps` of arrays on the host (in float32), as a host array."""
  if scores.shape != labels.shape or scores.ndim != 2:
    raise ValueError(f'scores {scores.shape} and labels {labels.shape} must be [examples, classes]')
  return np.asarray(_class_aps(np.asarray(scores, np.float32), np.asarray(labels, bool)))


_class_aps = jax.jit(class_aps)
