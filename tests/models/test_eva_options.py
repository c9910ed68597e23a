"""EVA-02's model options: 2-D rotary embeddings (`rope`, `rope_grid`; the other models' styles with
`rope_style`), a gated MLP (`mlp_gated`) with its norm (`mlp_norm`), no key bias (`key_bias=False`),
EVA-02 CLIP's LayerNorm in the attention (`attn_norm`). Their parity with timm's Eva is
tests/checkpoints/test_eva_vs_torch.py's; here the properties that hold whatever timm does."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from jax.sharding import PartitionSpec as P

from vit_jax import sharding
from vit_jax.models import block, rope, variants
from vit_jax.models.vit import VisionTransformer
from vit_jax.train import param_groups

_EVA = dict(
    classifier='gap',
    class_token=True,
    fc_norm=True,
    mlp_activation='silu',
    mlp_gated=True,
    mlp_norm=True,
    key_bias=False,
    attn_norm=True,
    rope=True,
    rope_grid=(16, 16),
)


def _tiny(**kwargs):
  return VisionTransformer(num_classes=5, **variants.get_model_config('ViT-testing_4', kwargs))


def _random_params(model, images, seed=0, **kwargs):
  """Every parameter random (a zero head would hide every difference)."""
  flat = traverse_util.flatten_dict(model.init(jax.random.key(seed), images, **kwargs)['params'])
  keys = jax.random.split(jax.random.key(seed + 1), len(flat))
  return traverse_util.unflatten_dict(
      {path: 0.3 * jax.random.normal(key, v.shape) for (path, v), key in zip(flat.items(), keys)}
  )


@pytest.mark.parametrize('style', list(rope.STYLES))
def test_rotated_queries_and_keys_meet_by_their_offset_alone(style):
  """RoPE's defining property: the product of a query at patch p and a key at patch p' rotated by
  their positions depends on p - p' only (here the same vectors at every patch of a 3x4 grid); a
  learned style's at its initial frequencies."""
  init = rope.STYLES[style].init
  frequencies = None if init is None else init(jax.random.key(0), (2, 1, 4))
  sin, cos = rope.tables((3, 4), 8, style=style, frequencies=frequencies)
  q, k = np.random.RandomState(0).normal(size=(2, 8)).astype(np.float32)
  patches = lambda v: np.tile(v, (12, 1))[None, :, None, :]  # [1, 12 patches, 1 head, 8]
  rq = np.asarray(rope.apply(jnp.asarray(patches(q)), sin, cos, 0, style))[0, :, 0]
  rk = np.asarray(rope.apply(jnp.asarray(patches(k)), sin, cos, 0, style))[0, :, 0]
  products = rq @ rk.T  # [query patch, key patch]
  position = lambda i: divmod(i, 4)  # Row-major (row, column).
  by_offset = {}
  for i in range(12):
    for j in range(12):
      offset = tuple(np.subtract(position(i), position(j)))
      by_offset.setdefault(offset, []).append(products[i, j])
  assert len(by_offset) == 5 * 7
  for values in by_offset.values():
    np.testing.assert_allclose(values, values[0], rtol=1e-5, atol=1e-5)
  assert np.ptp([v[0] for v in by_offset.values()]) > 0.1  # And the offset does change it.


def test_rope_turns_the_patches_only_and_rescales_to_its_grid():
  sin, cos = rope.tables((2, 2), 4)
  x = jax.random.normal(
      jax.random.key(0), (1, 1 + 4 + 3, 2, 4)
  )  # A class token, 4 patches, 3 pads.
  turned = rope.apply(x, sin, cos, start=1)
  np.testing.assert_array_equal(turned[:, :1], x[:, :1])
  np.testing.assert_array_equal(turned[:, 5:], x[:, 5:])
  np.testing.assert_allclose(turned[:, 1], x[:, 1], rtol=1e-6)  # Position (0, 0): no turn.
  np.testing.assert_allclose(  # Rotations keep each pair's length.
      jnp.linalg.norm(turned.reshape(1, 8, 2, 2, 2), axis=-1),
      jnp.linalg.norm(x.reshape(1, 8, 2, 2, 2), axis=-1),
      rtol=1e-5,
  )
  # A 2x2 grid measured on a 4x4 reference: its positions are 0 and 2, the 4x4 grid's rows 0 and 2.
  small, reference = rope.tables((2, 2), 4, ref_grid=(4, 4)), rope.tables((4, 4), 4)
  for t_small, t_ref in zip(small, reference):
    np.testing.assert_allclose(t_small, t_ref.reshape(4, 4, 4)[::2, ::2].reshape(4, 4), atol=1e-6)
  with pytest.raises(ValueError, match=r'head width .* = 6 must be a multiple of 4'):
    rope.tables((2, 2), 6)


def test_dinov3_rope_is_the_numpy_formula():
  """DINOv3's rotation, channel by channel in float64: channel i of a head of width d turns with
  channel i + d / 2 (the halves) by the angle of its band j = i mod d / 2, the first d / 4 bands by
  the row, the others by the column, at 2 pi (2 (r + 0.5) / h - 1) / 100^(4 (j mod d / 4) / d)."""
  grid, d = (3, 5), 8
  x = np.random.RandomState(0).normal(size=(2, 1 + 15 + 2, 3, d)).astype(np.float32)
  sin, cos = rope.tables(grid, d, style='dinov3')
  turned = np.asarray(rope.apply(jnp.asarray(x), sin, cos, 1, 'dinov3'))
  expected = x.astype(np.float64)
  for p in range(15):
    position = divmod(p, grid[1])
    for i in range(d):
      j = i % (d // 2)
      axis, k = divmod(j, d // 4)
      coordinate = 2 * (position[axis] + 0.5) / grid[axis] - 1
      angle = 2 * np.pi * coordinate / 100.0 ** (4 * k / d)
      partner = -x[:, 1 + p, :, i + d // 2] if i < d // 2 else x[:, 1 + p, :, i - d // 2]
      expected[:, 1 + p, :, i] = x[:, 1 + p, :, i] * np.cos(angle) + partner * np.sin(angle)
  np.testing.assert_allclose(turned, expected, atol=1e-5)
  np.testing.assert_array_equal(turned[:, :1], x[:, :1])  # The class token and pads do not turn.
  np.testing.assert_array_equal(turned[:, 16:], x[:, 16:])
  with pytest.raises(ValueError, match=r"^rope_style 'dinov3' spans \[-1, 1\] at any grid"):
    rope.tables(grid, d, ref_grid=(16, 16), style='dinov3')


def test_rope_mixed_is_the_numpy_formula_of_its_learned_frequencies():
  """RoPE-Mixed, pair by pair in float64: pair m of head h (channels 2m, 2m + 1) turns by
  column x fx[h, m] + row x fy[h, m], at any frequencies (here random ones, not the initial)."""
  grid, heads, d = (3, 5), 3, 8
  x = np.random.RandomState(0).normal(size=(2, 1 + 15 + 2, heads, d)).astype(np.float32)
  frequencies = np.random.RandomState(1).normal(size=(2, heads, d // 2)).astype(np.float32)
  sin, cos = rope.tables(grid, d, style='rope_mixed', frequencies=jnp.asarray(frequencies))
  turned = np.asarray(rope.apply(jnp.asarray(x), sin, cos, 1, 'rope_mixed'))
  expected = x.astype(np.float64)
  for p in range(15):
    row, column = divmod(p, grid[1])
    for h in range(heads):
      for m in range(d // 2):
        angle = column * frequencies[0, h, m] + row * frequencies[1, h, m]
        a, b = x[:, 1 + p, h, 2 * m], x[:, 1 + p, h, 2 * m + 1]
        expected[:, 1 + p, h, 2 * m] = a * np.cos(angle) - b * np.sin(angle)
        expected[:, 1 + p, h, 2 * m + 1] = b * np.cos(angle) + a * np.sin(angle)
  np.testing.assert_allclose(turned, expected, atol=1e-5)
  np.testing.assert_array_equal(turned[:, :1], x[:, :1])
  np.testing.assert_array_equal(turned[:, 16:], x[:, 16:])
  for kwargs in ({}, {'ref_grid': (4, 4), 'frequencies': jnp.asarray(frequencies)}):
    with pytest.raises(ValueError, match=r"^rope_style 'rope_mixed' counts positions with its"):
      rope.tables(grid, d, style='rope_mixed', **kwargs)
  with pytest.raises(ValueError, match=r"^rope_style 'rope_vit' has fixed frequencies"):
    rope.tables(grid, d, style='rope_vit', frequencies=jnp.asarray(frequencies))


def test_rope_mixed_frequencies_start_as_timms_and_are_learned_without_weight_decay():
  """Each block draws its own: per head, pair k of each half at magnitude 10^(-k / (d / 4)), the
  first half's direction at a random angle, the second's a quarter turn on (timm's
  init_random_2d_freqs); the loss reaches them, and weight decay does not (timm's
  no_weight_decay)."""
  model = _tiny(rope=True, rope_style='rope_mixed', posemb='none')
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  blocks = [params['Transformer'][f'encoderblock_{i}']['rope_freqs'] for i in range(2)]
  heads, d = 2, 16
  for frequencies in blocks:
    assert frequencies.shape == (2, heads, d // 2)
    fx, fy = np.asarray(frequencies, np.float64).reshape(2, heads, 2, d // 4)
    magnitudes = 10.0 ** (-np.arange(d // 4) * 4 / d)
    np.testing.assert_allclose(np.hypot(fx, fy), np.broadcast_to(magnitudes, fx.shape), rtol=1e-5)
    angles = np.arctan2(fy, fx)  # [heads, half, bands]: one angle per head and half.
    np.testing.assert_allclose(angles, angles[..., :1] * np.ones_like(angles), atol=1e-5)
    np.testing.assert_allclose(
        np.cos(angles[:, 1, 0] - angles[:, 0, 0] - np.pi / 2), np.ones(heads), atol=1e-5
    )
  assert not np.allclose(blocks[0], blocks[1])
  loss = lambda p: jnp.sum(model.apply({'params': p}, images) ** 2)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  gradient = jax.grad(loss)(params)['Transformer']['encoderblock_0']['rope_freqs']
  assert np.all(np.isfinite(gradient)) and np.abs(gradient).max() > 0
  decayed = param_groups.kernels_only(params)['Transformer']['encoderblock_0']
  assert decayed['rope_freqs'] is False and decayed['MlpBlock_3']['Dense_0']['kernel'] is True


def test_rope_mixed_scans_rematerialises_and_shards_alike():
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  fields = dict(rope=True, rope_style='rope_mixed', posemb='none')
  model = _tiny(**fields)
  params = _random_params(model, images)
  logits = model.apply({'params': params}, images)
  for layout in ({'scan': True}, {'scan': True, 'remat': 'dots_saveable'}):
    np.testing.assert_allclose(
        _tiny(**fields, **layout).apply({'params': params}, images), logits, rtol=1e-5, atol=1e-5
    )
  mesh = sharding.make_mesh((('fsdp', 4), ('tensor', 2)))
  placed = jax.tree_util.tree_map_with_path(
      lambda path, v: jax.device_put(
          v,
          jax.sharding.NamedSharding(
              mesh, sharding.partition_spec(param_groups.path_str(path), v.shape, mesh)
          ),
      ),
      params,
  )
  np.testing.assert_allclose(
      jax.jit(model.apply)({'params': placed}, images), logits, rtol=1e-5, atol=1e-5
  )


@pytest.mark.parametrize(
    'style,temperature,columns_first,offset',
    [
        ('eva02', 1e4, False, 0.0),
        ('rope_vit', 100.0, True, 0.0),
        ('pe', 1e4, True, 1.0),
        ('eva02_xy', 1e4, True, 0.0),
    ],
)
def test_the_pair_styles_are_the_numpy_formula(style, temperature, columns_first, offset):
  """EVA-02's, RoPE-ViT's and Perception Encoder's rotations, pair by pair in float64: pair m of a head
  of width d (channels 2m, 2m + 1) turns by position x temperature^(-k / (d / 4)), k = m mod d / 4,
  the first d / 4 pairs by the row (by the column, columns first), the others by the other axis; the
  positions (index + offset) / n x ref of a reference grid."""
  grid, ref, d = (3, 5), (6, 4), 8
  x = np.random.RandomState(0).normal(size=(2, 1 + 15 + 2, 3, d)).astype(np.float32)
  sin, cos = rope.tables(grid, d, ref_grid=ref, style=style)
  turned = np.asarray(rope.apply(jnp.asarray(x), sin, cos, 1, style))
  expected = x.astype(np.float64)
  for p in range(15):
    index = divmod(p, grid[1])
    positions = [(index[a] + offset) / grid[a] * ref[a] for a in (0, 1)]
    if columns_first:
      positions = positions[::-1]
    for m in range(d // 2):
      axis, k = divmod(m, d // 4)
      angle = positions[axis] * temperature ** (-k / (d // 4))
      a, b = x[:, 1 + p, :, 2 * m], x[:, 1 + p, :, 2 * m + 1]
      expected[:, 1 + p, :, 2 * m] = a * np.cos(angle) - b * np.sin(angle)
      expected[:, 1 + p, :, 2 * m + 1] = b * np.cos(angle) + a * np.sin(angle)
  np.testing.assert_allclose(turned, expected, atol=1e-5)
  np.testing.assert_array_equal(turned[:, :1], x[:, :1])


def test_the_gated_mlp_with_its_norm_is_the_numpy_formula():
  mlp = block.MlpBlock(6, activation='silu', gated=True, norm=True)
  x = np.random.RandomState(0).normal(size=(2, 3, 4)).astype(np.float32)
  params = _random_params(mlp, x, deterministic=True)
  p = lambda name: (np.asarray(params[name]['kernel']), np.asarray(params[name]['bias']))
  (w0, b0), (wl, bl), (w1, b1) = p('Dense_0'), p('Dense_linear'), p('Dense_1')
  gate = x @ w0 + b0
  hidden = gate / (1 + np.exp(-gate)) * (x @ wl + bl)
  mean, var = hidden.mean(-1, keepdims=True), hidden.var(-1, keepdims=True)
  hidden = (hidden - mean) / np.sqrt(var + 1e-6) * params['norm']['scale'] + params['norm']['bias']
  np.testing.assert_allclose(
      mlp.apply({'params': params}, x, deterministic=True), hidden @ w1 + b1, rtol=1e-5, atol=1e-5
  )


@pytest.mark.devices(8)
def test_eva_options_shape_the_tree_and_every_layout_computes_the_same():
  """No key bias, the MLP's second layer and norm in the tree; the scanned and rematerialised blocks,
  and a tensor-parallel mesh (the gate, linear layer and norm split over the MLP's units), compute
  what the unrolled ones do; each option changes the function."""
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  model = _tiny(**_EVA)
  params = _random_params(model, images)
  attention = params['Transformer']['encoderblock_0']['MultiHeadDotProductAttention_1']
  assert 'bias' not in attention['key'] and 'bias' in attention['query']
  assert attention['norm']['scale'].shape == (32,)  # Over the heads' outputs, concatenated.
  mlp = params['Transformer']['encoderblock_0']['MlpBlock_3']
  assert set(mlp) == {'Dense_0', 'Dense_linear', 'norm', 'Dense_1'}
  assert mlp['norm']['scale'].shape == (64,)
  logits = model.apply({'params': params}, images)
  for layout in (
      {'scan': True},
      {'remat': 'nothing_saveable'},
      {'scan': True, 'remat': 'dots_saveable'},
  ):
    np.testing.assert_allclose(
        _tiny(**_EVA, **layout).apply({'params': params}, images), logits, rtol=1e-5, atol=1e-5
    )
  mesh = sharding.make_mesh((('fsdp', 4), ('tensor', 2)))
  flat = traverse_util.flatten_dict(params, sep='/')
  specs = {path: sharding.partition_spec(path, v.shape, mesh) for path, v in flat.items()}
  assert specs['Transformer/encoderblock_0/MlpBlock_3/Dense_linear/kernel'] == P('fsdp', 'tensor')
  assert specs['Transformer/encoderblock_0/MlpBlock_3/norm/scale'] == P('tensor')
  placed = traverse_util.unflatten_dict(
      {
          path: jax.device_put(v, jax.sharding.NamedSharding(mesh, specs[path]))
          for path, v in flat.items()
      },
      sep='/',
  )
  np.testing.assert_allclose(
      jax.jit(model.apply)({'params': placed}, images), logits, rtol=1e-5, atol=1e-5
  )
  # Without rotary embeddings, or measured on another grid, the same parameters compute another
  # function.
  for other in ({'rope': False, 'rope_grid': None}, {'rope_grid': (4, 4)}, {'attn_norm': False}):
    changed = _tiny(**{**_EVA, **other}).apply({'params': params}, images)
    assert not np.allclose(changed, logits, atol=1e-3), other


def test_rope_at_a_new_resolution_needs_no_new_parameters():
  model = _tiny(**{**_EVA, 'posemb': 'none'})
  params = _random_params(model, jnp.zeros((1, 16, 16, 3)))
  logits = model.apply({'params': params}, jax.random.normal(jax.random.key(2), (2, 24, 24, 3)))
  assert logits.shape == (2, 5) and np.all(np.isfinite(logits))


@pytest.mark.parametrize(
    'fields,message',
    [
        ({'rope': True, 'num_heads': 16}, r'hidden_size / num_heads = 2 must be a multiple of 4'),
        ({'rope_grid': (16, 16)}, r'model.rope_grid=\(16, 16\) must be .* with model.rope=True'),
        (
            {'rope': True, 'rope_grid': (16,)},
            r'model.rope_grid=\(16,\) must be the \(rows, columns\)',
        ),
        (
            {'rope': True, 'rope_style': 'dinov2'},
            r"^model.rope_style='dinov2' must be one of eva02, rope_vit, pe, eva02_xy, rope_mixed, dinov3, with model.rope=True",
        ),
        ({'rope_style': 'dinov3'}, r"model.rope_style='dinov3' must be .* with model.rope=True"),
        (
            {'rope': True, 'rope_style': 'dinov3', 'rope_grid': (16, 16)},
            r"model.rope_grid=\(16, 16\) rescales positions, which model.rope_style='dinov3' "
            r'normalises .* unset model.rope_grid$',
        ),
        (
            {'rope': True, 'rope_style': 'rope_mixed', 'rope_grid': (16, 16)},
            r"model.rope_grid=\(16, 16\) rescales positions, which model.rope_style='rope_mixed' "
            r'counts at any grid .* unset model.rope_grid$',
        ),
    ],
)
def test_rope_fields_are_checked(fields, message):
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config('ViT-testing_4', fields)
  assert '\n' not in str(error.value)


def test_axial_blocks_refuse_rope():
  with pytest.raises(ValueError, match=r'Axial-ViT does not take model.rope=True'):
    variants.get_model_config('Axial-ViT-testing_4', {'rope': True})


def test_attention_dropout_acts_with_qk_norm_and_rope():
  """The queries' and keys' change before their product keeps the attention kernel's dropout (a
  wrapper of flax's attention_fn had hidden the dropout arguments from flax, which passes only the
  ones a function names)."""
  model = _tiny(**_EVA, qk_norm=True, attention_dropout_rate=0.5)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = _random_params(model, images)
  train = lambda seed: model.apply(
      {'params': params}, images, train=True, rngs={'dropout': jax.random.key(seed)}
  )
  assert not np.allclose(train(0), train(1), atol=1e-4)
  np.testing.assert_allclose(train(0), train(0))
