"""Recipes of modern ViT training in the optimizer: per-parameter learning-rate and weight-decay
multipliers, layer-wise learning-rate decay (against timm), frozen parameters, a bfloat16 first moment,
Lion and Adafactor (against optax), on both layouts of the encoder blocks and on an FSDP mesh."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import checkpoint
from vit_jax.train import optim, param_groups
from vit_jax.models import scan_layout, variants, vit
from vit_jax.train import setup as train_setup, state as train_state, step as train_step

# One update is lr * (...) with no schedule or clipping in the way, unless a test says otherwise.
PLAIN = {
    'lr.base': 0.1,
    'lr.warmup_steps': 0,
    'lr.decay': 'constant',
    'grad_clip_norm': 0.0,
    'optim.weight_decay': 0.1,
}


def _config(*overrides: dict):
  """The tiny demo config with these dotted-field overrides, later ones winning."""
  merged = dict(helpers.TINY)
  for each in overrides:
    merged.update(each)
  return helpers.load_config('demo', merged)


def _params(config, seed=0):
  """Random parameters of the config's model, per-block layout (numpy)."""
  model = vit.VisionTransformer(
      num_classes=3, **variants.get_model_config(config.variant, config.model.to_dict())
  )
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))['params'])
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(np.float32), shapes)


def _stack(tree, config):
  return scan_layout.stack_blocks(tree, config.model.num_layers)


def _kernel_mask(params):
  return jax.tree_util.tree_map_with_path(lambda path, _: path[-1].key == 'kernel', params)


def _path(key_path):
  return '/'.join(k.key for k in key_path)


def _flat(tree):
  return {_path(key_path): x for key_path, x in jax.tree_util.tree_leaves_with_path(tree)}


def _params_like(tree, seed):
  """Random arrays shaped like `tree`'s: gradients."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), tree)


def _first_moment(opt_state):
  """The `mu` of the one Adam or Lion state in `opt_state`."""
  [moments] = [
      s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: hasattr(s, 'mu')) if hasattr(s, 'mu')
  ]
  return moments.mu


def _updates(tx, params, steps=3):
  """The updates of `steps` applied updates with random gradients, the final state and parameters."""
  state, all_updates = tx.init(params), []
  for seed in range(steps):
    updates, state = tx.update(_params_like(params, seed + 10), state, params)
    params = optax.apply_updates(params, updates)
    all_updates.append(updates)
  return all_updates, state, params


@pytest.mark.parametrize(
    'name,reference',
    [
        # b2 unset: optax's own default, as each reference below.
        (
            'adamw',
            lambda c, s, mask: optax.adamw(
                s, b1=c.optim.b1, weight_decay=c.optim.weight_decay, mask=mask
            ),
        ),
        (
            'sgd',
            lambda c, s, mask: optax.chain(
                optax.add_decayed_weights(c.optim.weight_decay, mask),
                optax.sgd(s, momentum=c.optim.momentum),
            ),
        ),
    ],
)
def test_without_the_new_fields_updates_are_optax_bit_for_bit(name, reference):
  # TINY warms up over 2 steps; demo clips at 1.0; sgd with weight decay to exercise the L2 term.
  config = _config({'optim.name': name, 'optim.weight_decay': 1e-3 if name == 'sgd' else 0.05})
  params = _params(config)
  ours, state, _ = _updates(
      optim.make_optimizer(config, 10, helpers.model_config(config))[0], params
  )
  schedule = optim.make_schedule(config.lr, 10)
  expected_tx = optax.chain(
      optax.clip_by_global_norm(config.grad_clip_norm),
      reference(config, schedule, _kernel_mask(params)),
  )
  expected, expected_state, _ = _updates(expected_tx, params)
  jax.tree.map(np.testing.assert_array_equal, ours, expected)
  assert jax.tree.structure(state) == jax.tree.structure(
      expected_state
  )  # Checkpoints still restore.


# Groups that overlap (the first match wins) and differ between blocks (stacked, one value per layer).
MULTS = {
    'optim.lr_mults': (
        ('^head/', 10.0),
        ('encoderblock_1/.*Dense_0/kernel', 0.25),
        ('Dense_0/kernel$', 0.5),
        ('Dense_0', 7.0),
    ),
    # Any parameter: a bias and the position embeddings too, as big_vision's wd_mults.
    'optim.wd_mults': (
        ('encoderblock_0/MlpBlock_3/Dense_1/', 3.0),
        ('^head', 0.0),
        ('posembed_input', 2.0),
    ),
}


def _lr_mult(path):  # MULTS, written out.
  if path.startswith('head/'):
    return 10.0
  if path.endswith('Dense_0/kernel'):
    return 0.25 if 'encoderblock_1/' in path else 0.5
  return 7.0 if 'Dense_0' in path else 1.0


def _wd_mult(path):
  if 'encoderblock_0/MlpBlock_3/Dense_1/' in path:
    return 3.0
  if path.startswith('head/'):
    return 0.0
  if 'posembed_input' in path:
    return 2.0
  return 1.0 if path.endswith('kernel') else 0.0


@pytest.mark.parametrize('scan', [False, True])
def test_adamw_multipliers_follow_the_formula(scan):
  config = _config(PLAIN, MULTS, {'model.scan': scan})
  params = _params(config)
  grads = _params_like(params, 1)
  lr, wd = config.lr.base, config.optim.weight_decay

  def expected(key_path, g, p):  # Adam's first step is g / (|g| + eps) after bias correction.
    path = _path(key_path)
    return -lr * _lr_mult(path) * (g / (np.abs(g) + 1e-8) + wd * _wd_mult(path) * p)

  want = jax.tree_util.tree_map_with_path(expected, grads, params)
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  state = tx.init(params)
  if scan:  # Initialised per block, trained stacked, as train/state.py does.
    params, grads, want, state = (_stack(tree, config) for tree in (params, grads, want, state))
  updates, _ = jax.jit(tx.update)(grads, state, params)
  # optax's bias correction 1 - b2 in float32 is 0.001 to about 5e-5, of Adam's term (<= lr * mult).
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-4, atol=1e-5), updates, want)


def test_sgd_weight_decay_multipliers_are_l2_terms():
  config = _config(PLAIN, MULTS, {'optim.name': 'sgd', 'optim.momentum': 0.0})
  params = _params(config)
  grads = _params_like(params, 1)
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  updates, _ = tx.update(grads, tx.init(params), params)

  def expected(key_path, g, p):  # Plain SGD: the L2 term joins the gradient.
    path = _path(key_path)
    return -0.1 * _lr_mult(path) * (g + 0.1 * _wd_mult(path) * p)

  want = jax.tree_util.tree_map_with_path(expected, grads, params)
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6), updates, want)


def test_frozen_parameters_stay_and_keep_no_state():
  frozen = ('^embedding/', 'encoderblock_0/', '^cls$')
  config = _config(PLAIN, {'optim.frozen': frozen, 'grad_clip_norm': 0.5})
  params = _params(config)
  is_frozen = lambda path: any(re.search(regex, path) for regex in frozen)
  trained = {path: x for path, x in _flat(params).items() if not is_frozen(path)}
  assert len(trained) < len(jax.tree.leaves(params))

  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  updates, state, final = _updates(tx, params)
  for path, after in _flat(final).items():
    assert np.array_equal(_flat(params)[path], after) == is_frozen(path), path
  # The others train as if they were the whole model: clipping and Adam's state ignore frozen ones.
  reference = optax.chain(
      optax.clip_by_global_norm(0.5),
      optax.adamw(
          optax.constant_schedule(0.1),
          weight_decay=0.1,
          mask={name: name.endswith('kernel') for name in trained},
      ),
  )
  ref_params, ref_state = trained, reference.init(trained)
  for seed, ours in enumerate(updates):
    grads = {
        path: g for path, g in _flat(_params_like(params, seed + 10)).items() if path in trained
    }
    ref_updates, ref_state = reference.update(grads, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, ref_updates)
    for path, u in ref_updates.items():
      np.testing.assert_allclose(_flat(ours)[path], u, rtol=1e-5, atol=1e-8)
  assert sum(x.size for x in jax.tree.leaves(state)) == sum(
      x.size for x in jax.tree.leaves(ref_state)
  )


def test_scanned_models_freeze_whole_stacks_only():
  config = _config(PLAIN, {'model.scan': True, 'optim.frozen': ('LayerNorm_0',)})
  params = _params(config)
  shapes = jax.eval_shape(lambda: params)
  param_groups.check_param_groups(config.optim, helpers.model_config(config), shapes)
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  state = _stack(tx.init(params), config)  # Frozen in every block: the state stacks.
  stacked = _stack(params, config)
  updates, _ = jax.jit(tx.update)(_params_like(stacked, 1), state, stacked)
  assert not np.any(updates['Transformer']['encoderblock']['LayerNorm_0']['scale'])
  assert np.all(updates['Transformer']['encoderblock']['LayerNorm_2']['scale'])

  config.optim.frozen = ('encoderblock_0/LayerNorm_0',)
  with pytest.raises(
      ValueError,
      match=r'^config.optim.frozen freezes some blocks of '
      r'Transformer/encoderblock/LayerNorm_0/bias but not all',
  ):
    param_groups.check_param_groups(config.optim, helpers.model_config(config), shapes)
  config.optim.frozen, config.optim.trained = (), ('^head', 'encoderblock_0/')
  with pytest.raises(ValueError, match=r'^config.optim.trained freezes some blocks of '):
    param_groups.check_param_groups(config.optim, helpers.model_config(config), shapes)


@pytest.mark.parametrize(
    'name,reference',
    [
        (
            'lion',
            lambda c, s, mask: optax.lion(
                s, b1=c.optim.b1, weight_decay=c.optim.weight_decay, mask=mask
            ),
        ),
        ('adafactor', lambda c, s, mask: optax.adafactor(s)),
    ],
)
def test_lion_and_adafactor_are_optaxs(name, reference):
  config = _config(
      PLAIN, {'optim.name': name, 'optim.weight_decay': 0.1 if name == 'lion' else 0.0}
  )
  params = _params(config)
  ours, _, _ = _updates(optim.make_optimizer(config, 10, helpers.model_config(config))[0], params)
  expected, _, _ = _updates(
      reference(config, optim.make_schedule(config.lr, 10), _kernel_mask(params)), params
  )
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6), ours, expected)


def test_adafactor_weight_decay_is_decoupled_and_times_the_learning_rate():
  config = _config(PLAIN, {'optim.name': 'adafactor', 'optim.weight_decay': 0.3})
  params = _params(config)
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  updates, _ = tx.update(jax.tree.map(np.zeros_like, params), tx.init(params), params)
  want = jax.tree.map(lambda p, kernel: -0.1 * 0.3 * p * kernel, params, _kernel_mask(params))
  jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-6), updates, want)


def _big_vision_adafactor(params, grads, lr, weight_decay, momentum, cap):
  """The updates of big_vision's Adafactor (Shazeer & Stern 2018's factored second moment, Alg. 4,
  with decay min(cap, 1 - t^-0.8); no clipping or parameter scale; an EMA of the result as momentum)
  on a list of gradient trees, plus decoupled weight decay of the kernels, times -lr, in NumPy."""
  eps, v, m, all_updates = 1e-30, {}, {}, []
  for t, grad in enumerate(grads, start=1):
    decay = min(cap, 1.0 - t**-0.8)
    updates = {}
    for path, g in _flat(grad).items():
      g = np.asarray(g, np.float64)
      squared = g * g + eps
      dims = np.argsort(g.shape, kind='stable')
      if g.ndim >= 2 and g.shape[dims[-2]] >= 32:  # Factored over its two largest dimensions.
        rows, cols = int(dims[-2]), int(dims[-1])
        row, col = v.get(path, (0.0, 0.0))
        row = decay * row + (1 - decay) * squared.mean(axis=cols, keepdims=True)
        col = decay * col + (1 - decay) * squared.mean(axis=rows, keepdims=True)
        v[path] = row, col
        u = g / np.sqrt(row / row.mean(axis=rows, keepdims=True)) / np.sqrt(col)
      else:
        v[path] = decay * v.get(path, 0.0) + (1 - decay) * squared
        u = g / np.sqrt(v[path])
      m[path] = momentum * m.get(path, 0.0) + (1 - momentum) * u
      p = np.asarray(_flat(params)[path], np.float64)
      step = m[path] + (weight_decay * p if path.endswith('kernel') else 0.0)
      updates[path] = -lr * step
    all_updates.append(updates)
    params = jax.tree_util.tree_map_with_path(
        lambda key_path, x, u=updates: x + u[_path(key_path)].astype(np.float32), params
    )
  return all_updates


def test_big_vision_adafactor_is_the_factored_rule_with_momentum():
  """Its MLP kernels (32 x 64) are factored, the rest (qkv's 32 x 2 x 16, biases, the head) not."""
  config = _config(
      PLAIN, {'optim.name': 'big_vision_adafactor', 'optim.momentum': 0.8, 'optim.b2': 0.5}
  )
  params = _params(config)
  ours, _, _ = _updates(optim.make_optimizer(config, 10, helpers.model_config(config))[0], params)
  grads = [_params_like(params, seed + 10) for seed in range(3)]
  # b2 0.5 caps the decay from the second step on (1 - 2^-0.8 = 0.43, 1 - 3^-0.8 = 0.58).
  expected = _big_vision_adafactor(params, grads, lr=0.1, weight_decay=0.1, momentum=0.8, cap=0.5)
  assert any(len(x.shape) == 2 and min(x.shape) >= 32 for x in jax.tree.leaves(params))
  for step, want in zip(ours, expected):
    for path, got in _flat(step).items():
      np.testing.assert_allclose(got, want[path], rtol=2e-5, atol=1e-7, err_msg=path)


def test_big_vision_adafactor_keeps_its_first_moment_in_mu_dtype():
  updates = {}
  for mu_dtype in (None, 'bfloat16'):
    config = _config(PLAIN, {'optim.name': 'big_vision_adafactor', 'optim.mu_dtype': mu_dtype})
    params = _params(config)
    tx = optim.make_optimizer(config, 10, helpers.model_config(config))[0]
    updates[mu_dtype], state, _ = _updates(tx, params)
    [ema] = [s for s in jax.tree.leaves(state, is_leaf=_is_ema) if _is_ema(s)]
    assert {x.dtype for x in jax.tree.leaves(ema.ema)} == {jnp.dtype(mu_dtype or jnp.float32)}
  jax.tree.map(
      functools.partial(np.testing.assert_allclose, rtol=2e-2, atol=1e-3),
      updates['bfloat16'],
      updates[None],
  )


def _is_ema(node):
  return isinstance(node, optax.EmaState)


@pytest.mark.parametrize('name,reference', [('adamw', optax.adamw), ('lion', optax.lion)])
def test_bfloat16_first_moment(name, reference):
  config = _config(PLAIN, {'optim.name': name, 'optim.mu_dtype': 'bfloat16'})
  params = _params(config)
  ours, state, _ = _updates(
      optim.make_optimizer(config, 10, helpers.model_config(config))[0], params
  )
  assert {x.dtype for x in jax.tree.leaves(_first_moment(state))} == {jnp.dtype(jnp.bfloat16)}
  expected, _, _ = _updates(
      reference(
          0.1,
          b1=config.optim.b1,
          weight_decay=0.1,
          mu_dtype=jnp.bfloat16,
          mask=_kernel_mask(params),
      ),
      params,
  )
  jax.tree.map(np.testing.assert_array_equal, ours, expected)


@pytest.mark.parametrize(
    'field,value',
    [
        ('lr_mults', (('haed', 10.0),)),
        ('wd_mults', (('^head', 0.0), ('Dense_9', 2.0))),
        ('frozen', ('embeding',)),
    ],
)
def test_a_regex_that_matches_nothing_is_a_one_line_error(field, value):
  config = _config({f'optim.{field}': value})
  shapes = jax.eval_shape(lambda: _params(config))
  regex = value[-1] if field == 'frozen' else value[-1][0]
  with pytest.raises(
      ValueError,
      match=f"^config.optim.{field} regex '{regex}' matches no parameter: "
      r'fix it \(parameter paths look like Transformer/',
  ) as e:
    param_groups.check_param_groups(config.optim, helpers.model_config(config), shapes)
  assert '\n' not in str(e.value)


# (dotted field, invalid value, message): check_optim and make_optimizer raise each before any update.
BAD_FIELDS = [
    ('optim.layer_decay', 0.0, r'^config.optim.layer_decay=0.0 must be in \(0, 1\], e.g. 0.75'),
    ('optim.layer_decay', 1.5, r'^config.optim.layer_decay=1.5 must be in \(0, 1\]'),
    ('optim.layer_decay', -0.5, r'^config.optim.layer_decay=-0.5 must be in \(0, 1\]'),
    (
        'optim.mu_dtype',
        'int8',
        r"^config.optim.mu_dtype='int8' must name a float dtype, e.g. 'bfloat16'",
    ),
    ('optim.mu_dtype', 'bfloat61', r"^config.optim.mu_dtype='bfloat61' must name a float dtype"),
    (
        'optim.lr_mults',
        (('head', 0.0),),
        r"^config.optim.lr_mults\[0\]=\('head', 0.0\): the multiplier must be > 0 \(config.optim.frozen",
    ),
    (
        'optim.lr_mults',
        ('head',),
        r"^config.optim.lr_mults\[0\]='head' must be a \(regex, multiplier\) pair",
    ),
    (
        'optim.wd_mults',
        (('head', -1.0),),
        r"^config.optim.wd_mults\[0\]=\('head', -1.0\): the multiplier must be >= 0",
    ),
    ('optim.wd_mults', (('(', 1.0),), r"^config.optim.wd_mults\[0\]='\(' is not a valid regex"),
    ('optim.frozen', (3,), r'^config.optim.frozen\[0\]=3 must be a regex string'),
]


@pytest.mark.parametrize('field,value,match', BAD_FIELDS)
def test_bad_fields_are_one_line_errors(field, value, match):
  config = _config({field: value})
  for check in (
      lambda: optim.check_optim(config, helpers.model_config(config)),
      lambda: optim.make_optimizer(config, 10, helpers.model_config(config)),
  ):
    with pytest.raises(ValueError, match=match) as e:
      check()
    assert '\n' not in str(e.value)


@pytest.mark.parametrize(
    'overrides,match',
    [
        (
            {'optim.name': 'sgd', 'optim.mu_dtype': 'bfloat16'},
            r"^config.optim.mu_dtype='bfloat16' is the first moment of adamw, lion, "
            'big_vision_adafactor, which sgd does not keep',
        ),
        (
            {'optim.name': 'adafactor', 'optim.wd_mults': (('head', 0.0),)},
            r'^config.optim.wd_mults are not supported by adafactor',
        ),
        *(
            (
                {'optim.name': name, 'model.scan': True},
                rf'^config.optim.name={name} factors and scales each parameter array, which a '
                'scanned model',
            )
            for name in ('adafactor', 'big_vision_adafactor')
        ),
        (
            {
                'optim.name': 'big_vision_adafactor',
                'optim.momentum': 0.0,
                'optim.mu_dtype': 'bfloat16',
            },
            r"^config.optim.mu_dtype='bfloat16' is the first moment, which optim.momentum=0 turns "
            'off: unset it',
        ),
    ],
)
def test_combinations_that_do_not_work_are_one_line_errors(overrides, match):
  with pytest.raises(ValueError, match=match):
    config = _config(overrides)
    optim.check_optim(config, helpers.model_config(config))


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_state_on_an_fsdp_mesh_trains_and_checkpoints(tmp_path, data_dir):
  config = _config(
      {
          'data_dir': data_dir,
          'mesh': (('fsdp', 8),),
          'model.scan': True,
          'optim.frozen': ('LayerNorm_2', '^cls$'),
          'optim.layer_decay': 0.75,
          'optim.lr_mults': (('^head', 10.0),),
          'optim.mu_dtype': 'bfloat16',
          'lr.warmup_steps': 0,
      }
  )
  setup = train_setup.prepare(config, str(tmp_path))
  init = lambda: setup.model.clone(scan=False).init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)))
  param_groups.check_param_groups(
      config.optim, helpers.model_config(config), jax.eval_shape(init)['params']
  )
  manager = checkpoint.make_manager(setup.workdir, keep=1)
  state, shardings, to_checkpoint = train_state.create_state(setup, manager)
  mu = _first_moment(state.opt_state)['Transformer']['encoderblock']
  kernel = mu['MlpBlock_3']['Dense_0']['kernel']  # (layers, 32, 64): the layer axis stays whole.
  assert kernel.sharding.spec == P(None, None, 'fsdp') and kernel.dtype == jnp.bfloat16
  assert not jax.tree.leaves(mu['LayerNorm_2'])  # Frozen: no state.

  step = train_step.jit_train_step(setup, shardings)
  rng = np.random.default_rng(0)
  batch = sharding.global_batch(
      {
          'image': rng.uniform(-1, 1, (16, 8, 8, 3)).astype(np.float32),
          'label': rng.integers(0, 10, 16).astype(np.int32),
      },
      setup.mesh,
  )
  before = _flat(jax.device_get(state.params))
  for _ in range(2):  # The zero-initialised head passes gradients on from the second step.
    state, _ = step(state, batch)
  after = _flat(jax.device_get(state.params))
  for path in ('Transformer/encoderblock/LayerNorm_2/scale', 'cls'):  # Frozen.
    np.testing.assert_array_equal(after[path], before[path])
  path = 'Transformer/encoderblock/LayerNorm_0/scale'
  assert not np.array_equal(after[path], before[path])

  checkpoint.save(manager, 1, to_checkpoint(state))
  manager.wait_until_finished()
  restored, _, _ = train_state.create_state(setup, manager)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored), jax.device_get(state))
