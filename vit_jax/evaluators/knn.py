"""Weighted k-nearest-neighbour classification of frozen features: DINO's k-NN evaluation.

Each eval example's features and every train example's are L2-normalised; the eval example's k most
similar train examples (cosine similarity) vote for their classes, each with weight
exp(similarity / temperature), and the class with the most weight is its prediction (Caron et al.
2021, "Emerging Properties in Self-Supervised Vision Transformers", their eval_knn.py: k = 20,
temperature 0.07; DINOv2 reports k = 10, 20, 100, 200). Each k's votes are those of the first k of
the same sorted neighbours.

The similarities are computed on the devices: the train features are split over the devices of the
mesh's batch axes, each device finds the nearest of its share, and the shares' candidates are
merged, so that ImageNet-1k's 1.28M train features are never in one device's memory, nor all the
similarities. In training they stay where the devices computed them (`SplitFeatures.on_devices`):
no host holds them either.
`KnnEvaluator` measures it in the training loop (config.knn, or an evaluator of type 'knn' in
config.evals) and for `python -m vit_jax.tools.fewshot --knn=...` on a saved run.
"""

import functools
import math
from typing import Any, Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import sharding
from vit_jax.evaluators import features, resolution
from vit_jax.evaluators.base import Context, check_fields, whole_number

# Similarities of one chunk of eval examples with a device's share of the train examples: at most
# this many float32s (128 MB), so that ImageNet-21k's 13M train features fit any accelerator.
_SIMILARITIES_PER_DEVICE = 2**25
_MAX_CHUNK = 1024


def normalized(feats: np.ndarray) -> np.ndarray:
  """Rows scaled to unit L2 norm (torch's F.normalize: a zero row stays zero)."""
  feats = np.asarray(feats, np.float32)
  return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)


@jax.jit
def _normalized_rows(feats: jax.Array) -> jax.Array:
  """`normalized` where the rows are, split as they are."""
  return feats / jnp.maximum(jnp.linalg.norm(feats, axis=1, keepdims=True), 1e-12)


def _row_spec(mesh: Mesh, *rest: None) -> P:
  """Rows split over the batch axes (the train features' layout: features.SplitFeatures.on_devices)."""
  return P(sharding.batch_axes(mesh) or None, *rest)


@functools.partial(jax.jit, static_argnames=('k', 'mesh'))
def _nearest_of_chunk(
    train: jax.Array, is_train: jax.Array, queries: jax.Array, *, k: int, mesh: Mesh
) -> tuple[jax.Array, jax.Array]:
  axes = sharding.batch_axes(mesh)

  def local(train_share, is_train, queries):
    share = train_share.shape[0]
    # This share's first index into the whole train set.
    first = jax.lax.axis_index(axes) * share if axes else 0
    similarities = jnp.dot(queries, train_share.T, precision=jax.lax.Precision.HIGHEST)
    similarities = jnp.where(is_train[None, :], similarities, -jnp.inf)  # Not the padding.
    # A share of fewer than k rows gives them all: the shares' candidates hold the k nearest still.
    top, index = jax.lax.top_k(similarities, min(k, share))
    index = index + first
    if axes:  # [shards, chunk, k] -> [chunk, shards * k]: every share's candidates, merged.
      top, index = (jax.lax.all_gather(x, axes, axis=1, tiled=True) for x in (top, index))
    top, position = jax.lax.top_k(top, k)
    return top, jnp.take_along_axis(index, position, axis=1)

  return jax.shard_map(
      local,
      mesh=mesh,
      in_specs=(_row_spec(mesh, None), _row_spec(mesh), P()),
      out_specs=(P(), P()),
      check_vma=False,
  )(train, is_train, queries)


def _on_devices(train_feats: np.ndarray, mesh: Mesh) -> jax.Array:
  """Host features [n, D] as features.SplitFeatures.on_devices lays them out, padded at the end with
  zero rows (row i is row i)."""
  shards = sharding.num_batch_shards(mesh)
  padded = np.zeros((-(-len(train_feats) // shards) * shards, train_feats.shape[1]), np.float32)
  padded[: len(train_feats)] = train_feats
  return jax.make_array_from_callback(
      padded.shape, NamedSharding(mesh, _row_spec(mesh, None)), lambda i: padded[i]
  )


def nearest(
    train_feats: np.ndarray, test_feats: np.ndarray, k: int, mesh: Mesh
) -> tuple[np.ndarray, np.ndarray]:
  """Cosine similarities [n_test, k] of each test example's k nearest train examples, most similar
  first, and their indices into `train_feats`. Features: [n, D], normalised here."""
  train = _on_devices(train_feats, mesh)
  return _nearest(train, np.arange(len(train)) < len(train_feats), test_feats, k, mesh)


def _nearest(
    train: jax.Array, is_train: np.ndarray, test_feats: np.ndarray, k: int, mesh: Mesh
) -> tuple[np.ndarray, np.ndarray]:
  """`nearest` of train features on the devices (rows split over the batch axes, `_row_spec`), the
  rows where `is_train` is False none; the indices are of their rows."""
  num_train = int(is_train.sum())
  if not 1 <= k <= num_train:
    raise ValueError(f'k={k} neighbours of {num_train} train examples: use 1 <= k <= {num_train}')
  train = _normalized_rows(train)
  is_train = jax.make_array_from_callback(
      is_train.shape, NamedSharding(mesh, _row_spec(mesh)), lambda i: is_train[i]
  )
  share = len(is_train) // sharding.num_batch_shards(mesh)
  width = train.shape[1]
  queries = normalized(test_feats)
  chunk = min(_MAX_CHUNK, max(1, _SIMILARITIES_PER_DEVICE // share), len(queries))
  similarities, indices = [], []
  for start in range(0, len(queries), chunk):
    block = np.zeros((chunk, width), np.float32)  # The last one padded: one shape, one compile.
    rows = queries[start : start + chunk]
    block[: len(rows)] = rows
    block = jax.make_array_from_callback(
        block.shape, sharding.replicated(mesh), lambda i, b=block: b[i]
    )
    top, index = jax.device_get(_nearest_of_chunk(train, is_train, block, k=k, mesh=mesh))
    similarities.append(top[: len(rows)])
    indices.append(index[: len(rows)])
  return np.concatenate(similarities), np.concatenate(indices)


def weighted_votes(
    similarities: np.ndarray, neighbour_labels: np.ndarray, num_classes: int, temperature: float
) -> np.ndarray:
  """[n, num_classes]: each class's sum of exp(similarity / temperature) over the neighbours of it,
  each row divided by exp(its largest similarity / temperature) (the same argmax): a temperature
  under 1/709 would overflow float64 otherwise."""
  chex.assert_equal_shape((similarities, neighbour_labels))
  votes = np.zeros((len(similarities), num_classes), np.float64)
  rows = np.broadcast_to(np.arange(len(similarities))[:, None], neighbour_labels.shape)
  similarities = similarities.astype(np.float64)
  largest = similarities.max(axis=1, keepdims=True) if similarities.size else 0.0
  np.add.at(votes, (rows, neighbour_labels), np.exp((similarities - largest) / temperature))
  return votes


def knn_accuracy(
    train_feats: np.ndarray | jax.Array,
    train_labels: np.ndarray,
    test_feats: np.ndarray,
    test_labels: np.ndarray,
    *,
    ks: Sequence[int],
    temperature: float,
    mesh: Mesh,
) -> dict[int, float]:
  """Top-1 accuracy of the weighted k-NN classifier on the test examples, for each k of `ks`. The
  train features [n, D] are on the host, or on the devices as features.SplitFeatures.on_devices
  leaves them, each row's label in `train_labels` (-1: a row of no example)."""
  if not isinstance(train_feats, jax.Array):
    train_feats = _on_devices(train_feats, mesh)
    padding = len(train_feats) - len(train_labels)  # _on_devices' zero rows.
    train_labels = np.pad(np.asarray(train_labels), (0, padding), constant_values=-1)
  num_classes = int(max(train_labels.max(), test_labels.max())) + 1
  similarities, indices = _nearest(train_feats, train_labels >= 0, test_feats, max(ks), mesh)
  neighbour_labels = train_labels[indices]
  accuracies = {}
  for k in ks:
    votes = weighted_votes(similarities[:, :k], neighbour_labels[:, :k], num_classes, temperature)
    accuracies[k] = float(np.mean(votes.argmax(-1) == test_labels))
  return accuracies


class KnnEvaluator:
  """k-NN accuracy of parameters: the unaugmented eval split classified by its nearest examples of
  the unaugmented train split. `model` returns features (a task's `features_model`)."""

  def __init__(
      self,
      name: str,
      every_steps: Optional[int],
      *,
      config: ml_collections.ConfigDict,
      model: nn.Module,
      mesh: Mesh,
      ks: Sequence[int],
      temperature: float,
      train_split: Optional[str] = None,
      eval_split: Optional[str] = None,
      fitted: bool = False,
  ):
    self.name, self.every_steps = name, every_steps
    self._mesh = mesh
    self._splits = (train_split or config.train_split, eval_split or config.eval_split)
    self.features = features.SplitFeatures(
        config, self._splits, model=model, mesh=mesh, fitted=fitted
    )
    self._ks, self._temperature = tuple(ks), temperature
    self.metrics = tuple(f'{k}nn' for k in self._ks)

  def accuracies(self, params: Any) -> dict[int, float]:
    """Top-1 accuracy for each k. A k beyond the train split's readable examples raises a
    ValueError."""
    train_split, eval_split = self._splits
    return knn_accuracy(
        *self.features.on_devices(params, train_split),
        *self.features(params, eval_split),
        ks=self._ks,
        temperature=self._temperature,
        mesh=self._mesh,
    )

  def __call__(self, params: Any) -> dict[str, float]:
    """{'<k>nn': accuracy} for each k."""
    return {f'{k}nn': accuracy for k, accuracy in self.accuracies(params).items()}

  def close(self) -> None:
    self.features.close()


def check_ks(ks: Any, temperature: Any, where: str) -> None:
  """One-line ValueErrors for ks that are not positive whole numbers or a temperature not > 0."""
  if not isinstance(ks, (list, tuple)) or not ks or not all(whole_number(k) for k in ks):
    raise ValueError(f'{where}.ks={ks} must be positive numbers of neighbours, e.g. (10, 20)')
  if isinstance(temperature, bool) or not (
      isinstance(temperature, (int, float)) and 0 < temperature < math.inf
  ):
    raise ValueError(f"{where}.temperature={temperature} must be > 0, e.g. 0.07 (DINO's)")


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> KnnEvaluator:
  check_fields(
      name,
      fields,
      ('every_steps',),
      ('ks', 'temperature', 'train_split', 'eval_split', 'image_size', 'patch_size'),
  )
  where = f'config.{name}' if name == 'knn' else f'config.evals.{name}'
  features.check_one_class(where, context)
  config, model_config = context.config, context.model_config
  if resolution.is_sized(fields):
    config, model_config = resolution.sized(name, config, fields, context)
  # Left out of a config.evals entry: config.knn's (DINO's k = 20 and temperature 0.07, k = 10 too).
  ks = fields.get('ks', config.knn.ks)
  temperature = fields.get('temperature', config.knn.temperature)
  check_ks(ks, temperature, where)
  ks = tuple(ks)
  train_split = fields.get('train_split') or config.train_split
  eval_split = fields.get('eval_split') or config.eval_split
  num_train = context.count(train_split)
  features.count_eval_split(name, where, eval_split, context)
  if not num_train:  # "use fewer, e.g. ks=(0,)" would not do.
    raise ValueError(
        f'Evaluator {name!r}: split {train_split!r} has no examples: set {where}.train_split to a '
        'split with some'
    )
  if max(ks) > num_train:
    raise ValueError(
        f'{where}.ks={ks}: {max(ks)} neighbours of the {num_train} images of {train_split!r}: '
        f'use fewer, e.g. ks=({min(20, num_train)},)'
    )
  return KnnEvaluator(
      name,
      fields.every_steps,
      config=config,
      model=context.task.features_model(config, model_config),
      mesh=context.mesh,
      ks=ks,
      temperature=temperature,
      train_split=train_split,
      eval_split=eval_split,
      fitted=resolution.fits_as_it_runs(context, resolution.is_sized(fields)),
  )
