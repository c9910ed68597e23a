"""Optimizers and learning-rate schedules from the config: AdamW pretraining, SGD-momentum fine-tuning."""
import jax
import ml_collections
import optax

DECAYS = ('linear', 'cosine', 'constant')
OPTIMIZERS = ('adamw', 'sgd')


def make_schedule(lr: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  """Linear warmup from 0 to `lr.base` over `lr.warmup_steps`, then `lr.decay` to `lr.end`."""
  decay_steps = max(total_steps - lr.warmup_steps, 1)
  if lr.decay == 'linear':
    decay = optax.linear_schedule(lr.base, lr.end, decay_steps)
  elif lr.decay == 'cosine':
    decay = optax.cosine_decay_schedule(lr.base, decay_steps, alpha=lr.end / lr.base if lr.base else 0.)
  elif lr.decay == 'constant':
    decay = optax.constant_schedule(lr.base)
  else:
    raise ValueError(f'Unknown lr.decay {lr.decay!r}: use one of {", ".join(DECAYS)}')
  if not lr.warmup_steps:
    return decay
  warmup = optax.linear_schedule(0.0, lr.base, lr.warmup_steps)
  return optax.join_schedules([warmup, decay], [lr.warmup_steps])


def _kernels_only(params):
  """Weight decay applies to weight matrices, not to biases, norms, embeddings or the class token."""
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == 'kernel', params)


def make_optimizer(config: ml_collections.ConfigDict,
                   total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimizer named by `config.optim`, with clipping first; returns it and its schedule."""
  schedule = make_schedule(config.lr, total_steps)
  optim = config.optim
  if optim.name == 'adamw':
    tx = optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                     mask=_kernels_only)
  elif optim.name == 'sgd':
    # Weight decay here is an L2 term added to the gradient (the fine-tuning recipe uses none).
    tx = optax.chain(
        optax.add_decayed_weights(optim.weight_decay, mask=_kernels_only) if optim.weight_decay
        else optax.identity(),
        optax.sgd(schedule, momentum=optim.momentum or None))
  else:
    raise ValueError(f'Unknown optim.name {optim.name!r}: use one of {", ".join(OPTIMIZERS)}')
  if config.grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(config.grad_clip_norm), tx)
  return tx, schedule
