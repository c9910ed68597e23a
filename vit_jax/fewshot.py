"""Few-shot linear evaluation: the paper's cheap proxy for how good a frozen representation is.

For `shots` train images per class, the frozen model's pre-logits features are fitted to {-1, 1}
one-hot targets by closed-form L2-regularised least squares, and the fit is scored on the eval split;
the accuracy is averaged over `seeds` random choices of the shots (paper Sec. 4 and Appendix; as
big_vision's few-shot evaluator, with one fixed regularisation instead of one chosen on held-out data).

  python -m vit_jax.fewshot --workdir=W [--step=N] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4]

prints the accuracy per number of shots. `Evaluator` does the same for the training loop, on the
parameters it is given, every `config.fewshot.every_steps` steps.
"""
import functools
import os
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from jax.sharding import Mesh

from vit_jax import checkpoint, cli, sharding

SHOTS = (1, 5, 10, 25)
SEEDS = 3
# Features are standardised before the fit, so one value serves features of any scale. Of 2^-4..2^14,
# 2^2 is within 1% of the best at 1-25 shots on the digits, for the demo model and for a barely
# trained tiny one (the best of 2^k grows with the shots there: big_vision picks it on held-out data).
L2_REG = 4.0

_USAGE = '--workdir=W [--step=N] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4]'


def sample_shots(labels: np.ndarray, shots: int, num_classes: int,
                 rng: np.random.Generator) -> np.ndarray:
  """Indices of `shots` random examples of each class (raises ValueError if a class has fewer).

  The first `shots` of a random order of each class: generators in the same state draw nested sets,
  the 1-shot examples among the 5-shot ones, and so on.
  """
  chosen = []
  for label in range(num_classes):
    members = np.flatnonzero(labels == label)
    if len(members) < shots:
      raise ValueError(f'class {label} has {len(members)} train examples, fewer than {shots} shots: '
                       'use fewer shots')
    chosen.append(rng.permutation(members)[:shots])
  return np.concatenate(chosen)


def fit_and_score(train_feats: np.ndarray, train_labels: np.ndarray, test_feats: np.ndarray,
                  test_labels: np.ndarray, num_classes: int, l2_reg: float) -> float:
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


def linear_fewshot_accuracy(train_feats: np.ndarray, train_labels: np.ndarray,
                            test_feats: np.ndarray, test_labels: np.ndarray, *,
                            shots: Sequence[int] = SHOTS, seeds: int = SEEDS,
                            l2_reg: float = L2_REG) -> dict[int, float]:
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
      scores.append(fit_and_score(train_feats[chosen], train_labels[chosen], test_feats,
                                  test_labels, num_classes, l2_reg))
    accuracies[n] = float(np.mean(scores))
  return accuracies


def _features_of_batch(params: Any, batch: dict[str, jax.Array], *,
                       model: nn.Module) -> dict[str, jax.Array]:
  return {'features': model.apply({'params': params}, batch['image'], train=False),
          'label': batch['label'], 'mask': batch['mask']}


class Evaluator:
  """Few-shot accuracy of parameters, on the unaugmented train and eval splits of a config's data.

  `model` returns features (e.g. `train.make_model(config, num_classes=None)`); the parameters may
  carry a head, which it ignores. Works on any mesh and any number of hosts: every host gets all
  features and computes the same numbers.
  """

  def __init__(self, config: ml_collections.ConfigDict, model: nn.Module, mesh: Mesh, *,
               shots: Sequence[int] = SHOTS, seeds: int = SEEDS, l2_reg: float = L2_REG,
               train_split: Optional[str] = None, eval_split: Optional[str] = None):
    self._config, self._mesh = config, mesh
    self._splits = (train_split or config.train_split, eval_split or config.eval_split)
    self._shots, self._seeds, self._l2_reg = tuple(shots), seeds, l2_reg
    self._features_fn = jax.jit(functools.partial(_features_of_batch, model=model),
                                out_shardings=sharding.replicated(mesh))

  def features(self, params: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Features [n, D] and labels [n] of every example of `split`, eval-preprocessed."""
    # Imported here so that the command line answers bad flags before TensorFlow loads.
    from vit_jax import data  # pylint: disable=g-import-not-at-top
    # The eval iterator reads a split once, in order, resized without augmentation: that, on `split`.
    config = self._config.copy_and_resolve_references()
    config.eval_split = split
    feats, labels = [], []
    local_batch_size = config.eval_batch_size // jax.process_count()
    for local in data.eval_iterator(config, local_batch_size=local_batch_size,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count()):
      out = jax.device_get(self._features_fn(params, sharding.global_batch(local, self._mesh)))
      feats.append(out['features'][out['mask']])
      labels.append(out['label'][out['mask']])
    return np.concatenate(feats), np.concatenate(labels)

  def accuracies(self, params: Any) -> dict[int, float]:
    """Mean few-shot accuracy for each number of shots."""
    train_split, eval_split = self._splits
    return linear_fewshot_accuracy(
        *self.features(params, train_split), *self.features(params, eval_split), shots=self._shots,
        seeds=self._seeds, l2_reg=self._l2_reg)

  def __call__(self, params: Any) -> dict[str, float]:
    """The loop's metrics: {'fewshot_<n>shot': accuracy} for each number of shots n."""
    return {f'fewshot_{n}shot': accuracy for n, accuracy in self.accuracies(params).items()}


def evaluate_checkpoint(workdir: str, step: Optional[int] = None, *, shots: Sequence[int] = SHOTS,
                        seeds: int = SEEDS, l2_reg: float = L2_REG) -> tuple[dict[int, float], int]:
  """Few-shot accuracies of checkpoint `step` (default: the latest) of a run, and that step."""
  checkpoint_dir, step = checkpoint.find_checkpoint(workdir, step)
  from vit_jax import train  # pylint: disable=g-import-not-at-top
  config, _ = train.load_run_info(workdir)
  config.task = 'classification'  # The ViT backbone's features, also of a masked-patch-prediction run.
  params, _ = checkpoint.restore_params(checkpoint_dir)
  mesh = sharding.make_mesh((('data', -1),))
  # Any batch that the devices divide: this machine may have other devices than the run had.
  devices = sharding.num_batch_shards(mesh)
  config.eval_batch_size = -(-config.eval_batch_size // devices) * devices
  evaluator = Evaluator(config, train.make_model(config, None), mesh, shots=shots, seeds=seeds,
                        l2_reg=l2_reg)
  return evaluator.accuracies(jax.device_put(params, sharding.replicated(mesh))), step


def format_table(accuracies: dict[int, float]) -> str:
  return '\n'.join(['shots  accuracy', *(f'{n:5d}  {a:.4f}' for n, a in accuracies.items())])


def _parse_shots(values: list[str]) -> tuple[int, ...]:
  try:
    shots = tuple(int(v) for v in values)
  except ValueError:
    shots = ()
  if not shots or min(shots) < 1:
    cli.fail(f'--shots={",".join(values)} must be positive integers, e.g. --shots=1,5,10,25')
  return shots


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run whose checkpoint is evaluated.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_list('shots', [str(s) for s in SHOTS], 'Train images per class, e.g. 1,5,10,25.')
  flags.DEFINE_integer('seeds', SEEDS, 'Random choices of the shots to average over.')
  flags.DEFINE_float('l2_reg', L2_REG, 'L2 regularisation of the least-squares fit.')
  flags.mark_flags_as_required(['workdir'])


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  shots = _parse_shots(args.shots)
  if args.seeds < 1:
    cli.fail(f'--seeds={args.seeds} must be at least 1')
  if args.l2_reg <= 0:
    cli.fail(f'--l2_reg={args.l2_reg} must be positive, e.g. --l2_reg={L2_REG:g}')
  try:
    accuracies, step = evaluate_checkpoint(args.workdir, args.step, shots=shots, seeds=args.seeds,
                                           l2_reg=args.l2_reg)
  except ValueError as e:
    cli.fail(str(e))
  print(f'few-shot linear accuracy of step {step} of {args.workdir} (mean of {args.seeds} seeds, '
        f'l2_reg={args.l2_reg:g}):')
  print(format_table(accuracies))


if __name__ == '__main__':
  # Before TensorFlow (the input pipeline's) loads: its C++ start-up lines would garble stderr.
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
  _define_flags()
  app.run(main, flags_parser=cli.flags_parser(_USAGE))
