"""Fast paths of the ViT (fused attention, remat, scan, bfloat16): same parameters, same numbers."""

import functools
import re

import flax.linen as nn
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import helpers
from vit_jax import defaults, tasks
from vit_jax.train import optim
from vit_jax.tasks import classification
from vit_jax.train import state as train_state, step as train_step
from vit_jax.models import VisionTransformer, attention, scan_layout, variants

IMAGES = jax.random.normal(jax.random.key(1), (4, 16, 16, 3))
LABELS = jnp.array([0, 1, 2, 3])


def _model(dtype=jnp.float32, **fields) -> VisionTransformer:
  return VisionTransformer(
      num_classes=5, dtype=dtype, **variants.get_model_config('ViT-testing_4', fields)
  )


@functools.cache
def _params():
  """Parameters of the default model, with a non-zero head so that gradients reach every block."""
  params = _model().init(jax.random.key(0), IMAGES)['params']
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  return params


def _logits_and_grads(model: VisionTransformer, params):
  def loss(p):
    logits = model.apply({'params': p}, IMAGES, train=True)
    return classification.compute_loss(logits, LABELS, loss=optax.softmax_cross_entropy), logits

  (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return logits, grads


@functools.cache
def _reference():
  return _logits_and_grads(_model(), _params())


def _shapes(tree):
  return jax.tree.map(lambda x: (x.shape, x.dtype), tree)


def _assert_same_results(model: VisionTransformer, *, rtol: float = 1e-5, atol: float = 1e-5):
  """`model` has the default model's parameter tree and, on its parameters, its logits and gradients."""
  params = _params()
  assert _shapes(model.init(jax.random.key(0), IMAGES)['params']) == _shapes(params)
  logits, grads = _logits_and_grads(model, params)
  ref_logits, ref_grads = _reference()
  np.testing.assert_allclose(logits, ref_logits, rtol=rtol, atol=atol)
  jax.tree.map(
      functools.partial(np.testing.assert_allclose, rtol=rtol, atol=atol), grads, ref_grads
  )


@functools.cache
def _primitives(**fields) -> set[str]:
  """The primitives in the jaxpr of the model's gradient: which transformations it went through."""
  jaxpr = jax.make_jaxpr(lambda p: _logits_and_grads(_model(**fields), p))(_params())
  return set(re.findall(r'= ([a-z_0-9]+)\[', str(jaxpr)))


def test_stack_and_unstack_blocks_round_trip_exactly():
  params = _params()
  stacked = scan_layout.stack_blocks(params, num_layers=2)
  assert sorted(stacked['Transformer']) == ['encoder_norm', 'encoderblock', 'posembed_input']
  kernel = stacked['Transformer']['encoderblock']['MlpBlock_3']['Dense_0']['kernel']
  assert kernel.shape == (2, 32, 64)
  np.testing.assert_array_equal(
      kernel[1], params['Transformer']['encoderblock_1']['MlpBlock_3']['Dense_0']['kernel']
  )
  chex.assert_trees_all_equal(scan_layout.unstack_blocks(stacked), params)
  # A tree already in the target layout passes through untouched (the same arrays: no copies), which is
  # why a scanned model applied to stacked parameters computes nothing to convert them.
  for tree, same in (
      (stacked, scan_layout.stack_blocks(stacked, 2)),
      (params, scan_layout.unstack_blocks(params)),
  ):
    assert all(a is b for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(same)))
  with pytest.raises(ValueError, match='encoderblock_0..encoderblock_2'):
    scan_layout.stack_blocks(params, num_layers=3)


def test_stack_blocks_converts_a_whole_train_state():
  """Parameters, Adam moments and the Polyak average of a train state all change layout together."""
  config = defaults.get_config()
  config.variant, config.image_size = 'ViT-testing_4', 16
  tx, _ = optim.make_optimizer(config, 10, helpers.model_config(config))
  state = train_state.init_state(
      jax.random.key(0), model=_model(), tx=tx, image_size=16, polyak=True
  )
  stacked = scan_layout.stack_blocks(state, num_layers=2)
  mu = stacked.opt_state[1][0].mu  # clip_by_global_norm, then adamw's scale_by_adam.
  assert mu['Transformer']['encoderblock']['LayerNorm_0']['scale'].shape == (2, 32)
  assert 'encoderblock_0' not in stacked.ema_params['Transformer']
  chex.assert_trees_all_equal(scan_layout.unstack_blocks(stacked), state)


def test_scan_keeps_per_block_parameters_and_results():
  _assert_same_results(_model(scan=True))
  assert 'scan' in _primitives(scan=True) and 'scan' not in _primitives()


def test_scan_applies_stacked_parameters_with_the_same_results():
  """The layout training keeps: stacked parameters in, stacked gradients out, no conversion inside."""
  stacked = scan_layout.stack_blocks(_params(), num_layers=2)
  logits, grads = _logits_and_grads(_model(scan=True), stacked)
  ref_logits, ref_grads = _reference()
  np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
  jax.tree.map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
      grads,
      scan_layout.stack_blocks(ref_grads, num_layers=2),
  )


@pytest.mark.parametrize('policy,scan', [('nothing_saveable', False), ('dots_saveable', True)])
def test_remat_recomputes_blocks_with_the_same_results(policy, scan):
  model = _model(remat=policy, scan=scan)
  _assert_same_results(model)
  assert 'remat2' in _primitives(remat=policy, scan=scan) and 'remat2' not in _primitives(scan=scan)


def test_dot_product_attention_computes_the_same_attention(monkeypatch):
  _assert_same_results(_model(attention='dot_product_attention'))
  calls = []
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(
      jax.nn, 'dot_product_attention', lambda *a, **k: calls.append(1) or fused(*a, **k)
  )
  _model(attention='dot_product_attention').apply({'params': _params()}, IMAGES)
  assert len(calls) == 2  # One per block.


@pytest.mark.parametrize(
    'fields',
    [
        {},
        {'posemb_where': 'every_layer'},
        {'posemb_where': 'shared_every_layer'},
        {'scan': True},
        # EVA-02's: the rotary embeddings turn the patches between the prefix and the padding.
        {
            'rope': True,
            'key_bias': False,
            'classifier': 'gap',
            'class_token': True,
            'num_registers': 1,
        },
    ],
)
def test_dot_product_attention_pads_the_tokens_once_where_cudnn_may_run(monkeypatch, fields):
  """Where cuDNN's kernel may run (a GPU in bfloat16; pretended here, so XLA's computes it once cuDNN's
  is refused), the encoder pads its 17 tokens to 24 once for all blocks, each attention masks the
  padding out of the keys, and the encoder cuts it off: the same logits and gradients, position
  embeddings at every layer and scanned blocks included."""
  monkeypatch.setattr(attention, '_cudnn_may_run', lambda dtype: True)
  token_counts = []
  fused = jax.nn.dot_product_attention
  monkeypatch.setattr(
      jax.nn,
      'dot_product_attention',
      lambda query, *a, **k: token_counts.append(query.shape[1]) or fused(query, *a, **k),
  )
  model = _model(attention='dot_product_attention', **fields)
  if fields:
    _assert_same_as_xla(model, fields)
  else:  # The softmax sums 24 keys, 7 of them masked: float32's rounding of logits up to ~60.
    _assert_same_results(model, rtol=1e-4)
  assert set(token_counts) == {24}
  forward = jax.make_jaxpr(lambda p: model.apply({'params': p}, IMAGES))(
      model.init(jax.random.key(0), IMAGES)['params']
  )
  assert len(re.findall(r'\bpad\[', str(forward))) == 1 + ('shared' in str(fields))


def _assert_same_as_xla(model: VisionTransformer, fields: dict) -> None:
  """`model`'s logits and gradients are those of the same model with XLA's attention, unpadded."""
  params = model.init(jax.random.key(0), IMAGES)['params']
  for ours, ref in zip(
      _logits_and_grads(model, params), _logits_and_grads(_model(**fields), params)
  ):
    chex.assert_trees_all_close(ours, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != 'gpu', reason='cuDNN runs on NVIDIA GPUs only')
def test_dot_product_attention_is_cudnn_fused_attention_on_gpu():
  """In bfloat16 on a GPU, at ViT-B/16's 197 tokens, it compiles to cuDNN's fused kernel (the path the
  H100 row of benchmarks/RESULTS.md measures), forward and backward, with XLA's attention's numbers.
  """
  query, key, value = jax.random.normal(jax.random.key(2), (3, 4, 197, 12, 64), jnp.bfloat16)
  loss_fns = [
      lambda q, k, v, fn=fn: jnp.sum(jnp.sin(fn(q, k, v).astype(jnp.float32)))
      for fn in (attention.fused_attention, attention.head_major_attention)
  ]
  fused_grad = jax.jit(jax.value_and_grad(loss_fns[0], argnums=(0, 1, 2)))
  assert (
      attention.cudnn_attention_calls(fused_grad.lower(query, key, value).compile().as_text()) >= 2
  )
  as_float32 = tuple(x.astype(jnp.float32) for x in (query, key, value))
  fused, reference = fused_grad(query, key, value), jax.value_and_grad(loss_fns[1], (0, 1, 2))(
      *as_float32
  )
  chex.assert_trees_all_equal_shapes(fused[1], as_float32)
  for ours, ref in zip(
      jax.tree.leaves(fused), jax.tree.leaves(reference)
  ):  # bfloat16: 8 bits of mantissa.
    assert jnp.linalg.norm(jnp.float32(ours) - ref) < 0.02 * jnp.linalg.norm(ref) + 0.05


def test_attention_over_padded_tokens_is_the_attention_over_the_tokens():
  """What cuDNN's kernel gets on a GPU (197 tokens padded to 200, the padding masked), here through XLA."""
  query, key, value = jax.random.normal(jax.random.key(3), (3, 2, 197, 3, 16))
  loss_fns = [
      lambda q, k, v, fn=fn: jnp.sum(jnp.sin(fn(q, k, v)))
      for fn in (
          functools.partial(attention.padded_attention, implementation='xla'),
          jax.nn.dot_product_attention,
      )
  ]
  with jax.default_matmul_precision('highest'):  # Not TF32 on a GPU.
    padded, plain = (jax.value_and_grad(fn, (0, 1, 2))(query, key, value) for fn in loss_fns)
  chex.assert_trees_all_close(padded, plain, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('deterministic', [True, False])
def test_head_major_attention_equals_flax_attention_with_its_dropout(deterministic):
  """The default attention ('xla') is flax's computation in a layout XLA:CPU runs faster."""
  query, key, value = jax.random.normal(jax.random.key(4), (3, 2, 9, 4, 8))  # [b, tokens, heads, d]
  kwargs = dict(dropout_rng=jax.random.key(5), dropout_rate=0.25, deterministic=deterministic)
  ours = attention.head_major_attention(query, key, value, **kwargs)
  flax_out = nn.dot_product_attention(query, key, value, broadcast_dropout=False, **kwargs)
  assert ours.shape == (2, 9, 4, 8)
  np.testing.assert_allclose(ours, flax_out, rtol=1e-5, atol=1e-6)
  grads = [
      jax.grad(lambda q, fn=fn: jnp.sum(jnp.sin(fn(q, key, value))))(query)
      for fn in (attention.head_major_attention, nn.dot_product_attention)
  ]
  np.testing.assert_allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)


def test_dot_product_attention_refuses_attention_dropout():
  with pytest.raises(ValueError, match='attention_dropout_rate'):
    variants.get_model_config(
        'ViT-testing_4', {'attention': 'dot_product_attention', 'attention_dropout_rate': 0.1}
    )
  model = VisionTransformer(
      num_classes=5,
      **{
          **variants.get_model_config('ViT-testing_4'),
          'attention': 'dot_product_attention',
          'attention_dropout_rate': 0.1,
      },
  )
  model.apply({'params': _params()}, IMAGES)  # Evaluation applies no dropout: allowed.
  with pytest.raises(ValueError, match='no dropout on the attention weights'):
    model.apply({'params': _params()}, IMAGES, train=True, rngs={'dropout': jax.random.key(0)})


def test_unknown_fast_path_names_are_errors():
  with pytest.raises(ValueError, match='dot_product_attention'):
    variants.get_model_config('ViT-testing_4', {'attention': 'flash'})
  with pytest.raises(ValueError, match='nothing_saveable'):
    variants.get_model_config('ViT-testing_4', {'remat': 'everything'})


def test_bfloat16_compute_matches_float32_with_float32_parameters():
  model = _model(dtype=jnp.bfloat16)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(model.init(jax.random.key(0), IMAGES)))
  logits, grads = _logits_and_grads(model, _params())
  ref_logits, ref_grads = _reference()
  assert logits.dtype == jnp.float32 and all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
  np.testing.assert_allclose(logits, ref_logits, rtol=0.05, atol=0.1)
  # bfloat16 keeps 8 bits of mantissa: gradients agree to a few percent of their norm.
  difference = optax.global_norm(jax.tree.map(jnp.subtract, grads, ref_grads))
  assert difference < 0.05 * optax.global_norm(ref_grads)


def test_train_step_with_all_fast_paths_matches_the_default_step():
  """The real train step, the scanned one on the state stacked as training keeps it: the same update."""
  config = defaults.get_config()
  config.variant, config.image_size, config.batch_size = 'ViT-testing_4', 16, 4
  # SGD: the update is linear in the gradients, so it inherits their agreement (Adam's first step is
  # about sign(gradient), which amplifies rounding where a gradient is near zero).
  config.optim.name, config.lr.warmup_steps = 'sgd', 0
  tx, schedule = optim.make_optimizer(config, 10, helpers.model_config(config))
  state = train_state.init_state(
      jax.random.key(0),
      model=classification.make_model(config, helpers.model_config(config), num_classes=5),
      tx=tx,
      image_size=16,
      polyak=False,
  )

  def one_step(state, **fields):
    config.model.update(fields)
    model = classification.make_model(config, helpers.model_config(config), num_classes=5)
    step = functools.partial(
        train_step.train_step,
        loss_fn=tasks.get(config.task).make_loss(config, model),
        tx=tx,
        schedule=schedule,
        dropout_key=jax.random.key(1),
    )
    return jax.jit(step)(state, {'image': IMAGES, 'label': LABELS})

  default_state, default_metrics = one_step(state)
  fast_state, fast_metrics = one_step(
      scan_layout.stack_blocks(state, num_layers=2),
      attention='dot_product_attention',
      remat='nothing_saveable',
      scan=True,
  )
  fast_state = scan_layout.unstack_blocks(fast_state)
  assert _shapes(fast_state.params) == _shapes(default_state.params)
  jax.tree.map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6),
      (fast_state.params, fast_metrics),
      (default_state.params, default_metrics),
  )
