"""Batch Mixup / CutMix in the train step: against timm's `Mixup(mode='batch')`, its statistics, its
end, the loss on soft targets, and the same step on any mesh and with gradient accumulation."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import checkpoint
from vit_jax.tasks import classification, mixing
from vit_jax.train import setup as train_setup, state as train_state, step as train_step

NUM_CLASSES, SMOOTHING = 5, 0.1
# Odd sizes, so that CutMix's boxes are clipped on every side and its lam needs correcting.
HEIGHT, WIDTH = 12, 10


def _mix_config(**fields) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(
      {
          **dict(mixup_alpha=0.0, cutmix_alpha=0.0, prob=1.0, switch_prob=0.5, until_step=None),
          **fields,
      }
  )


def _batch(seed=0, size=6, height=HEIGHT, width=WIDTH):
  rng = np.random.default_rng(seed)
  return (
      rng.uniform(-1, 1, (size, height, width, 3)).astype(np.float32),
      rng.integers(0, NUM_CLASSES, size).astype(np.int32),
  )


def _draws(mix, n=4000, step=0):
  keys = jax.random.split(jax.random.key(0), n)
  return jax.vmap(lambda key: mixing.draw(key, step, mix, 16, 16))(keys)


def test_draws_follow_prob_switch_prob_and_beta():
  draws = _draws(_mix_config(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, switch_prob=0.4))
  cutmix, lam = np.asarray(draws.cutmix), np.asarray(draws.lam)
  mixed = cutmix | (lam != 1)
  assert abs(mixed.mean() - 0.7) < 0.03
  assert abs(cutmix[mixed].mean() - 0.4) < 0.04
  # CutMix's lam is the share of the image outside its box.
  np.testing.assert_allclose(
      lam[cutmix], jax.vmap(mixing.box_lam, (0, None, None))(draws.box[cutmix], 16, 16)
  )

  alpha = 0.4  # Mixup alone: lam ~ Beta(a, a), mean 1/2, variance 1 / (4 (2a + 1)).
  lam = np.asarray(_draws(_mix_config(mixup_alpha=alpha)).lam)
  assert abs(lam.mean() - 0.5) < 0.025
  assert abs(lam.var() - 1 / (4 * (2 * alpha + 1))) < 0.01
  assert not np.asarray(_draws(_mix_config(mixup_alpha=alpha)).cutmix).any()
  assert np.asarray(_draws(_mix_config(cutmix_alpha=1.0)).cutmix).all()


def test_mixing_stops_at_until_step():
  config = ml_collections.ConfigDict(
      dict(
          mix=_mix_config(mixup_alpha=1.0, cutmix_alpha=1.0, until_step=3),
          label_smoothing=SMOOTHING,
      )
  )
  mix = jax.jit(classification.mix(config, NUM_CLASSES))
  images, labels = _batch()
  logits = jnp.asarray(np.random.default_rng(1).normal(size=(6, NUM_CLASSES)), jnp.float32)
  for step in range(6):
    mixed, targets = mix(images, labels, jax.random.key(step), step)
    if step < 3:
      assert not np.allclose(mixed, images)
      continue
    np.testing.assert_array_equal(mixed, images)
    np.testing.assert_allclose(
        classification.compute_loss(logits, targets, loss=_loss('softmax_xent')),
        classification.compute_loss(
            logits, labels, loss=_loss('softmax_xent'), label_smoothing=SMOOTHING
        ),
        rtol=1e-6,
    )


def _loss(name: str) -> classification.PerExampleLoss:
  """Loss `name` of each example, with the defaults of its settings (config.asl)."""
  return classification.loss_of_examples(helpers.load_config('demo', {'loss': name}))


def _numpy_loss(logits, targets, loss):
  if loss == 'softmax_xent':
    log_softmax = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    return -(targets * log_softmax).sum(-1).mean()
  if loss == 'asl':  # The paper's defaults: gamma_neg 4, gamma_pos 1, clip 0.05.
    p = 1 / (1 + np.exp(-logits))
    p_neg = np.minimum(1 - p + 0.05, 1)
    weight = (1 - (p * targets + p_neg * (1 - targets))) ** (targets + 4 * (1 - targets))
    return -((targets * np.log(p) + (1 - targets) * np.log(p_neg)) * weight).sum(-1).mean()
  log_sigmoid, log_not_sigmoid = -np.log1p(np.exp(-logits)), -np.log1p(np.exp(logits))
  return -(targets * log_sigmoid + (1 - targets) * log_not_sigmoid).sum(-1).mean()


@pytest.mark.parametrize('loss', classification.LOSSES)
@pytest.mark.parametrize('smoothing', [0.0, 0.1])
def test_soft_one_hot_targets_give_the_integer_label_loss(loss, smoothing):
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(8, NUM_CLASSES)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, 8).astype(np.int32)
  # timm's smoothing: off = s / K, on = 1 - s + off.
  targets = np.full((8, NUM_CLASSES), smoothing / NUM_CLASSES, np.float32)
  targets[np.arange(8), labels] += 1 - smoothing
  integer = classification.compute_loss(
      jnp.asarray(logits), labels, loss=_loss(loss), label_smoothing=smoothing
  )
  soft = classification.compute_loss(
      jnp.asarray(logits), jnp.asarray(targets), loss=_loss(loss), label_smoothing=smoothing
  )  # Soft targets: smoothed already.
  np.testing.assert_allclose(soft, integer, rtol=1e-6)
  np.testing.assert_allclose(soft, _numpy_loss(logits.astype(np.float64), targets, loss), rtol=1e-5)


_MIX = dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=1.0, switch_prob=0.5, until_step=None)
_TRAIN = {  # SGD and no dropout: one step's parameters compare across meshes and accumulation.
    **helpers.TINY,
    'model.num_layers': 1,
    'lr.warmup_steps': 0,
    'lr.decay': 'constant',
    'lr.base': 0.5,
    'optim.name': 'sgd',
    'optim.weight_decay': 0.0,
    'model.dropout_rate': 0.0,
    'model.head_dropout_rate': 0.0,
    'label_smoothing': 0.1,
    **{f'mix.{k}': v for k, v in _MIX.items()},
}


def _train_steps(tmp_path, data_dir, name, steps=5, single_device=False, **overrides):
  """The losses and parameters of `steps` steps of the loop's jitted train step, on one fixed batch."""
  config = helpers.load_config('demo', {**_TRAIN, 'data_dir': data_dir, **overrides})
  setup = train_setup.prepare(config, str(tmp_path / name))
  if single_device:
    mesh = sharding.make_mesh((('data', 1),), devices=jax.devices()[:1])
    setup = dataclasses.replace(setup, mesh=mesh)
  state, shardings, _ = train_state.create_state(setup, checkpoint.make_manager(setup.workdir, 1))
  step_fn = train_step.jit_train_step(setup, shardings)
  images, labels = _batch(size=16, height=8, width=8)
  batch = sharding.global_batch({'image': images, 'label': labels}, setup.mesh)
  losses = []
  for _ in range(steps):
    state, metrics = step_fn(state, batch)
    losses.append(float(metrics['train_loss']))
  return np.asarray(losses), jax.device_get(state.params)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_step_mixes_the_global_batch_alike_on_any_mesh_and_with_accumulation(tmp_path, data_dir):
  mix_key = jax.random.fold_in(jax.random.key(0), 2)  # The step's: config.seed 0.
  cutmix = [
      bool(mixing.draw(jax.random.fold_in(mix_key, s), s, _mix_config(**_MIX), 8, 8).cutmix)
      for s in range(5)
  ]
  assert set(cutmix) == {True, False}  # Both kinds of mixing are compared.

  fsdp = _train_steps(tmp_path, data_dir, 'fsdp', mesh=(('fsdp', 8),))
  # One device and two micro-batches: the same global batch, mixed the same way.
  one = _train_steps(tmp_path, data_dir, 'one', single_device=True, accum_steps=2)
  np.testing.assert_allclose(one[0], fsdp[0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5), one[1], fsdp[1])
  unmixed = _train_steps(
      tmp_path,
      data_dir,
      'unmixed',
      mesh=(('fsdp', 8),),
      **{'mix.mixup_alpha': 0.0, 'mix.cutmix_alpha': 0.0},
  )
  # From step 1 on: the zero-initialised head gives the loss log(10) for any targets at step 0.
  assert np.all(np.abs(unmixed[0][1:] - fsdp[0][1:]) > 1e-3)


@pytest.mark.parametrize(
    'field,value,message',
    [
        ('mixup_alpha', -0.1, r'config\.mix\.mixup_alpha=-0\.1 must be at least 0'),
        ('cutmix_alpha', -1.0, r'config\.mix\.cutmix_alpha=-1\.0 must be at least 0'),
        ('prob', 1.5, r'config\.mix\.prob=1\.5 must be in \[0, 1\]'),
        ('switch_prob', -0.5, r'config\.mix\.switch_prob=-0\.5 must be in \[0, 1\]'),
        ('until_step', 0, r'config\.mix\.until_step=0 must be at least 1'),
    ],
)
def test_bad_mix_fields_are_one_line_errors(tmp_path, data_dir, field, value, message):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, f'mix.{field}': value}
  )
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(config, str(tmp_path / 'workdir'))
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()


def test_mpp_refuses_mixing(tmp_path, data_dir):
  config = helpers.load_config(
      'mpp_demo', {**helpers.TINY, 'data_dir': data_dir, 'mix.mixup_alpha': 0.8}
  )
  with pytest.raises(ValueError, match=r'config\.task=mpp has no labels to mix') as error:
    train_setup.prepare(config, str(tmp_path / 'workdir'))
  assert '\n' not in str(error.value)
