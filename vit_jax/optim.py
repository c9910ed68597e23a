"""Optimizers and learning-rate schedules from the config: AdamW pretraining, SGD-momentum fine-tuning.

`OPTIMIZERS` and `DECAYS` map the names `config.optim.name` and `config.lr.decay` accept to the function
that builds each: adding one is a function and an entry.
"""
import math
from typing import Callable

import jax
import ml_collections
import optax

# (config.optim, schedule) -> the update rule, before clipping.
Optimizer = Callable[[ml_collections.ConfigDict, optax.Schedule], optax.GradientTransformation]
# (config.lr, decay_steps) -> the schedule after warmup, from lr.base at its step 0.
Decay = Callable[[ml_collections.ConfigDict, int], optax.Schedule]


def _kernels_only(params):
  """Weight decay applies to weight matrices, not to biases, norms, embeddings or the class token."""
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == 'kernel', params)


def _adamw(optim: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
  return optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                     mask=_kernels_only)


def _sgd(optim: ml_collections.ConfigDict, schedule: optax.Schedule) -> optax.GradientTransformation:
  # Weight decay here is an L2 term added to the gradient (the fine-tuning recipe uses none).
  return optax.chain(
      optax.add_decayed_weights(optim.weight_decay, mask=_kernels_only) if optim.weight_decay
      else optax.identity(),
      optax.sgd(schedule, momentum=optim.momentum or None))


def _linear(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  return optax.linear_schedule(lr.base, lr.end, steps)


def _cosine(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  return optax.cosine_decay_schedule(lr.base, steps, alpha=lr.end / lr.base if lr.base else 0.)


def _constant(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  del steps  # Unused: the same value at every step.
  return optax.constant_schedule(lr.base)


OPTIMIZERS: dict[str, Optimizer] = {'adamw': _adamw, 'sgd': _sgd}
DECAYS: dict[str, Decay] = {'linear': _linear, 'cosine': _cosine, 'constant': _constant}


def _lookup(registry: dict, field: str, name: str):
  if name not in registry:
    raise ValueError(f'Unknown {field} {name!r}: use one of {", ".join(registry)}')
  return registry[name]


def _check_range(field: str, value: float, high: float, example: str) -> None:
  """`value` must be in [0, high) (NaN is not)."""
  if not 0 <= value < high:
    bounds = '>= 0' if high == math.inf else f'in [0, {high})'
    raise ValueError(f'config.{field}={value} must be {bounds}: set it to e.g. {example}')


def _check_lr(lr: ml_collections.ConfigDict) -> None:
  _lookup(DECAYS, 'lr.decay', lr.decay)
  _check_range('lr.base', lr.base, math.inf, '1e-3')
  _check_range('lr.warmup_steps', lr.warmup_steps, math.inf, '10000 (0: no warmup)')
  _check_range('lr.end', lr.end, math.inf, '0.0')


def _check_update(config: ml_collections.ConfigDict) -> None:
  optim = config.optim
  _lookup(OPTIMIZERS, 'optim.name', optim.name)
  _check_range('optim.b1', optim.b1, 1, '0.9')
  _check_range('optim.b2', optim.b2, 1, '0.999')
  _check_range('optim.weight_decay', optim.weight_decay, math.inf, '0.1 (0: none)')
  _check_range('optim.momentum', optim.momentum, 1, '0.9 (0: none)')
  _check_range('grad_clip_norm', config.grad_clip_norm, math.inf, '1.0 (0: no clipping)')


def check_optim(config: ml_collections.ConfigDict) -> None:
  """Raises a one-line ValueError, naming the field and a fix, if `config.optim`, `config.lr` or
  `config.grad_clip_norm` is invalid; builds nothing."""
  _check_lr(config.lr)
  _check_update(config)


def make_schedule(lr: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr.base` over `lr.warmup_steps`, then `lr.decay` to `lr.end`."""
  _check_lr(lr)
  decay = DECAYS[lr.decay](lr, max(total_steps - lr.warmup_steps, 1))
  if not lr.warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, lr.base, lr.warmup_steps)
  return optax.join_schedules([warmup, decay], [lr.warmup_steps])


def make_optimizer(config: ml_collections.ConfigDict,
                   total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer named by `config.optim`, with clipping first; returns it and its schedule.

  Raises the one-line errors of `check_optim` for an invalid config."""
  _check_update(config)
  schedule = make_schedule(config.lr, total_steps)
  tx = OPTIMIZERS[config.optim.name](config.optim, schedule)
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, schedule
