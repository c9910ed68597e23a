"""Few-shot linear evaluation: the paper's cheap proxy for how good a frozen representation is.

For `shots` train images per class, the frozen model's pre-logits features are fitted to {-1, 1}
one-hot targets by closed-form L2-regularised least squares, and the fit is scored on the eval split;
the accuracy is averaged over `seeds` random choices of the shots (paper Sec. 4 and Appendix; as
big_vision's few-shot evaluator, the same shots for a seed, one fixed regularisation: big_vision's
configs use l2_reg 2^10, ours 2^2, which gives the same accuracies as its code at the same value).
`FewShotEvaluator` measures it in the training loop (config.fewshot, or an evaluator of type 'fewshot'
in config.evals) and for `python -m vit_jax.tools.fewshot` on a saved run.
"""

import math
from typing import Any, Optional, Sequence

from absl import logging
import flax.linen as nn
import ml_collections
import numpy as np
from jax.sharding import Mesh

from vit_jax import data
from vit_jax.evaluators import features, resolution
from vit_jax.evaluators.base import Context, check_fields, whole_number


def sample_shots(
    labels: np.ndarray, shots: int, num_classes: int, rng: np.random.Generator
) -> np.ndarray:
  """Indices of `shots` random examples of each class (raises ValueError if a class has fewer).

  The first `shots` of a random order of each class: generators in the same state draw nested sets,
  the 1-shot examples among the 5-shot ones, and so on.
  """
  chosen = []
  for label in range(num_classes):
    members = np.flatnonzero(labels == label)
    if len(members) < shots:
      raise ValueError(
          f'class {label} has {len(members)} readable train examples, fewer than '
          f'{shots} shots: use fewer shots'
      )
    chosen.append(rng.permutation(members)[:shots])
  return np.concatenate(chosen)


def fit_and_score(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    l2_reg: float,
) -> float:
  """Accuracy on the test set of ridge regression from features to {-1, 1} one-hot targets."""
  # Standardising with the train statistics makes one l2_reg fit features of any scale. Centring
  # features and targets leaves the bias out of the penalty: the bias is the targets' mean.
  mean, std = train_feats.mean(0), train_feats.std(0) + 1e-5
  x = (train_feats - mean) / std
  y = 2.0 * np.eye(num_classes)[train_labels] - 1.0
  y_mean = y.mean(0)
  weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(x.shape[1]), x.T @ (y - y_mean))
  scores = ((test_feats - mean) / std) @ weights + y_mean
  return float(np.mean(scores.argmax(-1) == test_labels))


def linear_fewshot_accuracy(
    train_feats: np.ndarray,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    *,
    shots: Sequence[int],
    seeds: int,
    l2_reg: float,
) -> dict[int, float]:
  """Mean test accuracy over `seeds` random draws of the train shots, for each number of shots.

  Features are [n, D], labels [n] ints from 0 to the number of classes - 1. Seed s draws nested
  shots: its 1-shot examples are among its 5-shot ones, and so on.
  """
  train_feats, test_feats = np.asarray(train_feats, np.float64), np.asarray(test_feats, np.float64)
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  accuracies = {}
  for n in shots:
    scores = []
    for seed in range(seeds):
      chosen = sample_shots(train_labels, n, num_classes, np.random.default_rng(seed))
      scores.append(
          fit_and_score(
              train_feats[chosen],
              train_labels[chosen],
              test_feats,
              test_labels,
              num_classes,
              l2_reg,
          )
      )
    accuracies[n] = float(np.mean(scores))
  return accuracies


class FewShotEvaluator:
  """Few-shot accuracy of parameters, on the unaugmented train and eval splits of a config's data.

  `model` returns features (a task's `features_model`); the parameters may carry a head, which it
  ignores. Works on any mesh and any number of hosts: every host gets all features and computes the
  same numbers.
  """

  def __init__(
      self,
      name: str,
      every_steps: Optional[int],
      *,
      config: ml_collections.ConfigDict,
      model: nn.Module,
      mesh: Mesh,
      num_classes: int,
      shots: Sequence[int],
      seeds: int,
      l2_reg: float,
      train_split: Optional[str] = None,
      eval_split: Optional[str] = None,
      fitted: bool = False,
  ):
    self.name, self.every_steps = name, every_steps
    self._splits = (train_split or config.train_split, eval_split or config.eval_split)
    self.features = features.SplitFeatures(
        config, self._splits, model=model, mesh=mesh, fitted=fitted
    )
    self._shots, self._seeds, self._l2_reg = tuple(shots), seeds, l2_reg
    self.metrics = tuple(f'{n}shot' for n in self._shots)
    self._num_classes = num_classes

  def accuracies(self, params: Any, skip_unfillable: bool = False) -> dict[int, float]:
    """Mean few-shot accuracy for each number of shots. A number of shots that a class of the train
    split has too few (readable) images for raises a ValueError, or with `skip_unfillable` is NaN,
    with a warning."""
    train_split, eval_split = self._splits
    train_feats, train_labels = self.features(params, train_split)
    shots = self._shots
    if skip_unfillable:
      counts = np.bincount(train_labels, minlength=self._num_classes)
      shots = tuple(n for n in self._shots if n <= counts.min())
      if shots != self._shots:
        logging.warning(
            '%s: class %d of %r has %d readable images, too few for %s shots: not measured',
            self.name,
            counts.argmin(),
            train_split,
            counts.min(),
            ', '.join(str(n) for n in self._shots if n not in shots),
        )
    accuracies = (
        linear_fewshot_accuracy(
            train_feats,
            train_labels,
            *self.features(params, eval_split),
            shots=shots,
            seeds=self._seeds,
            l2_reg=self._l2_reg,
        )
        if shots
        else {}
    )
    return {n: accuracies.get(n, math.nan) for n in self._shots}

  def __call__(self, params: Any) -> dict[str, float]:
    """{'<n>shot': accuracy} for each number of shots n; NaN for shots a class cannot fill (found only
    now where reading the labels at the start would mean reading the split: tfds), so that the run
    goes on."""
    return {
        f'{n}shot': accuracy
        for n, accuracy in self.accuracies(params, skip_unfillable=True).items()
    }

  def close(self) -> None:
    self.features.close()


def check_values(shots: Any, seeds: Any, l2_reg: Any, where: str) -> None:
  """One-line ValueErrors for seeds that are not a whole number >= 1, an l2_reg not > 0, or shots
  that are not positive whole numbers."""
  # Checked as types too: a float seeds or shot count would pass the comparisons and fail only at the
  # first few-shot evaluation (range(), slicing), after the run has trained for a while.
  real = not isinstance(l2_reg, bool) and isinstance(l2_reg, (int, float, np.floating))
  if not whole_number(seeds) or not (real and 0 < l2_reg < math.inf):
    raise ValueError(
        f'{where} needs seeds >= 1 (a whole number) and l2_reg > 0, e.g. seeds=3, l2_reg=4'
    )
  if not isinstance(shots, (list, tuple)) or not shots or not all(whole_number(n) for n in shots):
    raise ValueError(
        f'{where}.shots={shots} must be positive numbers of images per class, '
        'e.g. (1, 5, 10, 25)'
    )


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> FewShotEvaluator:
  check_fields(
      name,
      fields,
      ('every_steps', 'shots', 'seeds', 'l2_reg'),
      ('train_split', 'eval_split', 'image_size', 'patch_size'),
  )
  where = f'config.{name}' if name == 'fewshot' else f'config.evals.{name}'
  features.check_one_class(where, context)
  check_values(fields.shots, fields.seeds, fields.l2_reg, where)
  config, model_config = context.config, context.model_config
  if resolution.is_sized(fields):
    config, model_config = resolution.sized(name, config, fields, context)
  # Unset (None, or absent from a config.evals entry): the run's splits.
  train_split = fields.get('train_split') or config.train_split
  eval_split = fields.get('eval_split') or config.eval_split
  num_train = context.count(train_split)
  features.count_eval_split(name, where, eval_split, context)
  num_classes = context.info.num_classes
  if max(fields.shots) * num_classes > num_train:
    raise ValueError(
        f'{where}.shots={fields.shots}: {max(fields.shots)} shots of {num_classes} '
        f'classes need more than the {num_train} images of {train_split!r}'
    )
  # Where the labels are listed (an image folder), a class short of shots is found here; elsewhere
  # (tfds: counting would mean reading the split) at the first few-shot evaluation.
  labels = data.listed_labels(config, train_split)
  if labels is not None:
    counts = np.bincount(labels, minlength=num_classes)
    short = [
        f'{context.info.class_names[c]} ({counts[c]})'
        for c in np.flatnonzero(counts < max(fields.shots))
    ]
    if short:
      raise ValueError(
          f'{where}.shots={fields.shots}: {len(short)} of the classes of {train_split!r} '
          f'have fewer than {max(fields.shots)} images: {", ".join(short[:5])}'
          f'{", ..." if len(short) > 5 else ""}; use fewer shots or add images'
      )
  return FewShotEvaluator(
      name,
      fields.every_steps,
      config=config,
      model=context.task.features_model(config, model_config),
      mesh=context.mesh,
      num_classes=num_classes,
      shots=fields.shots,
      seeds=fields.seeds,
      l2_reg=fields.l2_reg,
      train_split=train_split,
      eval_split=eval_split,
      fitted=resolution.fits_as_it_runs(context, resolution.is_sized(fields)),
  )
