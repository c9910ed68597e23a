"""The frozen backbone's features of whole splits, for the evaluators that fit on them (few-shot, k-NN).

Every example of a split is read once, eval-preprocessed, in the run's eval batches; every host gets
all of them (the features are replicated), so each computes the same numbers.
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


def _features_of_batch(
    params: Any, batch: dict[str, jax.Array], *, model: nn.Module
) -> dict[str, jax.Array]:
  return {
      'features': model.apply(
          {'params': params}, on_device.model_input(batch['image']), train=False
      ),
      'label': batch['label'],
      'mask': batch['mask'],
  }


class SplitFeatures:
  """Features [n, D] and labels [n] of every example of the given splits.

  `model` returns features (a task's `features_model`); the parameters may carry a head, which it
  ignores. Works on any mesh and any number of hosts. The data passes keep their worker processes
  between calls until `close`.
  """

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      splits: Sequence[str],
      *,
      model: nn.Module,
      mesh: Mesh,
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
    self._features_fn = jax.jit(
        functools.partial(_features_of_batch, model=model), out_shardings=sharding.replicated(mesh)
    )

  def __call__(self, params: Any, split: str) -> tuple[np.ndarray, np.ndarray]:
    feats, labels = [], []
    for local in self._passes[split]():
      out = jax.device_get(self._features_fn(params, sharding.global_batch(local, self._mesh)))
      feats.append(out['features'][out['mask']])
      labels.append(out['label'][out['mask']])
    return np.concatenate(feats), np.concatenate(labels)

  def close(self) -> None:
    for passes in self._passes.values():
      passes.close()
