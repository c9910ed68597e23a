"""The position-embedding ablation (paper Appendix D.4, Table 8): model.posemb none / learn / learn2d /
relative x model.posemb_where input / every_layer / shared_every_layer. What each kind adds, where it
enters, resizing to a new grid, sharded training, resume, the errors, and the sweep's table."""

import functools
import importlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

import helpers
from vit_jax import sharding
from vit_jax.tools import pictures, report
from vit_jax.tools.runs import find_runs, load_run
from vit_jax.checkpoints import adapting, posemb_resizing
from vit_jax.models import VisionTransformer, attention, encoder, posemb, variants
from vit_jax.train import loop, setup as train_setup
import sweep

table8 = importlib.import_module('configs.sweeps.posemb_table8')
NEW = [
    ('none', 'input'),
    ('learn2d', 'input'),
    ('relative', 'input'),
    ('learn', 'every_layer'),
    ('learn2d', 'every_layer'),
    ('learn', 'shared_every_layer'),
    ('learn2d', 'shared_every_layer'),
]


def _model(num_classes=5, **overrides) -> VisionTransformer:
  return VisionTransformer(
      num_classes=num_classes, **variants.get_model_config('ViT-testing_4', overrides)
  )


def _flat(tree):
  return {'/'.join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


def _images(n, height, width, seed=0):
  return np.random.RandomState(seed).uniform(-1, 1, (n, height, width, 3)).astype(np.float32)


def _random(module, *args):
  """Random parameters of a posemb module (every entry distinct, so equal entries mean shared ones)."""
  shapes = jax.eval_shape(lambda: module.init(jax.random.key(0), *args))['params']  # Static grid.
  rng = np.random.RandomState(1)
  return jax.tree.map(lambda x: rng.randn(*x.shape).astype(np.float32), shapes)


# What each kind adds.


def test_learn2d_patches_in_a_row_share_y_and_in_a_column_share_x():
  h, w, d = 3, 4, 8
  tokens = jnp.zeros((1, 1 + h * w, d))
  module = posemb.Add2DPositionEmbs()
  params = _random(module, tokens, (h, w))
  assert {k: v.shape for k, v in _flat(params).items()} == {
      'x_embedding': (w, d // 2),
      'y_embedding': (h, d // 2),
      'prefix_embedding': (1, d),
  }
  added = np.asarray(module.apply({'params': params}, tokens, (h, w)))[0]
  np.testing.assert_array_equal(added[0], params['prefix_embedding'][0])  # The class token's own.
  grid = added[1:].reshape(h, w, d)
  for r in range(h):
    for c in range(w):
      np.testing.assert_array_equal(
          grid[r, c], np.concatenate([params['x_embedding'][c], params['y_embedding'][r]])
      )
  assert np.all(grid[:, :, d // 2 :] == grid[:, :1, d // 2 :])  # Same row: the same Y half.
  assert np.all(grid[:, :, : d // 2] == grid[:1, :, : d // 2])  # Same column: the same X half.
  assert len({grid[0, c, : d // 2].tobytes() for c in range(w)}) == w  # ...and only then.


def _numpy_relative_bias(table, prefix_bias, h, w, num_prefix):
  """The bias [heads, N, N] by its definition, pair by pair."""
  cells = [(None, None)] * num_prefix + [(r, c) for r in range(h) for c in range(w)]
  bias = np.zeros((table.shape[-1], len(cells), len(cells)), np.float32)
  for i, (qr, qc) in enumerate(cells):
    for j, (kr, kc) in enumerate(cells):
      if qr is not None and kr is not None:
        bias[:, i, j] = table[qr - kr + h - 1, qc - kc + w - 1]
      else:  # Prefix query; patch query to prefix key; prefix to prefix.
        bias[:, i, j] = prefix_bias[0 if kr is not None else 1 if qr is not None else 2]
  return bias


@pytest.mark.parametrize('h,w,num_prefix', [(3, 4, 1), (2, 2, 0), (4, 3, 1)])
def test_relative_bias_depends_only_on_the_offset(h, w, num_prefix):
  heads, n = 3, num_prefix + h * w
  module = posemb.RelativePositionBias(num_heads=heads)
  params = _random(module, n, (h, w))
  assert params['relative_bias'].shape == (2 * h - 1, 2 * w - 1, heads)
  assert ('prefix_bias' in params) == bool(num_prefix)
  bias = np.asarray(module.apply({'params': params}, n, (h, w)))
  assert bias.shape == (heads, n, n)
  rows, cols = np.divmod(np.arange(h * w), w)
  offset = {}
  for i in range(h * w):
    for j in range(h * w):
      key = (rows[i] - rows[j], cols[i] - cols[j])
      entry = bias[:, num_prefix + i, num_prefix + j]
      np.testing.assert_array_equal(offset.setdefault(key, entry), entry)
  assert len(offset) == (2 * h - 1) * (2 * w - 1)  # ...and every offset has its own entry.
  assert len({tuple(v) for v in offset.values()}) == len(offset)
  np.testing.assert_array_equal(
      bias,
      _numpy_relative_bias(params['relative_bias'], params.get('prefix_bias'), h, w, num_prefix),
  )


def test_xla_attention_adds_the_bias_to_the_logits():
  rng = np.random.RandomState(2)
  q, k, v = (rng.randn(2, 5, 3, 4).astype(np.float32) for _ in range(3))  # [b, tokens, heads, dim]
  bias = rng.randn(3, 5, 5).astype(np.float32)
  logits = np.einsum('bqhd,bkhd->bhqk', q, k) / 2.0 + bias
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  expected = np.einsum('bhqk,bkhd->bqhd', weights, v)
  np.testing.assert_allclose(
      attention.head_major_attention(q, k, v, bias=bias), expected, atol=1e-5
  )
  with pytest.raises(
      ValueError, match=r"^model.posemb='relative' .* set --config.model.attention=xla$"
  ):
    attention.fused_attention(q, k, v, bias=bias)


def test_relative_model_adds_each_blocks_bias_to_its_attention():
  images = _images(2, 12, 16)  # 3x4 patches.
  model = _model(posemb='relative')
  rng = np.random.RandomState(3)
  params = jax.tree.map(
      lambda x: 0.3 * rng.randn(*x.shape).astype(np.float32),
      jax.eval_shape(model.init, jax.random.key(0), images)['params'],
  )
  assert params['Transformer']['encoderblock_1']['relative_posemb']['relative_bias'].shape == (
      5,
      7,
      2,
  )
  relative = lambda path: 'relative_posemb' in jax.tree_util.keystr(path)
  zeroed = jax.tree_util.tree_map_with_path(
      lambda p, x: np.zeros_like(x) if relative(p) else x, params
  )
  none = jax.tree.map(lambda x: x, params)
  for i in range(2):
    del none['Transformer'][f'encoderblock_{i}']['relative_posemb']
  plain = _model(posemb='none').apply({'params': none}, images)
  # A zero bias is no bias; a learned one moves the logits.
  np.testing.assert_allclose(model.apply({'params': zeroed}, images), plain, atol=1e-5)
  assert not np.allclose(model.apply({'params': params}, images), plain, atol=1e-3)
  with pytest.raises(
      ValueError,
      match="attention='dot_product_attention' does not train: set " '--config.model.attention=xla',
  ):
    model.clone(attention='dot_product_attention').apply({'params': params}, images)


def test_without_position_embeddings_permuting_the_patches_permutes_the_tokens():
  tokens = jnp.asarray(np.random.RandomState(4).randn(2, 1 + 12, 32).astype(np.float32))
  encoder_ = encoder.Encoder(num_layers=2, mlp_dim=64, num_heads=2, posemb='none')
  params = encoder_.init(jax.random.key(0), tokens, grid=(3, 4), train=False)['params']
  assert 'posembed_input' not in params
  order = np.concatenate([[0], 1 + np.random.RandomState(5).permutation(12)])
  out = encoder_.apply({'params': params}, tokens, grid=(3, 4), train=False)
  permuted = encoder_.apply({'params': params}, tokens[:, order], grid=(3, 4), train=False)
  np.testing.assert_allclose(permuted, out[:, order], atol=1e-5)
  # The classifier reads the class token: the same logits for the image with its patches shuffled.
  images = _images(2, 16, 16)
  patches = images.reshape(2, 4, 4, 4, 4, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, 4, 4, 3)
  shuffled = patches[:, np.random.RandomState(6).permutation(16)].reshape(2, 4, 4, 4, 4, 3)
  shuffled = shuffled.transpose(0, 1, 3, 2, 4, 5).reshape(2, 16, 16, 3)
  for kind, invariant in (('none', True), ('learn', False)):
    model = _model(posemb=kind)
    params = helpers.random_params(model, 16)
    same = np.allclose(
        model.apply({'params': params}, shuffled),
        model.apply({'params': params}, images),
        atol=1e-4,
    )
    assert same == invariant, kind


# Where they enter.


def _shapes(**overrides):
  shapes = traverse_util.flatten_dict(adapting.param_shapes(_model(**overrides), 16), sep='/')
  return {k: v.shape for k, v in shapes.items()}


def test_defaults_are_the_original_tree_and_every_layer_adds_one_embedding_per_block():
  default = _shapes()
  assert _shapes(posemb='learn', posemb_where='input') == default
  assert default['Transformer/posembed_input/pos_embedding'] == (1, 17, 32)
  count = lambda shapes: sum(np.prod(s) for s in shapes.values())
  every = _shapes(posemb_where='every_layer')
  assert {k for k in every if 'posemb' in k} == {
      f'Transformer/encoderblock_{i}/posembed/pos_embedding' for i in range(2)
  }
  assert count(every) == count(default) + 17 * 32  # Two layers: one embedding more than the input.
  assert _shapes(posemb_where='shared_every_layer') == default  # One embedding, the input's tree.
  assert count(_shapes(posemb='none')) == count(default) - 17 * 32
  two_d = _shapes(posemb='learn2d', posemb_where='every_layer')
  assert {k: v for k, v in two_d.items() if 'posemb' in k} == {
      **{f'Transformer/encoderblock_{i}/posembed/x_embedding': (4, 16) for i in range(2)},
      **{f'Transformer/encoderblock_{i}/posembed/y_embedding': (4, 16) for i in range(2)},
      **{f'Transformer/encoderblock_{i}/posembed/prefix_embedding': (1, 32) for i in range(2)},
  }
  relative = _shapes(posemb='relative')
  assert {k: v for k, v in relative.items() if 'posemb' in k} == {
      **{
          f'Transformer/encoderblock_{i}/relative_posemb/relative_bias': (7, 7, 2) for i in range(2)
      },
      **{f'Transformer/encoderblock_{i}/relative_posemb/prefix_bias': (3, 2) for i in range(2)},
  }


@pytest.mark.parametrize('kind', ['learn', 'learn2d'])
def test_shared_every_layer_is_every_layer_with_one_embedding_copied_into_each_block(kind):
  images = _images(2, 16, 16)
  shared = helpers.random_params(_model(posemb=kind, posemb_where='shared_every_layer'), 16)
  embedding = shared['Transformer']['posembed_input']
  every = {
      **shared,
      'Transformer': {
          **{k: v for k, v in shared['Transformer'].items() if k != 'posembed_input'},
          **{
              f'encoderblock_{i}': {
                  **shared['Transformer'][f'encoderblock_{i}'],
                  'posembed': embedding,
              }
              for i in range(2)
          },
      },
  }
  out = _model(posemb=kind, posemb_where='shared_every_layer').apply({'params': shared}, images)
  np.testing.assert_allclose(
      _model(posemb=kind, posemb_where='every_layer').apply({'params': every}, images),
      out,
      atol=1e-5,
  )
  # Added at every layer, not once: the input-only model with the same tree differs.
  assert not np.allclose(_model(posemb=kind).apply({'params': shared}, images), out, atol=1e-3)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.parametrize('kind,where', NEW)
def test_scan_and_remat_give_the_loops_outputs_and_gradients(kind, where):
  images = _images(2, 16, 16)
  params = helpers.random_params(_model(posemb=kind, posemb_where=where), 16)

  def loss_and_grads(**fast):
    model = _model(posemb=kind, posemb_where=where, **fast)
    return jax.value_and_grad(lambda p: jnp.sum(model.apply({'params': p}, images) ** 2))(params)

  loss, grads = loss_and_grads()
  scale = max(np.abs(g).max() for g in jax.tree.leaves(grads))
  for fast in (
      {'scan': True},
      {'scan': True, 'remat': 'nothing_saveable'},
      {'remat': 'dots_saveable'},
  ):
    fast_loss, fast_grads = loss_and_grads(**fast)
    np.testing.assert_allclose(fast_loss, loss, rtol=1e-5)
    jax.tree.map(
        functools.partial(np.testing.assert_allclose, atol=1e-5 * scale), fast_grads, grads
    )


# A new resolution.


def _adapt(loaded, model, image_size, method='bilinear'):
  return adapting.adapt_params(
      loaded,
      adapting.param_shapes(model, image_size),
      keep_head=True,
      keep_pre_logits=False,
      posemb_method=method,
  )


def test_every_layers_embeddings_are_each_resized_like_the_input_one():
  model = _model(posemb_where='every_layer')
  loaded = helpers.random_params(model, 8)  # 2x2 patches.
  params, notes = _adapt(loaded, model, 16)
  assert notes == [
      f'resized Transformer/encoderblock_{i}/posembed/pos_embedding 2x2 -> 4x4 (bilinear)'
      for i in range(2)
  ]
  for i in range(2):
    block = f'encoderblock_{i}'
    np.testing.assert_array_equal(
        params['Transformer'][block]['posembed']['pos_embedding'],
        posemb_resizing.interpolate_posemb(
            loaded['Transformer'][block]['posembed']['pos_embedding'], (4, 4), num_prefix_tokens=1
        ),
    )
  assert model.apply({'params': params}, _images(2, 16, 16)).shape == (2, 5)


@pytest.mark.parametrize('where', ['input', 'every_layer'])
def test_learn2d_resizes_each_axis_and_keeps_linear_embeddings_linear(where):
  model = _model(posemb='learn2d', posemb_where=where)
  loaded = helpers.random_params(model, 12)  # 3x3 patches.
  scope = 'posembed_input' if where == 'input' else 'encoderblock_1/posembed'
  flat = _flat(loaded)
  columns = np.arange(3.0)[:, None]
  flat[f'Transformer/{scope}/x_embedding'] = (0.5 + 2.0 * columns * np.ones(16)).astype(np.float32)
  flat[f'Transformer/{scope}/y_embedding'] = np.full((3, 16), 0.7, np.float32)  # Constant.
  loaded = traverse_util.unflatten_dict(flat, sep='/')
  params, notes = _adapt(loaded, model, 28)  # 7x7 patches.
  assert f'resized Transformer/{scope}/x_embedding 3 -> 7 columns (bilinear)' in notes
  assert f'resized Transformer/{scope}/y_embedding 3 -> 7 rows (bilinear)' in notes
  resized = _flat(params)
  # Corners aligned: new column c sits at old column c * (3 - 1) / (7 - 1).
  expected_x = 0.5 + 2.0 * (np.arange(7.0) * 2 / 6)[:, None] * np.ones(16)
  np.testing.assert_allclose(resized[f'Transformer/{scope}/x_embedding'], expected_x, rtol=1e-6)
  np.testing.assert_allclose(resized[f'Transformer/{scope}/y_embedding'], 0.7, rtol=1e-6)
  np.testing.assert_array_equal(
      resized[f'Transformer/{scope}/prefix_embedding'],
      flat[f'Transformer/{scope}/prefix_embedding'],
  )
  bicubic, _ = _adapt(loaded, model, 28, 'bicubic')
  assert _flat(bicubic)[f'Transformer/{scope}/x_embedding'].shape == (7, 16)
  np.testing.assert_allclose(_flat(bicubic)[f'Transformer/{scope}/y_embedding'], 0.7, rtol=1e-5)
  assert model.apply({'params': params}, _images(2, 28, 28)).shape == (2, 5)


def test_relative_biases_are_resized_over_their_range_of_offsets():
  model = _model(posemb='relative')
  loaded = helpers.random_params(model, 12)  # 3x3 patches: offsets -2..2, a 5x5 table.
  params, notes = _adapt(loaded, model, 20)  # 5x5 patches: offsets -4..4, 9x9.
  assert notes == [
      f'resized Transformer/encoderblock_{i}/relative_posemb/relative_bias 5x5 -> 9x9 '
      'offsets (bilinear)'
      for i in range(2)
  ]
  for i in range(2):
    old = loaded['Transformer'][f'encoderblock_{i}']['relative_posemb']
    new = params['Transformer'][f'encoderblock_{i}']['relative_posemb']
    assert new['relative_bias'].shape == (9, 9, 2)
    np.testing.assert_allclose(
        new['relative_bias'],
        posemb_resizing.resize_leading(old['relative_bias'], (9, 9)),
        rtol=1e-6,
    )
    np.testing.assert_allclose(new['relative_bias'][4, 4], old['relative_bias'][2, 2], rtol=1e-6)
    np.testing.assert_allclose(new['relative_bias'][::2, ::2], old['relative_bias'], rtol=1e-6)
    np.testing.assert_array_equal(new['prefix_bias'], old['prefix_bias'])
  assert model.apply({'params': params}, _images(2, 20, 20)).shape == (2, 5)


@pytest.mark.parametrize('method', posemb_resizing.POSEMB_METHODS)
@pytest.mark.parametrize(
    'overrides',
    [
        {},
        {'posemb': 'learn2d'},
        {'posemb': 'relative'},
        {'posemb_where': 'every_layer', 'scan': True},
        {'posemb': 'learn2d', 'posemb_where': 'shared_every_layer'},
    ],
)
def test_fitted_to_grid_the_model_computes_what_resized_parameters_compute(overrides, method):
  """A model at 8 px (2x2 patches) on 20 px images (5x5): in `fitted_to_grid` its embeddings are
  resized as it runs, as fine-tuning's adapt_params resizes them once on the host."""
  model = _model(**overrides)
  loaded = helpers.random_params(model, 8)
  images = _images(3, 20, 20)
  with posemb.fitted_to_grid(method):
    fitted = jax.jit(lambda p, x: model.apply({'params': p}, x))(loaded, images)
  resized, _ = _adapt(loaded, model, 20, method)
  np.testing.assert_allclose(fitted, model.apply({'params': resized}, images), atol=2e-5)
  with pytest.raises(ValueError, match='the parameters are for another image size'):
    model.apply({'params': loaded}, images)  # Outside it, as before.


@pytest.mark.parametrize(
    'checkpoint_kind,model_kind,message',
    [
        (
            {'posemb': 'learn2d'},
            {'posemb': 'relative'},
            r'the checkpoint has learned 2-D position embeddings; set --config.model.posemb=learn2d to match it$',
        ),
        (
            {'posemb': 'relative'},
            {},
            r'the checkpoint has relative position embeddings; set '
            r'--config.model.posemb=relative to match it$',
        ),
        (
            {'posemb_where': 'every_layer'},
            {},
            r'the checkpoint has learned position embeddings in every '
            r'block; set --config.model.posemb=learn --config.model.posemb_where=every_layer to match it$',
        ),
        (
            {'posemb': 'none'},
            {'posemb': 'learn2d'},
            r'the checkpoint has no learned position embeddings; '
            r'set --config.model.posemb=sincos2d \(or sincos2d_mae, none\)',
        ),
    ],
)
def test_other_position_embeddings_than_the_models_are_a_one_line_error(
    checkpoint_kind, model_kind, message
):
  loaded = helpers.random_params(_model(**checkpoint_kind), 8)
  with pytest.raises(ValueError, match=message) as error:
    _adapt(loaded, _model(**model_kind), 16)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize(
    'kind,message',
    [
        ('learn2d', r'\(2, 16\) are for 2 columns, but the images give 4: .*adapt_params'),
        ('relative', r'\(3, 3, 2\) are for 3 row offsets, but the images give 7: .*adapt_params'),
    ],
)
def test_params_of_another_grid_are_a_clear_error(kind, message):
  params = helpers.random_params(_model(posemb=kind), 8)
  with pytest.raises(ValueError, match=message):
    _model(posemb=kind).apply({'params': params}, _images(1, 16, 16))


@pytest.mark.parametrize(
    'kind,where',
    [
        ('learn2d', 'input'),
        ('relative', 'input'),
        ('learn', 'every_layer'),
        ('learn', 'shared_every_layer'),
    ],
)
def test_pictures_show_the_1d_input_embeddings_only(tmp_path, kind, where):
  model = _model(posemb=kind, posemb_where=where)
  image = np.random.RandomState(0).randint(0, 256, (20, 20, 3), np.uint8)
  paths = pictures.write_pictures(model, helpers.random_params(model, 8), image, 8, str(tmp_path))
  assert (str(tmp_path / 'position_embeddings.png') in paths) == (where == 'shared_every_layer')
  assert str(tmp_path / 'attention_rollout.png') in paths


# Config errors.


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'posemb_where': 'stem'},
            r"^Unknown model.posemb_where 'stem': use one of input, every_layer, shared_every_layer$",
        ),
        (
            {'posemb': 'none', 'posemb_where': 'every_layer'},
            r"^model.posemb='none' does not enter at model.posemb_where='every_layer' .*"
            r'set --config.model.posemb_where=input$',
        ),
        (
            {'posemb': 'relative', 'posemb_where': 'shared_every_layer'},
            r"^model.posemb='relative' does not enter .*relative ones enter every block's attention.*"
            r'posemb_where=input$',
        ),
        (
            {'posemb': 'relative', 'attention': 'dot_product_attention'},
            r"^model.posemb='relative' .* set --config.model.attention=xla$",
        ),
        (
            {'posemb': 'learn2d', 'hidden_size': 35, 'num_heads': 5},
            r"^model.hidden_size=35 must be even for model.posemb='learn2d'",
        ),
    ],
)
def test_model_config_errors_are_one_line(overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config('ViT-testing_4', overrides)
  assert '\n' not in str(error.value)


# Sharded training, resume.

_TRAIN = {
    **helpers.TINY,
    'optim.name': 'sgd',
    'optim.weight_decay': 0.0,
    'lr.base': 0.1,
    'model.dropout_rate': 0.0,
    'model.head_dropout_rate': 0.0,
}


# Each option once (scanned too where the blocks hold the parameters).
@pytest.mark.parametrize(
    'kind,where,scan',
    [
        ('none', 'input', False),
        ('relative', 'input', False),
        ('relative', 'input', True),
        ('learn2d', 'every_layer', True),
        ('learn', 'shared_every_layer', False),
    ],
)
@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_fsdp_x_tensor_training_has_the_losses_of_one_device(tmp_path, data_dir, kind, where, scan):
  overrides = {
      **_TRAIN,
      'data_dir': data_dir,
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'model.posemb': kind,
      'model.posemb_where': where,
      'model.scan': scan,
  }
  setup = train_setup.prepare(helpers.load_config('demo', overrides), str(tmp_path / 'mesh'))
  _, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'))
  if kind == 'relative':  # Split over heads with the attention (the stacked layer axis kept whole).
    bias = state.params['Transformer']['encoderblock' if scan else 'encoderblock_0'][
        'relative_posemb'
    ]
    assert bias['relative_bias'].sharding.spec == (
        P(None, None, None, 'tensor') if scan else P(None, None, 'tensor')
    )


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_resume_is_bit_exact(tmp_path, data_dir):
  overrides = {
      **_TRAIN,
      'data_dir': data_dir,
      'total_steps': 8,
      'checkpoint_every_steps': 4,
      'eval_every_steps': 8,
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'model.posemb': 'relative',
      'model.dropout_rate': 0.1,
  }
  full = str(tmp_path / 'full')
  loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), full))
  helpers.assert_resume_is_bit_exact(
      helpers.load_config('demo', overrides), full, str(tmp_path / 'resumed')
  )


@pytest.mark.devices(8)
def test_partition_rules_split_the_relative_biases_over_heads():
  mesh = sharding.make_mesh((('fsdp', 2), ('tensor', 4)))
  spec = functools.partial(sharding.partition_spec, mesh=mesh)
  block = 'Transformer/encoderblock_3/relative_posemb'
  assert spec(f'{block}/relative_bias', (27, 27, 12)) == P(None, None, 'tensor')
  assert spec(f'{block}/prefix_bias', (3, 12)) == P(None, 'tensor')
  assert spec(f'opt_state/0/mu/{block}/relative_bias', (27, 27, 12)) == P(None, None, 'tensor')
  assert spec('Transformer/encoderblock/relative_posemb/relative_bias', (12, 27, 27, 12)) == P(
      None, None, None, 'tensor'
  )
  assert spec('Transformer/posembed_input/x_embedding', (14, 384)) == P(None, 'fsdp')


# The sweep.


def test_the_sweep_runs_table_8_and_prints_it(tmp_path):
  # The runs' events as clu writes them; only this test of the module needs TensorFlow.
  tf = helpers.tensorflow()

  cells = [
      (r['model.posemb'], r.get('model.posemb_where', 'input'))
      for r in sweep.expand(table8.get_sweep())
  ]
  assert sorted(cells) == sorted(
      [('none', 'input'), ('relative', 'input')]
      + [(kind, where) for kind in ('learn', 'learn2d') for where in posemb.POSEMB_WHERE]
  )
  for kind, where in cells:  # Every cell is a valid model.
    variants.get_model_config('ViT-testing_4', {'posemb': kind, 'posemb_where': where})
  for i, (kind, where) in enumerate(cells[:3]):
    workdir = tmp_path / f'run{i}'
    workdir.mkdir()
    model = {'posemb': kind, 'posemb_where': None if where == 'input' else where}
    (workdir / 'config.json').write_text(json.dumps({'model': model}))
    writer = tf.summary.create_file_writer(str(workdir))
    with writer.as_default():
      for step, value in ((5, 0.1), (10, 0.5 + i / 10)):
        tf.summary.scalar('eval_top1', value, step=step)
    writer.close()
  runs = [load_run(name, path) for name, path in find_runs([str(tmp_path)])]
  lines = report.pivot(runs, 'model.posemb', 'model.posemb_where').splitlines()
  assert lines[0] == (
      '| eval_top1: model.posemb (rows), model.posemb_where (columns) | ' '(default) |'
  )
  assert sorted(lines[2:]) == ['| learn | 0.7000 |', '| none | 0.5000 |', '| relative | 0.6000 |']
