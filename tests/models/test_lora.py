"""Low-rank adapters (vit_jax/models/lora.py): the update x A B * alpha / rank of the layers they
target, a start equal to the adapted model, folding into the kernels, and their config errors. The
comparison with Hugging Face peft is test_lora_vs_torch.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.models import lora, scan_layout, variants

ALL = ('query', 'key', 'value', 'out', 'mlp_in', 'mlp_out')
TINY = dict(num_layers=2, hidden_size=32, num_heads=2, mlp_dim=48)


def _model(**fields):
  return variants.make_model('ViT-testing_4', {**TINY, **fields}, num_classes=5, dtype=jnp.float32)


def _images(n=3):
  return jax.random.normal(jax.random.key(1), (n, 8, 8, 3))


def _randomized(params, scale=0.3):
  """Every adapter's b and the head random: zeros would hide a wrong product."""
  flat = traverse_util.flatten_dict(params, sep='/')
  rng = np.random.default_rng(0)
  for path in flat:
    if path.endswith(f'{lora.SUFFIX}/b') or path.startswith('head/'):
      flat[path] = (scale * rng.normal(size=flat[path].shape)).astype(np.float32)
  return traverse_util.unflatten_dict(flat, sep='/')


@pytest.mark.parametrize('targets', [('query', 'value'), ALL])
def test_adapters_sit_beside_the_layers_they_adapt_and_start_as_the_plain_model(targets):
  adapted = _model(lora_rank=4, lora_targets=targets)
  params = adapted.init(jax.random.key(0), _images(), train=False)['params']
  flat = traverse_util.flatten_dict(params, sep='/')
  adapters = sorted(p for p in flat if lora.ADAPTER_PATH.search(p))
  layers = {'query', 'value'} if len(targets) == 2 else {'query', 'key', 'value', 'out', 'Dense_0'}
  layers |= {'Dense_1'} if len(targets) > 2 else set()
  assert len(adapters) == 2 * 2 * len(layers)  # a and b, in each of 2 blocks.
  block = 'Transformer/encoderblock_1/MultiHeadDotProductAttention_1'
  assert flat[f'{block}/query_lora/a'].shape == (32, 4)
  assert flat[f'{block}/query_lora/b'].shape == (4, 2, 16)  # As the kernel (32, 2, 16).
  if 'out' in targets:
    assert flat[f'{block}/out_lora/a'].shape == (2, 16, 4)  # As the kernel (2, 16, 32).
  # Without the adapters the tree is the plain model's, whose layout the checkpoints have.
  plain_params = {p: v for p, v in flat.items() if not lora.ADAPTER_PATH.search(p)}
  plain = _model()
  assert jax.tree.map(jnp.shape, traverse_util.unflatten_dict(plain_params, sep='/')) == (
      jax.tree.map(jnp.shape, plain.init(jax.random.key(0), _images(), train=False)['params'])
  )
  # b starts at zeros: the same function as the model it adapts, to the bit.
  params = _randomized({k: v for k, v in params.items()}, scale=0.0)
  flat = traverse_util.flatten_dict(params, sep='/')
  flat['head/kernel'] = np.ones_like(flat['head/kernel'])
  params = traverse_util.unflatten_dict(flat, sep='/')
  plain_params['head/kernel'] = flat['head/kernel']
  np.testing.assert_array_equal(
      adapted.apply({'params': params}, _images(), train=False),
      plain.apply({'params': traverse_util.unflatten_dict(plain_params, sep='/')}, _images()),
  )


def test_the_update_is_the_low_rank_product_scaled_by_alpha_over_rank():
  spec = lora.Spec(rank=3, alpha=6.0, dropout_rate=0.0, targets=('out',))
  # An output projection: contracts (heads, head_dim) of [b, n, heads, head_dim].
  adapter = lora.LowRankAdapter(spec, features=(8,), axis=(-2, -1))
  x = jax.random.normal(jax.random.key(0), (2, 5, 2, 4))
  params = adapter.init(jax.random.key(1), x, deterministic=True)['params']
  b = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
  got = adapter.apply({'params': {**params, 'b': b}}, x, deterministic=True)
  a = np.asarray(params['a']).reshape(8, 3)
  expected = np.asarray(x).reshape(2, 5, 8) @ a @ b * 2.0
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_dropout_drops_the_adapters_input_at_train_time_only():
  adapted = _model(lora_rank=4, lora_dropout=0.5)
  params = _randomized(adapted.init(jax.random.key(0), _images(), train=False)['params'])
  evaluate = lambda: adapted.apply({'params': params}, _images(), train=False)
  np.testing.assert_array_equal(evaluate(), evaluate())
  train = lambda seed: adapted.apply(
      {'params': params}, _images(), train=True, rngs={'dropout': jax.random.key(seed)}
  )
  assert np.abs(train(0) - train(1)).max() > 1e-3
  # The base layers see the whole input: with b zeros, dropout changes nothing.
  zero_b = _randomized(params, scale=0.0)
  head = traverse_util.flatten_dict(params, sep='/')
  flat = traverse_util.flatten_dict(zero_b, sep='/')
  flat['head/kernel'] = head['head/kernel']
  zero_b = traverse_util.unflatten_dict(flat, sep='/')
  np.testing.assert_array_equal(
      adapted.apply({'params': zero_b}, _images(), train=True, rngs={'dropout': jax.random.key(0)}),
      adapted.apply({'params': zero_b}, _images(), train=False),
  )


@pytest.mark.parametrize('gated', [False, True])
@pytest.mark.parametrize('scan', [False, True])
def test_merged_kernels_compute_what_the_adapters_did(gated, scan):
  fields = dict(mlp_gated=gated, mlp_activation='silu' if gated else 'gelu_tanh')
  adapted = _model(lora_rank=4, lora_alpha=10.0, lora_targets=ALL, **fields)
  params = _randomized(adapted.init(jax.random.key(0), _images(), train=False)['params'])
  expected = adapted.apply({'params': params}, _images(), train=False)
  if scan:  # The layout a scanned run trains in: a leading layer axis on kernels and factors.
    params = scan_layout.stack_blocks(params, num_layers=2)
  merged = lora.merge(params, 10.0 / 4)
  assert not lora.has_adapters(merged) and lora.has_adapters(params)
  plain = _model(scan=scan, **fields)
  got = plain.apply({'params': merged}, _images(), train=False)
  assert np.abs(np.asarray(expected)).max() > 1
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  # folded: the plain model's config and the merged parameters, from the adapted model's config.
  model_config = variants.get_model_config(
      'ViT-testing_4', {**TINY, 'lora_rank': 4, 'lora_alpha': 10.0, 'lora_targets': ALL, **fields}
  )
  plain_config, folded = lora.folded(model_config, params)
  assert plain_config == variants.get_model_config('ViT-testing_4', {**TINY, **fields})
  jax.tree.map(np.testing.assert_array_equal, folded, merged)


def test_fresh_adapters_are_drawn_as_the_module_draws_them():
  adapted = _model(lora_rank=8, lora_targets=ALL)
  shapes = jax.eval_shape(lambda: adapted.init(jax.random.key(0), _images(), train=False))
  flat = traverse_util.flatten_dict(shapes['params'], sep='/')
  adapters = {p: s for p, s in flat.items() if lora.ADAPTER_PATH.search(p)}
  drawn = lora.draw(adapters, seed=3)
  assert {p: v.shape for p, v in drawn.items()} == {p: s.shape for p, s in adapters.items()}
  np.testing.assert_array_equal(drawn['Transformer/encoderblock_0/MlpBlock_3/Dense_1_lora/b'], 0)
  module = traverse_util.flatten_dict(
      adapted.init(jax.random.key(0), _images(), train=False)['params'], sep='/'
  )
  for path in ('MultiHeadDotProductAttention_1/out_lora/a', 'MlpBlock_3/Dense_1_lora/a'):
    fan_in = 32 if 'out_lora' in path else 48  # heads x head_dim; the MLP's units.
    bound = fan_in**-0.5
    for value in (
        drawn[f'Transformer/encoderblock_0/{path}'],
        module[f'Transformer/encoderblock_0/{path}'],
    ):
      assert bound * 0.9 < np.abs(value).max() <= bound
  assert lora.draw(adapters, seed=3).keys() == drawn.keys()
  a = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query_lora/a'
  assert not np.array_equal(lora.draw(adapters, seed=4)[a], drawn[a])


@pytest.mark.parametrize(
    'fields, message',
    [
        ({'lora_rank': -1}, r'^model.lora_rank=-1 must be a positive integer'),
        ({'lora_rank': True}, r'^model.lora_rank=True must be a positive integer'),
        ({'lora_rank': 4, 'lora_alpha': 0.0}, r'^model.lora_alpha=0.0 must be a positive number'),
        ({'lora_rank': 4, 'lora_targets': 'query'}, r"^model.lora_targets='query' must be a tuple"),
        ({'lora_rank': 4, 'lora_targets': ()}, r'^model.lora_targets=\(\) must be a tuple'),
        ({'lora_dropout': 0.1}, r'^model.lora_dropout=0.1 shapes low-rank adapters, and'),
        ({'lora_targets': ('out',)}, r"^model.lora_targets=\('out',\) shapes low-rank adapters"),
    ],
)
def test_invalid_fields_are_one_line_errors(fields, message):
  with pytest.raises(ValueError, match=message):
    variants.get_model_config('ViT-testing_4', fields)
