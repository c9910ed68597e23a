"""One optimizer update on a global batch: the function the loop jits over the mesh."""

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from vit_jax import sharding
from vit_jax.train import flexi, optim, param_groups
from vit_jax.data import on_device
from vit_jax.train.setup import Setup
from vit_jax.train.state import TrainState


def train_step(
    state: TrainState,
    batch: dict[str, jax.Array],
    teacher_params: Any = None,
    *,
    loss_fn: Callable,
    tx: optax.GradientTransformation,
    schedule: optax.Schedule,
    dropout_key: jax.Array,
    accum_steps: int = 1,
    micro_batch_sharding: Any = None,
    polyak_decay: float | None = None,
    mix: Callable | None = None,
    mix_key: jax.Array | None = None,
    frozen_labels: Callable[[Any], Any] | None = None,
) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update, optionally from `accum_steps` accumulated micro-batches of the batch.

  `loss_fn(params, images, labels, key)` is the task's loss (`task.make_loss`); `mix(images, labels,
  key, step)` (`task.mix`), if given, transforms the whole batch before it is split into micro-batches,
  so the mixing depends neither on the mesh nor on accum_steps. The dropout and mixing keys of step s
  are fold_in(dropout_key, s) and fold_in(mix_key, s), so a resumed run draws what an uninterrupted one
  would. `teacher_params` (config.distill's teacher) go to the loss as they are: no gradient.

  `frozen_labels(params)` (`param_groups.frozen_labels` of config.optim's frozen and trained) labels
  the parameters that do not train: their gradients are zeros from the start, so that nothing reads
  theirs and XLA computes none (a linear probe's step, the backbone frozen, is then its forward pass
  and the head's gradient, not a whole backward pass; low-rank adapters' needs no gradient of the
  weights they adapt); the gradient norm is the trained parameters' (as clipping's), and the Polyak
  average (`polyak_decay`) is theirs alone.
  """
  step_key = jax.random.fold_in(dropout_key, state.step)
  teacher = () if teacher_params is None else (teacher_params,)
  grad_fn = jax.value_and_grad(loss_fn)
  if frozen_labels is not None:
    grad_fn = _trained_only(grad_fn, frozen_labels(state.params))
  images, labels = on_device.model_input(batch['image']), on_device.labels(batch)
  if mix is not None:
    images, labels = mix(images, labels, jax.random.fold_in(mix_key, state.step), state.step)
  if accum_steps == 1:
    loss, grads = grad_fn(state.params, images, labels, step_key, *teacher)
  else:
    # Micro-batch i takes rows i, i + k, i + 2k, ...: every device holds a slice of every micro-batch.
    def split(x):
      x = x.reshape(x.shape[0] // accum_steps, accum_steps, *x.shape[1:]).swapaxes(0, 1)
      return jax.lax.with_sharding_constraint(x, micro_batch_sharding)

    def accumulate(totals, inputs):
      i, images, labels = inputs
      loss, grads = grad_fn(state.params, images, labels, jax.random.fold_in(step_key, i), *teacher)
      return jax.tree.map(jnp.add, totals, (loss, grads)), None

    zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, state.params))
    totals, _ = jax.lax.scan(
        accumulate, zeros, (jnp.arange(accum_steps), split(images), split(labels))
    )
    loss, grads = jax.tree.map(lambda x: x / accum_steps, totals)

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  ema_params = state.ema_params
  if polyak_decay is not None:
    trained = param_groups.trained_part(params, frozen_labels)  # A frozen one is its own average.
    ema_params = optax.incremental_update(trained, ema_params, step_size=1.0 - polyak_decay)
  metrics = {
      'train_loss': loss,
      'grad_norm': optax.global_norm(grads),
      # The rate this update applied: a skipped step (skip_nonfinite_steps) holds the count.
      'learning_rate': schedule(optim.schedule_step(state.opt_state, state.step)),
  }
  if isinstance(
      opt_state, optax.ApplyIfFiniteState
  ):  # config.skip_nonfinite_steps: the run's count.
    metrics['skipped_steps'] = opt_state.total_notfinite
  return (
      state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema_params=ema_params),
      metrics,
  )


def _trained_only(grad_fn: Callable, labels: Any) -> Callable:
  def trained_grad_fn(*args):
    loss, grads = grad_fn(*args)
    return loss, jax.tree.map(
        lambda g, label: jnp.zeros_like(g) if label == param_groups.FROZEN else g, grads, labels
    )

  return trained_grad_fn


@dataclasses.dataclass(frozen=True)
class TrainStep:
  """The jitted train step as a function of (state, batch): the arguments every step passes the same
  (a distillation teacher's parameters) are `fixed`."""

  jitted: Any  # jax.jit's.
  fixed: tuple[Any, ...] = ()

  def __call__(
      self, state: TrainState, batch: dict[str, jax.Array]
  ) -> tuple[TrainState, dict[str, jax.Array]]:
    return self.jitted(state, batch, *self.fixed)

  def lower(self, state: TrainState, batch: dict[str, jax.Array]) -> Any:
    """jax.jit's `lower`, for the compiled program's memory analysis (train/memory_fit.py)."""
    return self.jitted.lower(state, batch, *self.fixed)


def jit_train_step(setup: Setup, state_shardings: Any) -> TrainStep:
  """The run's train step, jitted over its mesh; the state (in `state_shardings`) is donated. A
  distillation teacher's parameters are placed once, sharded by the same rules as the student's, and
  passed to every step."""
  config, mesh = setup.config, setup.mesh
  seed_key = jax.random.key(config.seed)
  teacher = setup.teacher

  def make_loss(model: Any) -> Callable:
    return setup.task.make_loss(config, model, None if teacher is None else teacher.model)

  step = functools.partial(
      train_step,
      loss_fn=(
          flexi.make_loss(config, setup.model, make_loss)
          if flexi.enabled(config)
          else make_loss(setup.model)
      ),
      tx=setup.tx,
      schedule=setup.schedule,
      dropout_key=jax.random.fold_in(seed_key, 1),
      accum_steps=config.accum_steps,
      micro_batch_sharding=sharding.micro_batch_sharding(mesh),
      polyak_decay=config.polyak_decay,
      mix=setup.task.mix(config, setup.info.num_classes),
      mix_key=jax.random.fold_in(seed_key, 2),
      frozen_labels=param_groups.labeller(config.optim, setup.model_config),
  )
  in_shardings = (state_shardings, sharding.batch_sharding(mesh))
  if teacher is not None:
    teacher_shardings = sharding.state_shardings(jax.eval_shape(lambda: teacher.params), mesh)
    in_shardings += (teacher_shardings,)
  jitted = jax.jit(
      sharding.with_activation_sharding(step, mesh),
      in_shardings=in_shardings,
      out_shardings=(state_shardings, sharding.replicated(mesh)),
      donate_argnums=0,
  )
  if teacher is None:
    return TrainStep(jitted)
  return TrainStep(jitted, (jax.device_put(teacher.params, teacher_shardings),))
