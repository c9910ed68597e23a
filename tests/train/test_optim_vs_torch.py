"""The optimizers and schedules against independent implementations: torch.optim (AdamW, SGD with
momentum, per-group learning rates and weight decays, clip_grad_norm_), timm's CosineLRScheduler, the
original ViT / big_vision schedule formula and the Lion paper's update, written in NumPy; and the
Polyak average of the train step against its recursion."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import timm.scheduler
import torch

import helpers
from vit_jax.train import optim
from vit_jax.train import state as train_state, step as train_step

STEPS = 10
# Clipping at 1, and gradients of global norm below 1 and about 10 in turn: every other step clips.
COMMON = {
    'lr.base': 0.1,
    'lr.warmup_steps': 3,
    'lr.decay': 'cosine',
    'lr.end': 0.01,
    'grad_clip_norm': 1.0,
}


def _params():
  rng = np.random.default_rng(0)
  return {
      'dense': {
          'kernel': rng.normal(size=(4, 3)).astype(np.float32),
          'bias': rng.normal(size=3).astype(np.float32),
      },
      'norm': {'scale': rng.normal(size=3).astype(np.float32)},
  }


def _grads():
  rng = np.random.default_rng(1)
  return [
      jax.tree.map(
          lambda p, s=s: (rng.normal(size=p.shape) * (3.0 if s % 2 else 0.1)).astype(np.float32),
          _params(),
      )
      for s in range(STEPS)
  ]


NAMES = ('dense/kernel', 'dense/bias', 'norm/scale')


def _leaf(tree, name):
  outer, inner = name.split('/')
  return tree[outer][inner]


def _ours(overrides: dict) -> tuple[dict, optax.Schedule]:
  """Our parameters after STEPS updates, and the schedule."""
  config = helpers.load_config('demo', overrides)
  tx, schedule = optim.make_optimizer(config, STEPS, helpers.model_config(config))
  params = jax.tree.map(jnp.asarray, _params())
  state = tx.init(params)
  update = jax.jit(tx.update)
  for grads in _grads():
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, schedule


def _torch(make_optimizer, schedule: optax.Schedule, clip: float, trained=NAMES) -> dict:
  """torch's parameters after STEPS steps: clip_grad_norm_ over the trained ones, then the optimizer
  at each group's learning rate times schedule(step) / lr.base (a LambdaLR stepped per update)."""
  tensors = {name: torch.nn.Parameter(torch.tensor(_leaf(_params(), name))) for name in NAMES}
  optimizer = make_optimizer(tensors)
  scheduler = torch.optim.lr_scheduler.LambdaLR(
      optimizer, lambda step: float(schedule(step)) / COMMON['lr.base']
  )
  for grads in _grads():
    for name in trained:
      tensors[name].grad = torch.tensor(_leaf(grads, name))
    if clip:
      torch.nn.utils.clip_grad_norm_([tensors[name] for name in trained], clip)
    optimizer.step()
    scheduler.step()
  return {name: t.detach().numpy() for name, t in tensors.items()}


def _assert_close(ours, theirs, rtol=1e-5, atol=1e-6):
  for name in NAMES:
    np.testing.assert_allclose(_leaf(ours, name), theirs[name], rtol=rtol, atol=atol, err_msg=name)


def test_adamw_with_clipping_and_warmup_cosine_is_torchs():
  # Decoupled weight decay times the learning rate, on kernels only, as torch.optim.AdamW does.
  ours, schedule = _ours(
      {
          **COMMON,
          'optim.name': 'adamw',
          'optim.weight_decay': 0.3,
          'optim.b1': 0.9,
          'optim.b2': 0.99,
      }
  )
  theirs = _torch(
      lambda t: torch.optim.AdamW(
          [
              {'params': [t['dense/kernel']], 'weight_decay': 0.3},
              {'params': [t['dense/bias'], t['norm/scale']], 'weight_decay': 0.0},
          ],
          lr=0.1,
          betas=(0.9, 0.99),
          eps=1e-8,
      ),
      schedule,
      clip=1.0,
  )
  _assert_close(ours, theirs)


@pytest.mark.parametrize('weight_decay', [0.0, 0.01])
def test_sgd_momentum_with_clipping_is_torchs(weight_decay):
  # Weight decay here is torch.optim.SGD's: an L2 term added to the clipped gradient.
  ours, schedule = _ours(
      {**COMMON, 'optim.name': 'sgd', 'optim.momentum': 0.9, 'optim.weight_decay': weight_decay}
  )
  theirs = _torch(
      lambda t: torch.optim.SGD(
          [
              {'params': [t['dense/kernel']], 'weight_decay': weight_decay},
              {'params': [t['dense/bias'], t['norm/scale']], 'weight_decay': 0.0},
          ],
          lr=0.1,
          momentum=0.9,
      ),
      schedule,
      clip=1.0,
  )
  _assert_close(ours, theirs)


def test_lr_and_wd_multipliers_are_torchs_param_groups():
  # A group's lr multiplier scales its learning rate, and so its decoupled weight decay too (torch
  # multiplies AdamW's decay by the group's lr); a wd multiplier scales the group's weight decay.
  ours, schedule = _ours(
      {
          **COMMON,
          'optim.name': 'adamw',
          'optim.weight_decay': 0.3,
          'optim.lr_mults': (('^norm/', 3.0), ('dense/kernel', 0.5)),
          'optim.wd_mults': (('dense/kernel', 2.0),),
      }
  )
  theirs = _torch(
      lambda t: torch.optim.AdamW(
          [
              {'params': [t['dense/kernel']], 'lr': 0.05, 'weight_decay': 0.6},
              {'params': [t['dense/bias']], 'lr': 0.1, 'weight_decay': 0.0},
              {'params': [t['norm/scale']], 'lr': 0.3, 'weight_decay': 0.0},
          ],
          lr=0.1,
          betas=(0.9, 0.999),
          eps=1e-8,
      ),
      schedule,
      clip=1.0,
  )
  _assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def test_frozen_parameters_are_outside_torchs_optimizer():
  # SGD momentum with weight decay: a frozen kernel gets neither; the others train (and clip) as if
  # it were not there, as torch with the kernel left out of the optimizer and of clip_grad_norm_.
  ours, schedule = _ours(
      {
          **COMMON,
          'optim.name': 'sgd',
          'optim.momentum': 0.9,
          'optim.weight_decay': 0.01,
          'optim.frozen': ('dense/kernel',),
      }
  )
  theirs = _torch(
      lambda t: torch.optim.SGD(
          [t['dense/bias'], t['norm/scale']], lr=0.1, momentum=0.9, weight_decay=0.0
      ),
      schedule,
      clip=1.0,
      trained=('dense/bias', 'norm/scale'),
  )
  _assert_close(ours, theirs)
  np.testing.assert_array_equal(ours['dense']['kernel'], _params()['dense']['kernel'])


def test_lion_is_the_papers_update():
  # Chen et al. 2023, Algorithm 2: c = b1 m + (1 - b1) g; p -= lr (sign(c) + wd p);
  # m = b2 m + (1 - b2) g; after global-norm clipping, decay on kernels only.
  ours, schedule = _ours(
      {**COMMON, 'optim.name': 'lion', 'optim.weight_decay': 0.3, 'optim.b1': 0.9, 'optim.b2': 0.99}
  )
  params = {name: _leaf(_params(), name).astype(np.float64) for name in NAMES}
  moments = {name: np.zeros_like(p) for name, p in params.items()}
  for step, grads in enumerate(_grads()):
    grads = {name: _leaf(grads, name).astype(np.float64) for name in NAMES}
    norm = np.sqrt(sum(np.sum(g**2) for g in grads.values()))
    scale = min(1.0, COMMON['grad_clip_norm'] / norm)
    lr = float(schedule(step))
    for name, g in grads.items():
      g = g * scale
      wd = 0.3 if name.endswith('kernel') else 0.0
      params[name] -= lr * (np.sign(0.9 * moments[name] + 0.1 * g) + wd * params[name])
      moments[name] = 0.99 * moments[name] + 0.01 * g
  _assert_close(ours, params)


def _big_vision_schedule(step, *, base, warmup, total, decay, end):
  """The original ViT's / big_vision's `create_learning_rate_schedule` (with an end value for cosine,
  as timm's lr_min), in NumPy."""
  progress = np.clip((step - warmup) / (total - warmup), 0.0, 1.0)
  if decay == 'linear':
    lr = end + (base - end) * (1.0 - progress)
  elif decay == 'cosine':
    lr = end + (base - end) * 0.5 * (1.0 + np.cos(np.pi * progress))
  else:
    lr = base
  return lr * min(1.0, step / warmup) if warmup else lr


# (base, warmup, total, decay, end): total steps not a multiple of the warmup, no warmup, one step of
# decay, a linear end of 1e-5 (the original ViT's default).
SCHEDULES = [
    (1.0, 10, 110, 'linear', 0.0),
    (3e-3, 7, 101, 'linear', 1e-5),
    (1.0, 10, 113, 'cosine', 0.1),
    (0.5, 0, 37, 'cosine', 0.0),
    (0.5, 0, 37, 'linear', 0.0),
    (1.0, 5, 6, 'cosine', 0.0),
    (2.0, 3, 17, 'constant', 0.0),
]


def _schedule(base, warmup, total, decay, end):
  config = helpers.load_config(
      'demo', {'lr.base': base, 'lr.warmup_steps': warmup, 'lr.decay': decay, 'lr.end': end}
  )
  return optim.make_schedule(config.lr, total)


@pytest.mark.parametrize('base,warmup,total,decay,end', SCHEDULES)
def test_schedule_is_the_original_vits_at_every_step(base, warmup, total, decay, end):
  schedule = _schedule(base, warmup, total, decay, end)
  steps = np.arange(total + 1)
  want = [
      _big_vision_schedule(s, base=base, warmup=warmup, total=total, decay=decay, end=end)
      for s in steps
  ]
  np.testing.assert_allclose(jax.vmap(schedule)(steps), want, rtol=1e-6, atol=1e-7 * base)


@pytest.mark.parametrize(
    'base,warmup,total,end',
    [
        (1.0, 10, 113, 0.1),
        (0.5, 0, 37, 0.0),
        (1.0, 5, 6, 0.0),
        (
            1.0,
            20,
            10,
            0.0,
        ),  # Warmup longer than the run: both rise to base * 10 / 20 and stop there.
    ],
)
def test_cosine_schedule_is_timms_cosine_lr_scheduler(base, warmup, total, end):
  # timm's scheduler stepped per update, its warmup before the cosine (warmup_prefix): update s
  # applies the rate set after step_update(s).
  schedule = _schedule(base, warmup, total, 'cosine', end)
  optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base)
  scheduler = timm.scheduler.CosineLRScheduler(
      optimizer,
      t_initial=max(total - warmup, 1),
      lr_min=end,
      warmup_t=warmup,
      warmup_lr_init=0.0,
      warmup_prefix=True,
      t_in_epochs=False,
  )
  theirs = [optimizer.param_groups[0]['lr']]
  for step in range(1, total):
    scheduler.step_update(num_updates=step)
    theirs.append(optimizer.param_groups[0]['lr'])
  np.testing.assert_allclose(jax.vmap(schedule)(np.arange(total)), theirs, rtol=1e-6, atol=1e-7)


def test_polyak_average_is_the_exponential_moving_average_from_the_initial_parameters():
  # ema_0 = the initial parameters; ema_t = d ema_{t-1} + (1 - d) params_t after update t.
  config = helpers.load_config(
      'demo',
      {
          'optim.name': 'sgd',
          'optim.momentum': 0.0,
          'optim.weight_decay': 0.0,
          'grad_clip_norm': 0.0,
          'lr.base': 0.1,
          'lr.warmup_steps': 0,
          'lr.decay': 'constant',
      },
  )
  tx, schedule = optim.make_optimizer(config, STEPS, helpers.model_config(config))

  def loss_fn(params, images, labels, key):  # The gradient is the mean image: known in advance.
    del labels, key
    return jnp.sum(jnp.mean(images, axis=0) * params['w'])

  params = {'w': jnp.asarray(_params()['dense']['kernel'])}
  state = train_state.TrainState(
      step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), ema_params=params
  )
  step = jax.jit(
      lambda state, batch: train_step.train_step(
          state,
          batch,
          loss_fn=loss_fn,
          tx=tx,
          schedule=schedule,
          dropout_key=jax.random.key(0),
          polyak_decay=0.9,
      )
  )
  w = ema = np.asarray(params['w'], np.float64)
  for grads in _grads()[:5]:
    g = grads['dense']['kernel']
    state, _ = step(state, {'image': np.stack([g, g]), 'label': np.zeros(2, np.int32)})
    w = w - 0.1 * g
    ema = 0.9 * ema + 0.1 * w
  np.testing.assert_allclose(state.params['w'], w, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(state.ema_params['w'], ema, rtol=1e-5, atol=1e-6)
