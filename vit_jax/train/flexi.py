"""FlexiViT training (Beyer et al. 2023, "FlexiViT: One Model for All Patch Sizes"; big_vision's
trainers/proj/flexi): each step cuts the batch's images into patches of a size drawn from
`config.flexi.patch_sizes` (by `weights`, default equal), so that one set of parameters serves every
patch size: a speed / accuracy trade-off picked at deployment.

The parameters keep the shapes of `model.patch_size` (the patch kernel, the grid of learned position
embeddings at `image_size`); each step's model resamples them to the drawn size as it runs
(models/patch_embedding.py's pseudo-inverse resize by config.patch_interpolation, posemb.py's resize
by config.posemb_interpolation), so the gradient reaches the stored ones through the resampling, as
in big_vision. The step holds one branch per size (`jax.lax.switch`, each with its own backward pass,
so it needs the memory of the smallest patches' alone): one compiled program, and the draw, a
function of the loss's key, follows the step (and its micro-batch with accum_steps) as dropout does,
so a resumed run draws what an uninterrupted one would. Evaluators measure any patch
size (`config.evals.X.patch_size`); the run's `eval` measures `model.patch_size`.

`flexi.kernel_size` and `flexi.posemb_grid` keep the parameters as big_vision's FlexiViT keeps them
(checkpoints/adapting.py's `kept_model`): the patch kernel at 32 px and the position embeddings on a
7x7 grid, whatever `model.patch_size` and `image_size`; a checkpoint of those shapes loads
unresampled, and every step, evaluation and tool resamples them once to its size, not through
`model.patch_size`'s.
"""

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from vit_jax.checkpoints import adapting
from vit_jax.models import patch_embedding, variants

# The key stream of the draws, apart from the dropout that the same key feeds.
_DRAW_STREAM = 0x464C4558


def enabled(config: ml_collections.ConfigDict) -> bool:
  return bool(config.flexi.patch_sizes)


# Position embeddings without parameters: nothing for flexi.posemb_grid to keep.
_UNLEARNED_POSEMBS = ('sincos2d', 'sincos2d_mae', 'none')


def check(config: ml_collections.ConfigDict, model_config: Mapping[str, Any]) -> None:
  """What config.flexi needs of the run: a ViT classifier whose images divide into every size."""
  if not enabled(config):
    if adapting.keeps_own_shapes(config):
      field = 'kernel_size' if config.flexi.kernel_size is not None else 'posemb_grid'
      raise ValueError(
          f'config.flexi.{field} keeps the parameters of a FlexiViT run, and '
          'config.flexi.patch_sizes is empty: set the patch sizes, or unset it'
      )
    return
  if config.task != 'classification' or 'patch_size' not in model_config:
    what = f'config.task={config.task!r}' if config.task != 'classification' else config.variant
    raise ValueError(
        f'config.flexi.patch_sizes trains a ViT classifier at several patch sizes, and this run '
        f'is {what}: unset --config.flexi.patch_sizes'
    )
  family = variants.FAMILIES['ViT']
  for size in config.flexi.patch_sizes:
    stride = family.input_stride({**model_config, 'patch_size': size})
    if config.image_size % stride:
      raise ValueError(
          f'config.flexi.patch_sizes has {size}, which does not divide config.image_size='
          f'{config.image_size}: use sizes that divide it (240 px: 8, 10, 12, 15, 16, 20, 24, 30, '
          '40, 48)'
      )
  for field in ('kernel_size', 'posemb_grid'):
    value = config.flexi[field]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
      raise ValueError(
          f"config.flexi.{field}={value!r} must be a positive whole number (FlexiViT's: "
          'kernel_size=32, posemb_grid=7), or unset'
      )
  if config.flexi.posemb_grid is not None and model_config['posemb'] in _UNLEARNED_POSEMBS:
    raise ValueError(
        f'config.flexi.posemb_grid keeps learned position embeddings on a grid, and '
        f"model.posemb={model_config['posemb']!r} has none: unset config.flexi.posemb_grid"
    )


def costliest_branch(
    config: ml_collections.ConfigDict, model_config: Mapping[str, Any]
) -> dict[str, Any]:
  """The fields of the model a step runs at its costliest: a FlexiViT's at its smallest patches (the
  most tokens); `model_config` itself otherwise."""
  if not enabled(config):
    return dict(model_config)
  return {**model_config, 'patch_size': min(config.flexi.patch_sizes)}


def make_loss(
    config: ml_collections.ConfigDict, model: nn.Module, make: Callable[[nn.Module], Callable]
) -> Callable[..., jax.Array]:
  """The loss of a step at a drawn patch size: `make(model)` (the task's loss of a model) for the
  model at each size, one of them chosen by the loss's key (by config.flexi.weights, default equal).
  """
  patch_sizes = tuple(config.flexi.patch_sizes)
  weights = np.asarray(config.flexi.weights or (1.0,) * len(patch_sizes), np.float64)
  log_probabilities = np.log(weights / weights.sum()).astype(np.float32)
  branches = [
      patch_embedding.fitted_to_images(
          make(model.clone(patch_size=size)),
          config.posemb_interpolation,
          config.patch_interpolation,
      )
      for size in patch_sizes
  ]

  def drawn(key: jax.Array) -> jax.Array:
    return jax.random.categorical(jax.random.fold_in(key, _DRAW_STREAM), log_probabilities)

  # Differentiated through the switch, JAX keeps every branch's activations for the backward pass (a
  # switch's residuals are all its branches'): 1.25x the smallest patches' at sizes (8, 16, 32), more
  # with FlexiViT's ten. So each branch computes its own gradient, and only the drawn size's
  # activations live; the switch hands on a gradient of the parameters' shapes.
  @jax.custom_vjp
  def loss_fn(params: Any, inputs: tuple) -> jax.Array:
    return jax.lax.switch(drawn(inputs[2]), branches, params, *inputs)

  def forward(params: Any, inputs: tuple) -> tuple[jax.Array, Any]:
    gradients = [jax.value_and_grad(branch) for branch in branches]
    return jax.lax.switch(drawn(inputs[2]), gradients, params, *inputs)

  def backward(grads: Any, cotangent: jax.Array) -> tuple[Any, None]:
    return jax.tree.map(lambda g: g * cotangent.astype(g.dtype), grads), None  # None: no inputs'.

  loss_fn.defvjp(forward, backward)
  return lambda params, images, labels, key, *teacher: loss_fn(
      params, (images, labels, key, *teacher)
  )
