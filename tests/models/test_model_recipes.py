"""The model options of the modern ViT recipes: stochastic depth, GAP with fc_norm, the MAP head, fixed
2-D sin-cos position embeddings; and that none changes the default model.

The references are independent of vit_jax: timm (PyTorch) for the models, reading our `.npz` with its
own reader of the original and big_vision layouts, and a NumPy transcription of big_vision's formula.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import adapting
from vit_jax.models import VisionTransformer, block, mpp, pooling, posemb, variants
from vit_jax.checkpoints.adapting import param_shapes


def _model(num_classes=None, **overrides) -> VisionTransformer:
  return VisionTransformer(
      num_classes=num_classes, **variants.get_model_config('ViT-testing_4', overrides)
  )


def _flat(tree):
  return {'/'.join(k): tuple(v.shape) for k, v in traverse_util.flatten_dict(tree).items()}


def _images(n, size, seed=0):
  return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


# The default model is unchanged.


def test_default_trees_are_the_original_ones():
  model = VisionTransformer(num_classes=1000, **variants.get_model_config('ViT-B_16'))
  shapes = param_shapes(model, 224)
  assert sorted(shapes) == ['Transformer', 'cls', 'embedding', 'head']
  assert sorted(shapes['Transformer']) == sorted(
      ['encoder_norm', 'posembed_input'] + [f'encoderblock_{i}' for i in range(12)]
  )
  assert shapes['Transformer']['posembed_input']['pos_embedding'].shape == (1, 197, 768)
  gap = param_shapes(
      VisionTransformer(
          num_classes=10, **variants.get_model_config('ViT-B_16', {'classifier': 'gap'})
      ),
      224,
  )
  assert (
      sorted(gap) == ['Transformer', 'embedding', 'head'] and 'encoder_norm' in gap['Transformer']
  )
  # Stochastic depth has no parameters.
  assert _flat(param_shapes(_model(drop_path_rate=0.3), 8)) == _flat(param_shapes(_model(), 8))


# Stochastic depth.


def test_drop_path_drops_or_scales_each_sample_and_keeps_the_expectation():
  rate, n = 0.3, 20_000
  x = np.random.RandomState(0).randn(1, 4, 3).astype(np.float32)
  f = np.tanh(2 * x) + 0.5  # A residual branch f(x).
  branch = np.asarray(block.drop_path(jnp.asarray(np.tile(f, (n, 1, 1))), rate, jax.random.key(1)))
  kept = np.all(np.isclose(branch, f / (1 - rate), atol=1e-6), axis=(1, 2))
  dropped = np.all(branch == 0, axis=(1, 2))
  assert np.all(kept ^ dropped)  # Each sample whole: all dropped or all scaled by 1 / (1 - rate).
  assert abs(kept.mean() - (1 - rate)) < 0.02
  residual = x + branch
  np.testing.assert_allclose(residual.mean(axis=0), (x + f)[0], atol=0.03)


def test_drop_path_is_identity_at_eval_and_needs_no_key_without_it():
  params = helpers.random_params(_model(), 8)
  images = _images(4, 8)
  plain = _model().apply({'params': params}, images)
  np.testing.assert_array_equal(_model(drop_path_rate=0.5).apply({'params': params}, images), plain)
  # Train mode without a 'dropout' rng: no block draws a key at rate 0.
  np.testing.assert_array_equal(_model().apply({'params': params}, images, train=True), plain)
  np.testing.assert_allclose(
      _model(scan=True).apply({'params': params}, images, train=True), plain, atol=1e-6
  )


# Fixed 2-D sin-cos position embeddings.


def _numpy_sincos_2d(h, w, width, temperature=10_000.0):
  """big_vision's posemb_sincos_2d from its formula: a quarter of the channels each is sin(x w_k),
  cos(x w_k), sin(y w_k), cos(y w_k), x the column and y the row of token m = y * w + x,
  w_k = 1 / temperature^(k / (width / 4 - 1))."""
  quarter = width // 4
  omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
  rows, cols = np.divmod(np.arange(h * w), w)
  x, y = np.outer(cols, omega), np.outer(rows, omega)
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None]


@pytest.mark.parametrize('h,w,width', [(4, 4, 32), (2, 3, 16), (7, 5, 64)])
def test_sincos2d_is_big_visions_formula(h, w, width):
  ours = posemb.posemb_sincos_2d(h, w, width)
  assert ours.shape == (1, h * w, width) and ours.dtype == jnp.float32
  np.testing.assert_allclose(ours, _numpy_sincos_2d(h, w, width), atol=1e-5)


def _maes_sincos_2d(h, w, width):
  """facebookresearch/mae's util/pos_embed.py, its steps as written there (for an h x w grid): a
  meshgrid of (columns, rows), each half of the channels the 1-D sin-cos of one of them, at
  frequencies 1 / 10000^(k / (width / 4))."""

  def one_d(dim, pos):
    omega = 1.0 / 10000 ** (np.arange(dim // 2, dtype=np.float64) / (dim / 2.0))
    out = np.einsum('m,d->md', pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)

  grid = np.stack(np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32)))
  return np.concatenate([one_d(width // 2, grid[0]), one_d(width // 2, grid[1])], axis=1)[None]


@pytest.mark.parametrize('h,w,width', [(4, 4, 32), (2, 3, 16), (7, 5, 64)])
def test_sincos2d_mae_is_maes_own_code(h, w, width):
  ours = posemb.posemb_sincos_2d(h, w, width, mae=True)
  np.testing.assert_allclose(ours, _maes_sincos_2d(h, w, width), atol=1e-5)
  assert not np.allclose(posemb.posemb_sincos_2d(h, w, width), ours, atol=1e-3)
  model = posemb.POSEMBS['sincos2d_mae']()
  tokens = np.zeros((1, 1 + h * w, width), np.float32)  # A class token's embedding is zero.
  np.testing.assert_allclose(
      model.apply({}, tokens, (h, w)), np.pad(ours, ((0, 0), (1, 0), (0, 0))), atol=0
  )


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_sincos2d_model_is_the_learned_one_with_those_embeddings(classifier):
  """On a 2x3 grid (8x12 images): rows first, and a zero embedding for the class token."""
  images = np.random.RandomState(4).uniform(-1, 1, (3, 8, 12, 3)).astype(np.float32)
  learned = _model(classifier=classifier)
  rng = np.random.RandomState(5)
  params = jax.tree.map(
      lambda x: 0.3 * rng.randn(*x.shape).astype(np.float32),
      jax.eval_shape(learned.init, jax.random.key(0), images)['params'],
  )
  prefix = np.zeros((1, 1 if classifier == 'token' else 0, 32), np.float32)
  params['Transformer']['posembed_input']['pos_embedding'] = np.concatenate(
      [prefix, _numpy_sincos_2d(2, 3, 32).astype(np.float32)], axis=1
  )
  fixed = _model(classifier=classifier, posemb='sincos2d')
  fixed_params = {
      **params,
      'Transformer': {k: v for k, v in params['Transformer'].items() if k != 'posembed_input'},
  }
  assert _flat(fixed.init(jax.random.key(0), images)['params']) == _flat(fixed_params)
  np.testing.assert_allclose(
      fixed.apply({'params': fixed_params}, images),
      learned.apply({'params': params}, images),
      atol=1e-5,
  )


def test_sincos2d_models_load_at_any_resolution_and_refuse_learned_checkpoints():
  fixed = _model(num_classes=3, posemb='sincos2d')
  loaded = helpers.random_params(fixed, 8)
  params, notes = adapting.adapt_params(
      loaded, param_shapes(fixed, 16), keep_head=True, keep_pre_logits=False
  )
  assert notes == []
  jax.tree.map(np.testing.assert_array_equal, params, loaded)
  assert fixed.apply({'params': params}, _images(2, 16)).shape == (2, 3)
  learned = _model(num_classes=3)
  with pytest.raises(
      ValueError,
      match=r'^Transformer/posembed_input/pos_embedding: checkpoint '
      r'\(1, 5, 32\) vs model none: the checkpoint has learned position embeddings; '
      r'set --config.model.posemb=learn to match it$',
  ):
    adapting.adapt_params(
        helpers.random_params(learned, 8),
        param_shapes(fixed, 8),
        keep_head=True,
        keep_pre_logits=False,
    )
  with pytest.raises(
      ValueError,
      match=r'^Transformer/posembed_input/pos_embedding: checkpoint none vs '
      r'model \(1, 5, 32\): the checkpoint has no learned .*posemb=sincos2d',
  ):
    adapting.adapt_params(loaded, param_shapes(learned, 8), keep_head=True, keep_pre_logits=False)


# GAP with fc_norm, and the MAP head.


def test_fc_norm_and_map_trees():
  gap = _flat(param_shapes(_model(num_classes=7, classifier='gap', fc_norm=True), 8))
  assert gap['fc_norm/scale'] == (32,) and gap['fc_norm/bias'] == (32,)
  assert not any(k.startswith(('Transformer/encoder_norm', 'cls')) for k in gap)
  head = _flat(param_shapes(_model(num_classes=7, classifier='map'), 8))
  map_head = {k: v for k, v in head.items() if k.startswith('MAPHead_0/')}
  attention = 'MAPHead_0/MultiHeadDotProductAttention_0'
  assert map_head == {
      'MAPHead_0/probe': (1, 1, 32),
      **{f'{attention}/{n}/kernel': (32, 2, 16) for n in ('query', 'key', 'value')},
      **{f'{attention}/{n}/bias': (2, 16) for n in ('query', 'key', 'value')},
      f'{attention}/out/kernel': (2, 16, 32),
      f'{attention}/out/bias': (32,),
      'MAPHead_0/LayerNorm_0/scale': (32,),
      'MAPHead_0/LayerNorm_0/bias': (32,),
      'MAPHead_0/MlpBlock_0/Dense_0/kernel': (32, 64),
      'MAPHead_0/MlpBlock_0/Dense_0/bias': (64,),
      'MAPHead_0/MlpBlock_0/Dense_1/kernel': (64, 32),
      'MAPHead_0/MlpBlock_0/Dense_1/bias': (32,),
  }
  assert 'Transformer/encoder_norm/scale' in head and 'cls' not in head
  assert head['head/kernel'] == (32, 7)


@pytest.mark.devices(8)
def test_map_head_is_split_over_the_tensor_axis_like_the_blocks():
  mesh = sharding.make_mesh((('fsdp', 4), ('tensor', 2)))
  shapes = _flat(param_shapes(_model(classifier='map'), 8))
  attention = 'MAPHead_0/MultiHeadDotProductAttention_0'
  expected = {
      f'{attention}/query/kernel': P('fsdp', 'tensor', None),
      f'{attention}/value/bias': P('tensor', 'fsdp'),
      f'{attention}/out/kernel': P('tensor', None, 'fsdp'),
      'MAPHead_0/MlpBlock_0/Dense_0/kernel': P('fsdp', 'tensor'),
      'MAPHead_0/MlpBlock_0/Dense_1/kernel': P('tensor', 'fsdp'),
  }
  for path, spec in expected.items():
    assert sharding.partition_spec(path, shapes[path], mesh) == spec, path


def test_mpp_keeps_the_classifier_tree_with_fc_norm_and_sincos():
  overrides = {'classifier': 'gap', 'fc_norm': True, 'posemb': 'sincos2d'}
  config = mpp.backbone_fields(variants.get_model_config('ViT-testing_4', overrides))
  predictor = mpp.MaskedPatchPredictor(**config)
  images = _images(2, 8)
  variables = predictor.init({'params': jax.random.key(0), 'mpp': jax.random.key(1)}, images)
  tree = _flat(variables['params'])
  assert set(tree) - set(_flat(param_shapes(_model(**overrides), 8))) == {
      'mask_token',
      'mpp_head/kernel',
      'mpp_head/bias',
  }
  logits, corrupted = predictor.apply(variables, images, rngs={'mpp': jax.random.key(2)})
  assert logits.shape == (2, 4, 512) and corrupted.shape == (2, 4)


# Config checks.


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'classifier': 'mean'},
            r"^Unknown model.classifier 'mean': use one of token, gap, map, token_gap$",
        ),
        (
            {'posemb': 'sincos'},
            r"^Unknown model.posemb 'sincos': use one of learn, sincos2d, sincos2d_mae, none, learn2d, relative$",
        ),
        ({'drop_path_rate': 1.0}, r'^model.drop_path_rate=1.0 must be in \[0, 1\)'),
        ({'drop_path_rate': -0.1}, r'^model.drop_path_rate=-0.1 must be in \[0, 1\)'),
        (
            {'fc_norm': True},
            r"^model.fc_norm=True changes nothing with model.classifier='token'.*"
            r'classifier=gap',
        ),
        (
            {'posemb': 'sincos2d', 'hidden_size': 34},
            r"^model.hidden_size=34 must be a multiple of 4 .*posemb='sincos2d'",
        ),
    ],
)
def test_model_config_errors_are_one_line(overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config('ViT-testing_4', overrides)
  assert '\n' not in str(error.value)


def test_model_config_presets_of_the_new_fields():
  config = variants.get_model_config('ViT-B_16')
  assert (config['classifier'], config['fc_norm'], config['posemb'], config['drop_path_rate']) == (
      'token',
      False,
      'learn',
      0.0,
  )
  assert list(pooling.CLASSIFIERS) == ['token', 'gap', 'map', 'token_gap']
  assert list(posemb.POSEMBS) == [
      'learn',
      'sincos2d',
      'sincos2d_mae',
      'none',
      'learn2d',
      'relative',
  ]
  assert config['posemb_where'] == 'input' and list(posemb.POSEMB_WHERE) == [
      'input',
      'every_layer',
      'shared_every_layer',
  ]
