"""The residuals JAX's autodiff keeps for a config's backward pass, per image and block: the activations
term of the planner's memory estimate (footprint.py), traced with `jax.vjp` under `jax.make_jaxpr`
for a 1- and 2-block model at batch 1 and 2 (nothing compiled) and scaled by the caller.
"""

import dataclasses
from typing import Any

import jax
import jax.extend.core as jax_core
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import tasks
from vit_jax.train import param_groups


@dataclasses.dataclass(frozen=True)
class Residuals:
  """Bytes the backward pass keeps, as [replicated over `tensor`, split over it, attention maps
  (split over it)] per image: of one block and of the rest of the model; and the weight copies
  (compute-dtype casts) it keeps."""

  block: np.ndarray
  rest: np.ndarray
  weights_block: float
  weights_rest: float


def init_params(model: Any, size: int) -> Any:
  key = jax.random.key(0)
  return model.init({'params': key, 'mpp': key}, jnp.zeros((1, size, size, 3)), train=False)[
      'params'
  ]


def _kind(shape: tuple[int, ...], model: dict[str, Any]) -> int:
  """A residual's index in Residuals' bytes: 0 replicated over `tensor`, 1 split over it, 2 an
  attention map ([b, heads, tokens, tokens]: split, and kept whole by XLA, footprint.py)."""
  # Tensor parallelism splits heads and MLP units (encoder.TENSOR_RULES): activations with a heads axis
  # (q, k, v, attention weights: [b, heads, ...] or [b, tokens, heads, ...]) or MLP units last.
  heads = len(shape) == 4 and model['num_heads'] in shape[1:3]
  if heads and shape[1] == model['num_heads'] and shape[2] == shape[3] > 1:
    return 2
  return int(heads or (len(shape) > 1 and shape[-1] == model['mlp_dim'] != model['hidden_size']))


def _traced(
    config: ml_collections.ConfigDict,
    model_config: dict[str, Any],
    num_classes: int,
    layers: int,
    batch: int,
) -> np.ndarray:
  """[replicated, split, attention maps] bytes of the residuals of the task's loss on `batch` images,
  `layers` blocks."""
  task = tasks.get(config.task)
  model = task.make_model(
      config, {**model_config, 'num_layers': layers, 'scan': False}, num_classes
  )
  size = config.image_size
  args = (
      jax.eval_shape(lambda: init_params(model, size)),
      jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32),
      jax.ShapeDtypeStruct((batch,), jnp.int32),
      jax.eval_shape(lambda: jax.random.key(0)),
  )
  loss = task.make_loss(config, model)
  frozen_labels = param_groups.labeller(config.optim, model_config)

  def backward(params, *rest):
    # The gradients the train step computes: of the parameters that train alone (XLA drops what only
    # a frozen one's or the images' would need).
    trained = param_groups.trained_part(params, frozen_labels)
    return jax.vjp(
        lambda trained: loss(param_groups.with_trained(trained, params), *rest), trained
    )[1]

  jaxpr = jax.make_jaxpr(backward)(*args).jaxpr
  # The vjp closure's leaves are the residuals; the arguments among them (the float32 parameters) are
  # the state's own buffers, not extra memory.
  inputs, seen, totals = set(jaxpr.invars), set(), np.zeros(3)
  for var in jaxpr.outvars:
    if isinstance(var, jax_core.Literal) or var in inputs or var in seen:
      continue
    seen.add(var)
    # A dropout mask (bool) is a compare away from its random bits, and XLA keeps those (uint32).
    itemsize = 4 if var.aval.dtype == jnp.bool_ else var.aval.dtype.itemsize
    totals[_kind(var.aval.shape, model_config)] += var.aval.size * itemsize
  return totals


def of_config(
    config: ml_collections.ConfigDict, model_config: dict[str, Any], num_classes: int
) -> Residuals:
  t = {
      (layers, batch): _traced(config, model_config, num_classes, layers, batch)
      for layers in (1, 2)
      for batch in (1, 2)
  }
  # Residuals grow linearly in the images (per image: the difference of batch 2 and 1) and in the
  # blocks (per block: the difference of 2 blocks and 1); what does not grow with images is weights.
  per_image = {layers: t[layers, 2] - t[layers, 1] for layers in (1, 2)}
  weights = {layers: (2 * t[layers, 1] - t[layers, 2]).sum() for layers in (1, 2)}
  block = per_image[2] - per_image[1]
  return Residuals(
      block, per_image[1] - block, weights[2] - weights[1], 2 * weights[1] - weights[2]
  )
