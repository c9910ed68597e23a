"""The frozen backbone's features of whole splits, for the evaluators that fit on them (few-shot, k-NN).

Every example of a split is read once, eval-preprocessed, in the run's eval batches; every host gets
all of them (the features are replicated), so each computes the same numbers; or they stay where the
devices computed them (`on_devices`: k-NN's train set, which no host needs whole).
"""

import functools
from typing import Any, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np
from jax.sharding import Mesh

from vit_jax import data, sharding
from vit_jax.data import on_device
from vit_jax.evaluators.base import Context
from vit_jax.models import patch_embedding


def check_one_class(where: str, context: Context) -> None:
  """Few-shot and k-NN classify into one class an image: not the run's label sets."""
  if context.info.multi_label:
    raise ValueError(
        f'{where} classifies into one class an image, but config.label_feature='
        f'{context.config.label_feature!r} is a set of classes an image: unset '
        f'{where if where.startswith("config.evals.") else where + ".every_steps"}'
    )


def count_eval_split(name: str, where: str, split: str, context: Context) -> int:
  """The examples of the split a features evaluator measures on; none (or a split that does not
  exist) is one line."""
  count = context.count(split)
  if not count:
    raise ValueError(
        f'Evaluator {name!r}: split {split!r} has no examples: set {where}.eval_split to a '
        'split with some'
    )
  return count


def _split_indices(batch: int, local_batch_size: int) -> np.ndarray:
  """Where in the split the rows of this host's `batch`-th eval batch are: its shard is every
  process_count-th example from its index (sources.Source.examples); padding rows' are past the end.
  """
  rows = batch * local_batch_size + np.arange(local_batch_size)
  return jax.process_index() + jax.process_count() * rows


def _features_of_batch(
    params: Any, batch: dict[str, jax.Array], *, model: nn.Module
) -> dict[str, jax.Array]:
  return {
      'features': model.apply(
          {'params': params}, on_device.model_input(batch['image']), train=False
      ),
      **{name: batch[name] for name in ('label', 'mask', 'index') if name in batch},
  }


class SplitFeatures:
  """Features [n, D] and labels [n] of every example of the given splits.

  `model` returns features (a task's `features_model`); the parameters may carry a head, which it
  ignores. `fitted`: the model is of another image or patch size than the parameters
  (resolution.sized), which it fits as it runs. Works on any mesh and any number of hosts. The data
  passes keep their worker processes between calls until `close`.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      splits: Sequence[str],
      *,
      model: nn.Module,
      mesh: Mesh,
      fitted: bool = False,
  ):
    self._mesh = mesh
    self._passes = {
        split: data.eval_passes(
            config,
            split,
            local_batch_size=config.eval_batch_size // jax.process_count(),
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        for split in dict.fromkeys(splits)
    }
    features_fn = functools.partial(_features_of_batch, model=model)
    if fitted:
      features_fn = patch_embedding.fitted_to_images(
          features_fn, config.posemb_interpolation, config.patch_interpolation
      )
    replicated = sharding.replicated(mesh)
    self._features_fn = jax.jit(features_fn, out_shardings=replicated)
    self._split_features_fn = jax.jit(
        features_fn,
        out_shardings={
            'features': sharding.batch_sharding(mesh),
            'label': replicated,
            'mask': replicated,
        },
    )

  def __call__(self, params: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    """The rows in the split's order, however many hosts read it: the few-shot shots a seed draws
    are of the examples at given places of the split."""
    feats, labels, indices = [], [], []
    for b, local in enumerate(self._passes[split]()):
      local = {**local, 'index': _split_indices(b, len(local['mask']))}
      out = jax.device_get(self._features_fn(params, sharding.global_batch(local, self._mesh)))
      feats.append(out['features'][out['mask']])
      labels.append(out['label'][out['mask']])
      indices.append(out['index'][out['mask']])
    order = np.argsort(np.concatenate(indices), kind='stable')
    return np.concatenate(feats)[order], np.concatenate(labels)[order]

  def on_devices(self, params: Any, split: str) -> tuple[jax.Array, np.ndarray]:
    """Features [n, D] of every example of `split` left on the devices that computed them, rows
    split over the mesh's batch axes (shard s: shard s of each batch in turn), and the label of each
    row (-1: a padding row of no example)."""
    feats, labels = [], []
    for local in self._passes[split]():
      out = self._split_features_fn(params, sharding.global_batch(local, self._mesh))
      feats.append(out['features'])
      label, mask = jax.device_get((out['label'], out['mask']))
      labels.append(np.where(mask, label, -1))
    shards = sharding.num_batch_shards(self._mesh)
    # [batches, shards, rows a shard of a batch] -> each shard's rows of each batch in turn.
    labels = np.stack(labels).reshape(len(labels), shards, -1).transpose(1, 0, 2).reshape(-1)
    return sharding.rows_on_devices(feats, self._mesh), labels

  def close(self) -> None:
    for passes in self._passes.values():
      passes.close()
