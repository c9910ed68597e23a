"""Optimizers and learning-rate schedules from the config: AdamW pretraining, SGD-momentum fine-tuning,
Lion, optax's Adafactor and big_vision's; per-parameter multipliers, layer decay and freezing are
param_groups.py's.

`OPTIMIZERS` and `DECAYS` map the names `config.optim.name` and `config.lr.decay` accept to the function
that builds each: adding one is a function and an entry.
"""

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax import defaults
from vit_jax.train import param_groups
from vit_jax.models import variants

# (config.optim, schedule) -> the update rule, before clipping.
Optimizer = Callable[[ml_collections.ConfigDict, optax.Schedule], optax.GradientTransformation]
# (config.lr, decay_steps) -> the schedule after warmup, from lr.base at its step 0.
Decay = Callable[[ml_collections.ConfigDict, int], optax.Schedule]


def _decoupled(
    direction: optax.GradientTransformation,
    optim: ml_collections.ConfigDict,
    schedule: optax.Schedule,
) -> optax.GradientTransformation:
  """The chain of optax.adamw and optax.lion: a direction, plus weight decay, times the learning rate."""
  return optax.chain(
      direction, param_groups.add_decayed_weights(optim), optax.scale_by_learning_rate(schedule)
  )


# config.optim.b2 unset: each optimizer's own, as its paper and optax have it (Lion's 0.99 averages
# the gradients it keeps over far fewer steps than Adam's second moment).
# big_vision's Adafactor reads it as the cap of its growing second-moment decay, 1 - t^-0.8.
DEFAULT_B2 = {'adamw': 0.999, 'lion': 0.99, 'big_vision_adafactor': 0.999}


def beta2(optim: ml_collections.ConfigDict) -> float:
  """The b2 that config.optim names or, unset, its optimizer's own."""
  return DEFAULT_B2[optim.name] if optim.b2 is None else optim.b2


def _adamw(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  return _decoupled(
      optax.scale_by_adam(optim.b1, beta2(optim), mu_dtype=optim.mu_dtype), optim, schedule
  )


def _lion(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  return _decoupled(
      optax.scale_by_lion(optim.b1, beta2(optim), mu_dtype=optim.mu_dtype), optim, schedule
  )


def _adafactor(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  # optax adds adafactor's weight decay after the learning rate: scheduled here, so that it is the
  # decoupled weight decay times the learning rate, as for adamw.
  return optax.adafactor(
      schedule,
      weight_decay_rate=lambda step: optim.weight_decay * schedule(step),
      weight_decay_mask=param_groups.kernels_only,
  )


def _big_vision_adafactor(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  # The Adafactor big_vision trains its largest ViTs with (Zhai et al. 2022, "Scaling Vision
  # Transformers"; big_vision/optax.py's scale_by_adafactor at its defaults): optax's
  # factored second moment over arrays whose two largest dimensions are at least 32, no update
  # clipping and no scaling by the parameters' RMS, then a first moment that is not debiased.
  cap = beta2(optim)
  second_moment = optax.scale_by_factored_rms(
      decay_rate=0.8,
      min_dim_size_to_factor=32,
      epsilon=1e-30,
      decay_rate_fn=lambda step, exponent: jnp.minimum(
          cap, 1.0 - (jnp.asarray(step, jnp.float32) + 1.0) ** -exponent
      ),
  )
  first_moment = (
      optax.ema(optim.momentum, debias=False, accumulator_dtype=optim.mu_dtype)
      if optim.momentum
      else optax.identity()
  )
  return _decoupled(optax.chain(second_moment, first_moment), optim, schedule)


def _sgd(
    optim: ml_collections.ConfigDict, schedule: optax.Schedule
) -> optax.GradientTransformation:
  # Weight decay here is an L2 term added to the gradient (the fine-tuning recipe uses none).
  return optax.chain(
      param_groups.add_decayed_weights(optim) if optim.weight_decay else optax.identity(),
      optax.sgd(schedule, momentum=optim.momentum or None),
  )


def _linear(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  return optax.linear_schedule(lr.base, lr.end, steps)


def _cosine(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  return optax.cosine_decay_schedule(lr.base, steps, alpha=lr.end / lr.base if lr.base else 0.0)


def _constant(lr: ml_collections.ConfigDict, steps: int) -> optax.Schedule:
  del steps  # Unused: the same value at every step.
  return optax.constant_schedule(lr.base)


OPTIMIZERS: dict[str, Optimizer] = {
    'adamw': _adamw,
    'sgd': _sgd,
    'lion': _lion,
    'adafactor': _adafactor,
    'big_vision_adafactor': _big_vision_adafactor,
}
# The optimizers whose first moment config.optim.mu_dtype sets.
MU_DTYPE_OPTIMIZERS = ('adamw', 'lion', 'big_vision_adafactor')
DECAYS: dict[str, Decay] = {'linear': _linear, 'cosine': _cosine, 'constant': _constant}


def _lookup(registry: dict, field: str, name: str):
  if name not in registry:
    raise ValueError(f'Unknown {field} {name!r}: use one of {", ".join(registry)}')
  return registry[name]


def _check_range(field: str, value: float, high: float, example: str) -> None:
  """`value` must be in [0, high) (NaN is not)."""
  if not 0 <= value < high:
    bounds = 'a finite number >= 0' if high == math.inf else f'in [0, {high})'
    raise ValueError(f'config.{field}={value} must be {bounds}: set it to e.g. {example}')


def _check_lr(lr: ml_collections.ConfigDict) -> None:
  _lookup(DECAYS, 'lr.decay', lr.decay)
  if lr.decay == 'constant' and lr.end:  # A constant rate never reaches it: the field does nothing.
    raise ValueError(
        f"config.lr.end={lr.end} is where a decay ends, and lr.decay='constant' has none: "
        'set --config.lr.end=0.0, or --config.lr.decay=cosine'
    )
  _check_range('lr.base', lr.base, math.inf, '1e-3')
  _check_range('lr.warmup_steps', lr.warmup_steps, math.inf, '10000 (0: no warmup)')
  _check_range('lr.end', lr.end, math.inf, '0.0')
  if lr.decay == 'cosine' and lr.end and not lr.base:  # optax's alpha: end as a fraction of base.
    raise ValueError(
        f'config.lr.end={lr.end} with lr.base=0: a cosine decay ends at a fraction of its base, so '
        'stays at 0; set --config.lr.base above 0, or --config.lr.decay=linear'
    )


def _check_update(config: ml_collections.ConfigDict, model_config: dict[str, Any]) -> None:
  optim = config.optim
  _lookup(OPTIMIZERS, 'optim.name', optim.name)
  _check_range('optim.b1', optim.b1, 1, '0.9')
  if optim.b2 is not None:
    _check_range('optim.b2', optim.b2, 1, '0.999')
    if optim.name not in DEFAULT_B2:  # sgd, adafactor: the field would do nothing.
      raise ValueError(
          f'config.optim.b2={optim.b2} is the second-moment decay of '
          f'{", ".join(DEFAULT_B2)}, which {optim.name} does not use: unset it'
      )
  _check_range('optim.weight_decay', optim.weight_decay, math.inf, '0.1 (0: none)')
  _check_range('optim.momentum', optim.momentum, 1, '0.9 (0: none)')
  _check_first_moment(optim)
  _check_range('grad_clip_norm', config.grad_clip_norm, math.inf, '1.0 (0: no clipping)')
  if config.skip_nonfinite_steps < 0:
    raise ValueError(
        f'config.skip_nonfinite_steps={config.skip_nonfinite_steps} must be at least 0 '
        '(0: stop at the first non-finite step)'
    )
  _check_mu_dtype(optim)
  param_groups.check_config(optim)
  if optim.layer_decay is not None:
    variants.require_vit(config.variant, 'config.optim.layer_decay (a learning rate per ViT block)')
  if optim.name in ('adafactor', 'big_vision_adafactor'):
    _check_adafactor(config, model_config)


# The first-moment decay each optimizer reads (adafactor keeps none): the other is refused when changed
# from its default, which the optimizer would silently ignore.
_FIRST_MOMENT = {
    'adamw': 'b1',
    'lion': 'b1',
    'sgd': 'momentum',
    'adafactor': None,
    'big_vision_adafactor': 'momentum',
}


def _check_first_moment(optim: ml_collections.ConfigDict) -> None:
  read, default = _FIRST_MOMENT[optim.name], defaults.get_config().optim
  for field in ('b1', 'momentum'):
    if field != read and optim[field] != default[field]:
      fix = f'set config.optim.{read} instead' if read else f'leave it at {default[field]}'
      reads = f'whose first-moment decay is optim.{read}' if read else 'which keeps no first moment'
      raise ValueError(
          f'config.optim.{field}={optim[field]} does nothing with optim.name={optim.name!r}, '
          f'{reads}: {fix}'
      )


def _check_mu_dtype(optim: ml_collections.ConfigDict) -> None:
  if optim.mu_dtype is None:
    return
  if optim.name not in MU_DTYPE_OPTIMIZERS:
    raise ValueError(
        f'config.optim.mu_dtype={optim.mu_dtype!r} is the first moment of '
        f'{", ".join(MU_DTYPE_OPTIMIZERS)}, which {optim.name} does not keep: unset it'
    )
  if optim.name == 'big_vision_adafactor' and not optim.momentum:
    raise ValueError(
        f'config.optim.mu_dtype={optim.mu_dtype!r} is the first moment, which optim.momentum=0 '
        'turns off: unset it, or set optim.momentum, e.g. 0.9'
    )
  try:
    floating = jnp.issubdtype(jnp.dtype(optim.mu_dtype), jnp.floating)
  except TypeError:
    floating = False
  if not floating:
    raise ValueError(
        f'config.optim.mu_dtype={optim.mu_dtype!r} must name a float dtype, e.g. '
        "'bfloat16' (unset: the parameters' float32)"
    )


def _check_adafactor(config: ml_collections.ConfigDict, model_config: dict[str, Any]) -> None:
  name = config.optim.name
  if name == 'adafactor' and config.optim.wd_mults:
    raise ValueError(
        'config.optim.wd_mults are not supported by adafactor (its weight decay is '
        "optax's, one rate for all kernels): unset them, or use adamw or big_vision_adafactor"
    )
  if model_config.get('scan'):  # Only a ViT has it.
    # Both factor each array's second moment over its two largest dimensions, and optax's clips and
    # scales each by its RMS: a stacked array's are of all blocks at once.
    raise ValueError(
        f'config.optim.name={name} factors and scales each parameter array, which a scanned '
        'model (config.model.scan) stacks over its blocks: set --config.model.scan=False, or use '
        'adamw'
    )


def check_optim(config: ml_collections.ConfigDict, model_config: dict[str, Any]) -> None:
  """Raises a one-line ValueError, naming the field and a fix, if `config.optim`, `config.lr` or
  `config.grad_clip_norm` is invalid for the model of `model_config` (`variants.get_model_config`
  of the config); builds nothing."""
  _check_lr(config.lr)
  _check_update(config, model_config)


def make_schedule(lr: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr.base` over `lr.warmup_steps`, then `lr.decay` to `lr.end`."""
  _check_lr(lr)
  decay = DECAYS[lr.decay](lr, max(total_steps - lr.warmup_steps, 1))
  if not lr.warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, lr.base, lr.warmup_steps)
  return optax.join_schedules([warmup, decay], [lr.warmup_steps])


def make_optimizer(
    config: ml_collections.ConfigDict, total_steps: int, model_config: dict[str, Any]
) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer named by `config.optim`: global-norm clipping, the update rule and the parameter
  groups' multipliers, over the parameters that train (frozen ones get zero updates, keep no state and
  count in no clipping norm, as in big_vision), for the model of `model_config`
  (`variants.get_model_config` of the config: layer decay reads its depth). Returns it and its
  schedule. `train/setup.prepare` builds the run's, once (`Setup.tx`, `Setup.schedule`).

  Raises the one-line errors of `check_optim` for an invalid config; those that need the parameters'
  paths are `param_groups.check_param_groups`'s."""
  _check_update(config, model_config)
  schedule = make_schedule(config.lr, total_steps)
  tx = OPTIMIZERS[config.optim.name](config.optim, schedule)
  if param_groups.scales_updates(config.optim):
    # Layer decay needs the depth; it is a ViT's (checked above), a BiT has no num_layers.
    depth = model_config['num_layers'] if config.optim.layer_decay is not None else 0
    tx = optax.chain(tx, param_groups.scale_by_lr_multipliers(config.optim, depth))
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  tx = param_groups.freeze(tx, config.optim, model_config)
  if config.skip_nonfinite_steps:  # The loop stops the run when more steps than that were skipped.
    tx = optax.apply_if_finite(tx, max_consecutive_errors=config.skip_nonfinite_steps)
  return tx, schedule


def _is_schedule_state(node: Any) -> bool:
  return isinstance(node, optax.ScaleByScheduleState)


def schedule_step(opt_state: Any, step: jax.Array) -> jax.Array:
  """The step of the schedule that the next update of `opt_state` applies: the count of the updates the
  optimizer has made, which the learning rate (optax.scale_by_learning_rate) reads.

  It is not always the train state's `step`: a step skipped for non-finite gradients
  (config.skip_nonfinite_steps, optax.apply_if_finite) leaves the optimizer's state, its count included,
  as it was, so after k skipped steps the rate applied is schedule(step - k). The logged learning rate
  must be schedule(schedule_step(opt_state, step)) to be the one applied. `step` is returned when no
  state counts (every parameter frozen: nothing is applied)."""
  counts = [
      s.count
      for s in jax.tree.leaves(opt_state, is_leaf=_is_schedule_state)
      if _is_schedule_state(s)
  ]
  return counts[0] if counts else step
