"""Per-device memory and step time of a config's training on a mesh of N chips, compiling nothing
(what `python -m vit_jax.tools.plan` prints). Which meshes it is estimated on (the config's, the
suggestions) is vit_jax/planning/meshes.py's.

Shapes come from `jax.eval_shape` of the model and optimizer, the partitioning from `sharding`'s rules
on an abstract mesh of the axis sizes (no devices needed), the activations from the residuals JAX's
autodiff keeps for the backward pass (residuals.py), scaled to the layers and micro-batch; plus the
batch, the working set of one block's forward or backward pass and the fsdp all-gather of a block's
weights. tests/planning/test_plan.py holds the totals to XLA's
memory analysis of the compiled train step on CPU.
"""

import dataclasses
import math
import re
from typing import Any, Optional

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import AbstractMesh

from vit_jax import sharding, tasks
from vit_jax.checkpoints import adapting
from vit_jax.planning import chips, residuals
from vit_jax.tasks import distillation
from vit_jax.train import flexi, optim, param_groups
from vit_jax.models import lora, scan_layout, variants, vit

# XLA fuses the elementwise chains of LayerNorm, GELU and softmax and recomputes some of their
# residuals in the backward pass's fusions: XLA:CPU keeps 76-93% of an unscanned block's (float32, the
# test models and ViT-S/16), but every attention map (so a block of hundreds of tokens keeps ~all:
# ViT-Ti/8 at 224 px as much unscanned as scanned). A scanned block hands them across the loop as JAX
# keeps them.
KEPT_UNSCANNED = 0.85
REMATS = (
    None,
    'dots_saveable',
    'nothing_saveable',
)  # Shown in every plan; also what suggest tries.


@dataclasses.dataclass(frozen=True)
class Traced:
  """What the plans of one config share: the train state's shapes and each remat policy's residuals."""

  # variants.get_model_config of the config, at the step's costliest (flexi.costliest_branch).
  model: dict[str, Any]
  num_classes: int
  state: dict[str, Any]
  # state['params'] less the frozen ones (param_groups.trained_part): what has gradients.
  trained: Any
  residuals: dict[str | None, residuals.Residuals]
  block_params: int  # Bytes of one encoder block's (float32) parameters.
  teacher: Optional['Teacher'] = None  # config.distill's.
  # chips.train_flops' `gradients`: of the activations through the blocks, and the weights' share.
  gradients: tuple[float, float] = (1.0, 1.0)


@dataclasses.dataclass(frozen=True)
class Teacher:
  """A distillation teacher's cost: its parameters (placed once, split by the student's rules), one
  image's forward FLOPs, and what its forward pass holds at a time per image (no residuals: it has no
  backward pass): its widest block's MLP units and attention weights, in the compute dtype."""

  params: Any  # Shapes (jax.ShapeDtypeStruct), float32.
  flops: float
  transient: float


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Bytes per device of one choice of mesh, remat policy and accum_steps, and the step time."""

  mesh: dict[str, int]
  remat: str | None
  accum_steps: int
  params: int
  gradients: int
  optimizer_state: int
  polyak: int
  activations: int
  step_s: float
  teacher: int = 0  # Bytes of the distillation teacher's parameters and forward pass.

  @property
  def total(self) -> int:
    return (
        self.params
        + self.gradients
        + self.optimizer_state
        + self.polyak
        + self.activations
        + self.teacher
    )


def abstract_state(
    config: ml_collections.ConfigDict, model_config: dict[str, Any], num_classes: int
) -> dict[str, Any]:
  """Shapes of the train state as the step holds it (train/state.py's init_state, training layout);
  `model_config`: the variant's resolved fields (variants.get_model_config)."""
  model = tasks.get(config.task).make_model(config, {**model_config, 'scan': False}, num_classes)
  tx, _ = optim.make_optimizer(config, config.total_steps or 1, model_config)
  frozen_labels = param_groups.labeller(config.optim, model_config)

  def init():
    params = residuals.init_params(*adapting.kept_model(config, model))
    state = {
        'params': params,
        'opt_state': tx.init(params),
        'ema_params': param_groups.trained_part(params, frozen_labels)
        if config.polyak_decay is not None
        else None,
    }
    return scan_layout.stack_blocks(state, model.num_layers) if model_config['scan'] else state

  return jax.eval_shape(init)


def trace(
    config: ml_collections.ConfigDict,
    model_config: dict[str, Any],
    num_classes: int,
    teacher: Optional[tuple[str, dict[str, Any]]] = None,
) -> Traced:
  """Shapes, and the residuals of REMATS and the config's own remat policy; `model_config`: the
  variant's resolved fields (variants.get_model_config); `teacher`: config.distill's teacher's
  (variant, resolved fields), or None. The state has the run's shapes; the activations and FLOPs are
  a FlexiViT step's at its smallest patches."""
  state = abstract_state(config, model_config, num_classes)
  model_config = flexi.costliest_branch(config, model_config)
  in_blocks = [
      x
      for path, x in jax.tree_util.tree_leaves_with_path(state['params'])
      if re.search(r"\['encoderblock(_\d+)?'\]", jax.tree_util.keystr(path))
  ]
  return Traced(
      model_config,
      num_classes,
      state,
      param_groups.trained_part(state['params'], param_groups.labeller(config.optim, model_config)),
      {
          remat: residuals.of_config(config, {**model_config, 'remat': remat}, num_classes)
          for remat in dict.fromkeys((None, model_config['remat'], *REMATS))
      },
      _bytes(in_blocks) // model_config['num_layers'],
      None if teacher is None else _teacher(config, *teacher, num_classes),
      _gradients(config, model_config, state['params']),
  )


def _gradients(
    config: ml_collections.ConfigDict, model_config: dict[str, Any], params: Any
) -> tuple[float, float]:
  """chips.train_flops' `gradients` of the parameters that train (config.optim.frozen and trained,
  low-rank adapters): the activations' through the blocks when a parameter below the head trains;
  the share of the weight matrices' elements that train (their products' share of the FLOPs)."""
  if not param_groups.freezes(config.optim, model_config):
    return 1.0, 1.0
  leaves = param_groups.labelled(config.optim, params)
  matrices = [
      (x.size, trains)
      for path, x, trains in leaves
      if path.endswith('/kernel') or lora.ADAPTER_PATH.search(path)
  ]
  below_head = any(trains and path.split('/')[0] not in vit.HEADS for path, _, trains in leaves)
  share = sum(n for n, trains in matrices if trains) / sum(n for n, _ in matrices)
  return float(below_head), share


def _teacher(
    config: ml_collections.ConfigDict, variant: str, model: dict[str, Any], num_classes: int
) -> Teacher:
  family = variants.family(variant)
  image_size = distillation.teacher_image_size(config)
  module = variants.build(variant, model, num_classes=num_classes, dtype=jnp.float32)
  params = jax.eval_shape(lambda: residuals.init_params(module, image_size))
  flops = chips.FLOPS[family](model, image_size, num_classes)
  return Teacher(params, flops, _transient(family, model, config, image_size, train=False))


def _transient(
    family: str,
    model: dict[str, Any],
    config: ml_collections.ConfigDict,
    image_size: int,
    train: bool = True,
) -> float:
  """What a forward pass (a train step's, or with `train=False` an evaluation's) holds at a time per
  image (of `image_size`) beside its residuals: its widest block's MLP units and attention weights,
  in the compute dtype (a BiT's convolutions are counted by their parameters and FLOPs alone)."""
  if family != 'ViT':
    return 0.0
  tokens = chips.vit_tokens(model, image_size, train)
  return (
      tokens * (model['mlp_dim'] + model['num_heads'] * tokens) * jnp.dtype(config.dtype).itemsize
  )


def _bytes(tree: Any, shardings: Any = None) -> int:
  """Bytes of the arrays of `tree`: each one's shard under `shardings`, or all of it."""
  leaves = jax.tree.leaves(tree)
  sizes = (
      [math.prod(s.shard_shape(x.shape)) for x, s in zip(leaves, jax.tree.leaves(shardings))]
      if shardings is not None
      else [x.size for x in leaves]
  )
  return sum(n * x.dtype.itemsize for n, x in zip(sizes, leaves))


def estimate(
    config: ml_collections.ConfigDict,
    traced: Traced,
    mesh: dict[str, int],
    remat: str | None,
    accum_steps: int,
    target: chips.Target,
) -> Estimate:
  """Per-device bytes and step time of training `config` on `mesh` with this remat and accumulation."""
  state, tensor, layers = traced.state, mesh.get('tensor', 1), traced.model['num_layers']
  abstract_mesh = AbstractMesh(tuple(mesh.values()), tuple(mesh))
  shardings = sharding.state_shardings(state, abstract_mesh)
  params = _bytes(state['params'], shardings['params'])
  shard = params / _bytes(state['params'])  # The fraction of the parameters one device holds.
  images = config.batch_size // (mesh.get('data', 1) * mesh.get('fsdp', 1))  # Per device.
  micro = images // accum_steps
  per_device = lambda r: r[0] + (r[1] + r[2]) / tensor
  res, full = traced.residuals[remat], traced.residuals[None]
  kept = 1.0 if config.model.scan else KEPT_UNSCANNED
  block = kept * (res.block[0] + res.block[1] / tensor) + res.block[2] / tensor
  saved = micro * (layers * block + per_device(res.rest))
  saved += (res.weights_rest + layers * res.weights_block) * shard
  # The backward pass through one block holds what remat recomputes of it; a scanned block's also
  # copies its residuals out of the loop's stacked buffers and its gradients into them (about half a
  # block's residuals and a block's gradients on XLA:CPU).
  recomputed = per_device(full.block) - per_device(res.block)
  if config.model.scan:
    working = micro * max(recomputed, per_device(full.block) / 2) + traced.block_params * shard
  else:
    working = micro * kept * recomputed
  # A block's forward pass holds its widest activations at once; the residuals count them where the
  # block trains, not in a linear probe's frozen blocks (which keep none).
  forward = _transient(
      variants.family(config.variant), traced.model, config, config.image_size
  ) - per_device(res.block)
  working = max(working, micro * forward)
  # fsdp all-gathers each block's weights before using them: the one in use and the next one.
  gathered = 2 * traced.block_params / tensor if mesh.get('fsdp', 1) > 1 else 0
  # float32 images (a uint8 batch's, normalised in the step) and int32 labels; accumulation splits
  # them into micro-batches, a copy.
  inputs = images * (config.image_size**2 * 3 * 4 + 4) * (2 if accum_steps > 1 else 1)
  flops = chips.train_flops(
      traced.model,
      config.image_size,
      traced.num_classes,
      remat,
      traced.gradients,
      mae=config.mae if config.task == 'mae' else None,
  )
  teacher = 0
  if traced.teacher is not None:  # Its forward pass runs in the step, on each micro-batch.
    flops += traced.teacher.flops
    teacher_shardings = sharding.state_shardings(traced.teacher.params, abstract_mesh)
    teacher = int(
        _bytes(traced.teacher.params, teacher_shardings) + micro * traced.teacher.transient
    )
  return Estimate(
      mesh=mesh,
      remat=remat,
      accum_steps=accum_steps,
      params=params,
      # Of the parameters that train; accumulation adds a buffer: the running sum beside each
      # micro-batch's gradients.
      gradients=_bytes(traced.trained, sharding.state_shardings(traced.trained, abstract_mesh))
      * (2 if accum_steps > 1 else 1),
      optimizer_state=_bytes(state['opt_state'], shardings['opt_state']),
      polyak=_bytes(state['ema_params'], shardings['ema_params']),
      activations=int(inputs + saved + working + gathered),
      step_s=chips.step_seconds(flops * config.batch_size, target),
      teacher=teacher,
  )
