"""Checkpoint interoperability: the original `.npz` layout, position-embedding interpolation, head
surgery.

The reference implementations are independent of vit_jax: scipy and PIL for the interpolation, timm
(PyTorch) for the model and its reader of the original `.npz` files. torch and timm are in the `test`
extra; without them these tests fail rather than skip.
"""

import struct
import zipfile

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.ndimage
from PIL import Image

import helpers
from vit_jax.checkpoints import adapting, npz_files, posemb_resizing, saved_state
from vit_jax.models import VisionTransformer
from vit_jax.models import variants as model_variants


def _model(num_classes=10, **overrides):
  return VisionTransformer(
      num_classes=num_classes, **model_variants.get_model_config('ViT-testing_4', overrides)
  )


# Interpolation.


def test_bilinear_posemb_matches_scipy_zoom_of_the_original_code():
  posemb = np.random.RandomState(0).randn(1, 1 + 14 * 14, 16).astype(np.float32)
  resized = posemb_resizing.interpolate_posemb(posemb, (24, 24), num_prefix_tokens=1)
  # The original vit_jax fine-tuning code: zoom the (14, 14, D) grid by 24 / 14 with order=1.
  expected = scipy.ndimage.zoom(posemb[0, 1:].reshape(14, 14, 16), (24 / 14, 24 / 14, 1), order=1)
  assert resized.shape == (1, 1 + 24 * 24, 16) and resized.dtype == np.float32
  np.testing.assert_array_equal(resized[:, :1], posemb[:, :1])  # The class token, as it was.
  np.testing.assert_allclose(resized[0, 1:].reshape(24, 24, 16), expected, atol=1e-6)


@pytest.mark.parametrize('new_grid', [(7, 10), (1, 5), (14, 14)])
def test_bilinear_posemb_matches_scipy_zoom_on_other_grids(new_grid):
  posemb = np.random.RandomState(1).randn(1, 14 * 14, 4).astype(np.float32)  # GAP: no prefix token.
  resized = posemb_resizing.interpolate_posemb(posemb, new_grid, num_prefix_tokens=0)
  zoom = (new_grid[0] / 14, new_grid[1] / 14, 1)
  expected = scipy.ndimage.zoom(posemb[0].reshape(14, 14, 4), zoom, order=1)
  np.testing.assert_allclose(resized[0].reshape(*new_grid, 4), expected, atol=1e-6)


@pytest.mark.parametrize('new_grid', [(24, 24), (7, 10)])
@pytest.mark.parametrize(
    'method,pil', [('bicubic', Image.Resampling.BICUBIC), ('bilinear_antialiased', Image.BILINEAR)]
)
def test_jax_resized_posembs_match_pils_resize(new_grid, method, pil):
  posemb = np.random.RandomState(2).randn(1, 1 + 14 * 14, 3).astype(np.float32)
  resized = posemb_resizing.interpolate_posemb(posemb, new_grid, num_prefix_tokens=1, method=method)
  grid = posemb[0, 1:].reshape(14, 14, 3)
  expected = np.stack(
      [
          np.asarray(Image.fromarray(grid[..., c], mode='F').resize(new_grid[::-1], pil))
          for c in range(3)
      ],
      axis=-1,
  )
  np.testing.assert_array_equal(resized[:, :1], posemb[:, :1])
  np.testing.assert_allclose(resized[0, 1:].reshape(*new_grid, 3), expected, atol=1e-5)


def test_interpolation_errors_are_one_line():
  with pytest.raises(ValueError, match="Unknown config.posemb_interpolation 'nearest'"):
    posemb_resizing.interpolate_posemb(
        np.zeros((1, 5, 2)), (3, 3), num_prefix_tokens=1, method='nearest'
    )
  with pytest.raises(ValueError, match='6 grid tokens are not a square grid'):
    posemb_resizing.interpolate_posemb(np.zeros((1, 7, 2)), (3, 3), num_prefix_tokens=1)


# The .npz layout.


def test_save_npz_writes_the_original_flat_layout_and_load_npz_reads_it(tmp_path):
  params = helpers.random_params(_model(), 8)
  path = str(tmp_path / 'model')  # No extension: written as named all the same.
  npz_files.save_npz(jax.tree.map(lambda x: x.astype(jnp.bfloat16), params), path)
  with np.load(path) as npz:
    assert {
        'embedding/kernel',
        'cls',
        'Transformer/posembed_input/pos_embedding',
        'Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel',
        'Transformer/encoder_norm/scale',
        'head/kernel',
    } <= set(npz.files)
    assert {npz[k].dtype for k in npz.files} == {np.dtype(np.float32)}
  loaded = npz_files.load_npz(path)
  expected = jax.tree.map(lambda x: np.asarray(x.astype(jnp.bfloat16), np.float32), params)
  chex.assert_trees_all_equal(loaded, expected)


@pytest.mark.parametrize('prefix', ['opt/target/', 'params/'])
def test_load_npz_strips_a_prefix_and_ignores_optimizer_state(tmp_path, prefix):
  flat = {'embedding/kernel': np.ones((4, 4, 3, 8)), 'cls': np.zeros((1, 1, 8))}
  path = tmp_path / 'prefixed.npz'
  np.savez(path, **{prefix + k: v for k, v in flat.items()}, **{'opt/state/step': np.array(3)})
  loaded = npz_files.load_npz(str(path))
  assert sorted(loaded) == ['cls', 'embedding']
  np.testing.assert_array_equal(loaded['embedding']['kernel'], flat['embedding/kernel'])


@pytest.mark.parametrize('layout', ['original', 'big_vision', 'bit'])
def test_load_npz_shapes_only_reads_the_headers_alone(tmp_path, layout):
  """Each array's shape, from its .npy header: a file whose every array's data is damaged (zip's
  CRC-32 fails when an array is read to its end) gives the shapes the whole load gives. The arrays
  are of more than the 4 KiB zipfile reads at once."""
  rng = np.random.default_rng(0)
  flat = {
      'original': {'embedding/kernel': (8, 8, 3, 32), 'Transformer/encoder_norm/scale': (2048,)},
      'big_vision': {
          'params/img/embedding/kernel': (192, 32),
          'params/img/pos_embedding': (8, 8, 32),
      },
      'bit': {'resnet/root_block/standardized_conv2d/kernel': (7, 7, 3, 64)},
  }[layout]
  path = tmp_path / 'model.npz'
  np.savez(path, **{k: rng.standard_normal(shape).astype(np.float32) for k, shape in flat.items()})
  whole = jax.tree.map(np.shape, npz_files.load_npz(str(path)))
  data = bytearray(path.read_bytes())
  with zipfile.ZipFile(path) as archive:
    for info in archive.infolist():  # The last byte of each array's data (np.savez stores them).
      local = info.header_offset
      names, extra = struct.unpack('<HH', data[local + 26 : local + 30])
      data[local + 30 + names + extra + info.compress_size - 1] ^= 0xFF
  path.write_bytes(bytes(data))
  with pytest.raises(zipfile.BadZipFile, match='CRC'):
    npz_files.load_npz(str(path))
  shapes = npz_files.load_npz(str(path), shapes_only=True)
  assert jax.tree.map(np.shape, shapes) == whole
  assert {leaf.dtype for leaf in jax.tree.leaves(shapes)} == {np.dtype(np.float32)}


def test_load_npz_errors_name_the_file_and_the_fix(tmp_path):
  missing = str(tmp_path / 'ViT-B_16.npz')
  with pytest.raises(
      ValueError, match=f"no checkpoint file at '{missing}': download it.*init_from"
  ):
    npz_files.load_npz(missing)
  (tmp_path / 'notes.txt').write_text('not an npz')
  with pytest.raises(ValueError, match=r"notes.txt' is not an .npz file.*--config.init_from"):
    npz_files.load_npz(str(tmp_path / 'notes.txt'))
  assert not zipfile.is_zipfile(tmp_path / 'notes.txt')


# Fitting a loaded tree to a model.


@pytest.mark.parametrize('classifier,prefix', [('token', 1), ('gap', 0)])
def test_adapt_params_resizes_posemb_and_zeroes_a_new_head(classifier, prefix):
  loaded = helpers.random_params(_model(num_classes=1000, classifier=classifier), 16)  # 4x4 grid.
  target = adapting.param_shapes(
      _model(num_classes=7, classifier=classifier), 24
  )  # 6x6 grid, 7 classes.
  params, notes = adapting.adapt_params(loaded, target, keep_head=False, keep_pre_logits=False)
  chex.assert_trees_all_equal_shapes(params, target)
  assert notes == [
      'replaced head (32, 1000) with zeros (32, 7)',
      'resized pos_embedding 4x4 -> 6x6 (bilinear)',
  ]
  assert not np.any(params['head']['kernel']) and not np.any(params['head']['bias'])
  posemb = loaded['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(
      params['Transformer']['posembed_input']['pos_embedding'],
      posemb_resizing.interpolate_posemb(posemb, (6, 6), num_prefix_tokens=prefix),
  )
  del params['head'], params['Transformer']['posembed_input'], loaded['head']
  del loaded['Transformer']['posembed_input']
  chex.assert_trees_all_equal(params, loaded)  # Everything else as loaded.


def test_adapt_params_keeps_a_matching_head_and_drops_pre_logits():
  loaded = helpers.random_params(_model(representation_size=16), 8)
  params, notes = adapting.adapt_params(
      loaded, adapting.param_shapes(_model(), 8), keep_head=False, keep_pre_logits=False
  )
  assert notes == ['dropped pre_logits (32, 16)', 'replaced head (16, 10) with zeros (32, 10)']
  loaded = helpers.random_params(_model(), 8)
  params, notes = adapting.adapt_params(
      loaded, adapting.param_shapes(_model(), 8), keep_head=True, keep_pre_logits=False
  )
  assert notes == []
  chex.assert_trees_all_equal(params, loaded)


def test_adapt_params_drops_a_head_the_model_lacks_and_adds_one_the_checkpoint_lacks():
  params, notes = adapting.adapt_params(
      helpers.random_params(_model(), 8),
      adapting.param_shapes(_model(None), 8),
      keep_head=True,
      keep_pre_logits=False,
  )
  assert 'head' not in params and notes == ['dropped head (32, 10): the model has none']
  params, notes = adapting.adapt_params(
      helpers.random_params(_model(None), 8),
      adapting.param_shapes(_model(4), 8),
      keep_head=False,
      keep_pre_logits=False,
  )
  assert params['head']['kernel'].shape == (32, 4) and notes == ['added a zero head (32, 4)']


def test_adapt_params_keeps_pre_logits_when_asked_and_the_model_has_them():
  loaded = helpers.random_params(_model(representation_size=16), 8)
  target = adapting.param_shapes(_model(num_classes=3, representation_size=16), 8)
  params, notes = adapting.adapt_params(loaded, target, keep_head=False, keep_pre_logits=True)
  chex.assert_trees_all_equal(params['pre_logits'], loaded['pre_logits'])
  assert notes == ['replaced head (16, 10) with zeros (16, 3)']


@pytest.mark.parametrize('keep_pre_logits', [False, True])
def test_keep_head_refuses_to_drop_the_pre_logits_layer_its_head_reads(keep_pre_logits):
  # A pre-logits layer as wide as the encoder (ViT-B's 768): without the refusal the head would fit and
  # read the pooled features instead of tanh(pre_logits(...)), silently other logits.
  loaded = helpers.random_params(_model(representation_size=32), 8)
  with pytest.raises(
      ValueError,
      match=r'^pre_logits/kernel: checkpoint \(32, 32\) vs model none: keep_head '
      r"keeps a head that reads the checkpoint's pre-logits layer; set "
      r'--config.keep_pre_logits=True and --config.model.representation_size=32',
  ) as error:
    adapting.adapt_params(
        loaded, adapting.param_shapes(_model(), 8), keep_head=True, keep_pre_logits=keep_pre_logits
    )
  assert '\n' not in str(error.value)
  # Kept together, they compute the checkpoint's logits; a new head may drop them.
  model = _model(representation_size=32)
  params, _ = adapting.adapt_params(
      loaded, adapting.param_shapes(model, 8), keep_head=True, keep_pre_logits=True
  )
  images = np.random.RandomState(0).uniform(-1, 1, (2, 8, 8, 3)).astype(np.float32)
  np.testing.assert_array_equal(
      model.apply({'params': params}, images), model.apply({'params': loaded}, images)
  )
  _, notes = adapting.adapt_params(
      loaded, adapting.param_shapes(_model(), 8), keep_head=False, keep_pre_logits=False
  )
  assert notes == ['dropped pre_logits (32, 32)', 'replaced head (32, 10) with zeros (32, 10)']


def test_a_new_head_may_normalise_on_the_other_side_of_its_pooling():
  """MAE's and BEiT's fine-tuning of a class-token backbone: the patches' mean, normalised after the
  pooling by a new LayerNorm (timm drops the checkpoint's `norm` and starts `fc_norm` at 1 and 0).
  """
  loaded = helpers.random_params(_model(), 8)
  target = adapting.param_shapes(_model(classifier='gap', class_token=True, fc_norm=True), 8)
  params, notes = adapting.adapt_params(loaded, target, keep_head=False, keep_pre_logits=False)
  chex.assert_trees_all_equal_shapes(params, target)
  assert notes == [
      'replaced head (32, 10) with zeros (32, 10)',
      'replaced Transformer/encoder_norm with a new fc_norm (scale 1, bias 0): the model '
      'normalises after its pooling',
  ]
  np.testing.assert_array_equal(params['fc_norm']['scale'], np.ones(32))
  np.testing.assert_array_equal(params['fc_norm']['bias'], np.zeros(32))
  del params['head'], params['fc_norm'], loaded['head'], loaded['Transformer']['encoder_norm']
  chex.assert_trees_all_equal(params, loaded)  # The class token and the blocks as loaded.
  # And back: a checkpoint with fc_norm under a model that normalises before its pooling.
  params, notes = adapting.adapt_params(
      helpers.random_params(_model(classifier='gap', fc_norm=True), 8),
      adapting.param_shapes(_model(classifier='gap'), 8),
      keep_head=False,
      keep_pre_logits=False,
  )
  assert notes[1].startswith('replaced fc_norm with a new Transformer/encoder_norm (scale 1')
  np.testing.assert_array_equal(params['Transformer']['encoder_norm']['scale'], np.ones(32))
  # A kept head reads the checkpoint's normalised features: the config must keep them.
  with pytest.raises(
      ValueError,
      match=r'^Transformer/encoder_norm/bias: checkpoint \(32,\) vs model none: the checkpoint '
      r'normalises before its pooling; set --config.model.fc_norm=False, or '
      r'--config.keep_head=False',
  ):
    adapting.adapt_params(
        helpers.random_params(_model(), 8), target, keep_head=True, keep_pre_logits=False
    )
  with pytest.raises(
      ValueError,
      match=r'^Transformer/encoder_norm/bias: checkpoint none vs model \(32,\): the checkpoint '
      r'normalises after its pooling; set --config.model.fc_norm=True',
  ):
    adapting.adapt_params(
        helpers.random_params(_model(classifier='gap', fc_norm=True), 8),
        adapting.param_shapes(_model(classifier='gap'), 8),
        keep_head=True,
        keep_pre_logits=False,
    )


def test_a_new_head_may_add_or_drop_the_final_layernorm():
  """InternViT's and RADIO's checkpoints have none (model.final_norm=False)."""
  bare = helpers.random_params(_model(final_norm=False), 8)
  assert 'encoder_norm' not in bare['Transformer']
  params, notes = adapting.adapt_params(
      bare, adapting.param_shapes(_model(), 8), keep_head=False, keep_pre_logits=False
  )
  assert notes[1] == (
      'added a new Transformer/encoder_norm (scale 1, bias 0): the checkpoint has no final LayerNorm'
  )
  np.testing.assert_array_equal(params['Transformer']['encoder_norm']['bias'], np.zeros(32))
  with pytest.raises(
      ValueError,
      match=r'^Transformer/encoder_norm/bias: checkpoint none vs model \(32,\): the checkpoint has '
      r'no final LayerNorm; set --config.model.final_norm=False, or --config.keep_head=False',
  ):
    adapting.adapt_params(
        bare, adapting.param_shapes(_model(), 8), keep_head=True, keep_pre_logits=False
    )
  params, notes = adapting.adapt_params(
      helpers.random_params(_model(), 8),
      adapting.param_shapes(_model(final_norm=False), 8),
      keep_head=False,
      keep_pre_logits=False,
  )
  assert 'encoder_norm' not in params['Transformer']
  assert notes[1] == 'dropped Transformer/encoder_norm: the model has no final LayerNorm'
  with pytest.raises(
      ValueError,
      match=r'normalises before its pooling; set --config.model.fc_norm=False and final_norm=True',
  ):
    adapting.adapt_params(
        helpers.random_params(_model(), 8),
        adapting.param_shapes(_model(final_norm=False), 8),
        keep_head=True,
        keep_pre_logits=False,
    )


@pytest.mark.parametrize('norm_layer,other', [('rmsnorm', 'layernorm'), ('layernorm', 'rmsnorm')])
def test_another_kind_of_norm_names_model_norm_layer(norm_layer, other):
  """RMSNorms (AIMv2's) have a scale and no bias: the first norm that differs names the field."""
  with pytest.raises(
      ValueError,
      match=rf'^Transformer/encoder_norm/bias: .*; set --config.model.norm_layer={norm_layer}$',
  ):
    adapting.adapt_params(
        helpers.random_params(_model(norm_layer=norm_layer), 8),
        adapting.param_shapes(_model(norm_layer=other), 8),
        keep_head=True,
        keep_pre_logits=False,
    )
  with pytest.raises(ValueError, match=r'^embedding_norm/.*; set --config.model.embed_norm=True$'):
    adapting.adapt_params(
        helpers.random_params(_model(norm_layer=norm_layer, embed_norm=True), 8),
        adapting.param_shapes(_model(norm_layer=norm_layer), 8),
        keep_head=True,
        keep_pre_logits=False,
    )


def test_a_map_head_of_another_mlp_width_names_model_map_mlp_dim():
  """The MLP's bias comes before its kernel: either names the field, with the checkpoint's width."""
  with pytest.raises(
      ValueError,
      match=r'^MAPHead_0/MlpBlock_0/Dense_0/bias: checkpoint \(48,\) vs model \(64,\): the '
      r"checkpoint's MAP head has an MLP of 48 units; set --config.model.map_mlp_dim=48$",
  ):
    adapting.adapt_params(
        helpers.random_params(_model(classifier='map', map_mlp_dim=48), 8),
        adapting.param_shapes(_model(classifier='map'), 8),
        keep_head=True,
        keep_pre_logits=False,
    )


def test_learned_rotary_frequencies_name_model_rope_style():
  mixed, axial = (
      _model(rope=True, rope_style=style, posemb='none') for style in ('rope_mixed', 'rope_vit')
  )
  for loaded, target, message in (
      (
          mixed,
          axial,
          r'learns .* frequencies \(RoPE-Mixed.s\); set --config.model.rope=True and '
          r'rope_style=rope_mixed$',
      ),
      (axial, mixed, r'has no learned rotary frequencies; set --config.model.rope_style to its'),
  ):
    with pytest.raises(
        ValueError,
        match=r'^Transformer/encoderblock_0/rope_freqs: checkpoint .* the checkpoint ' + message,
    ):
      adapting.adapt_params(
          helpers.random_params(loaded, 8),
          adapting.param_shapes(target, 8),
          keep_head=True,
          keep_pre_logits=False,
      )


def test_a_new_head_drops_the_checkpoints_attention_pooling():
  loaded = helpers.random_params(_model(classifier='map'), 8)
  params, notes = adapting.adapt_params(
      loaded,
      adapting.param_shapes(_model(classifier='gap'), 8),
      keep_head=False,
      keep_pre_logits=False,
  )
  assert 'MAPHead_0' not in params
  assert notes[1] == 'dropped MAPHead_0 (attention pooling): the model pools otherwise'
  with pytest.raises(ValueError, match=r'^MAPHead_0/.*pools by attention; set .*classifier=map'):
    adapting.adapt_params(
        loaded,
        adapting.param_shapes(_model(classifier='gap', num_classes=10), 8),
        keep_head=True,
        keep_pre_logits=False,
    )
  # A new MAP head is drawn by the caller; without one to draw, or with the head kept, it is an error.
  mapped = _model(classifier='map')
  drawn = helpers.random_params(mapped, 8)['MAPHead_0']
  params, notes = adapting.adapt_params(
      helpers.random_params(_model(classifier='gap'), 8),
      adapting.param_shapes(mapped, 8),
      keep_head=False,
      keep_pre_logits=False,
      draw_map_head=lambda: drawn,
  )
  chex.assert_trees_all_equal(params['MAPHead_0'], drawn)
  assert notes[1] == 'drew a new MAPHead_0 (attention pooling) as from scratch'
  for keep_head, draw in ((False, None), (True, lambda: drawn)):
    with pytest.raises(ValueError, match=r'^MAPHead_0/.*no MAP head; set --config.keep_head=False'):
      adapting.adapt_params(
          helpers.random_params(_model(classifier='gap'), 8),
          adapting.param_shapes(mapped, 8),
          keep_head=keep_head,
          keep_pre_logits=False,
          draw_map_head=draw,
      )


@pytest.mark.parametrize(
    'loaded_model,image_size,target_model,kwargs,message',
    [
        # Another width: the parameters that tell architectures apart most plainly come first
        # (another patch size is resampled: test_patch_embedding.py).
        (
            dict(),
            16,
            dict(hidden_size=64),
            {},
            r'^cls: checkpoint \(1, 1, 32\) vs model \(1, 1, 64\): the checkpoint is '
            r'another architecture; set --config.variant',
        ),
        (
            dict(num_layers=3),
            8,
            dict(),
            {},
            r'^Transformer/encoderblock_2/LayerNorm_0/bias: checkpoint \(32,\) vs model none',
        ),
        (
            dict(num_layers=1),
            8,
            dict(),
            {},
            r'^Transformer/encoderblock_1/LayerNorm_0/bias: checkpoint none vs model \(32,\)',
        ),
        (
            dict(classifier='gap'),
            8,
            dict(),
            {},
            r'^cls: checkpoint none vs model \(1, 1, 32\): the checkpoint has no class token to '
            r'pool; set --config.model.classifier=gap \(or map\) and class_token=False$',
        ),
        (
            dict(),
            8,
            dict(classifier='gap'),
            {},
            r'^cls: checkpoint \(1, 1, 32\) vs model none: .*--config.model.class_token=True',
        ),
        (
            dict(num_classes=1000),
            8,
            dict(),
            {'keep_head': True},
            r'^head/kernel: checkpoint \(32, 1000\) vs model \(32, 10\).*--config.keep_head=False',
        ),
        (
            dict(),
            8,
            dict(representation_size=16),
            {},
            r'^pre_logits/kernel: checkpoint none vs model \(32, 16\).*keep_pre_logits=True.*'
            r'representation_size=None',
        ),
    ],
)
def test_adapt_params_mismatch_is_a_one_line_error(
    loaded_model, image_size, target_model, kwargs, message
):
  loaded = helpers.random_params(_model(**loaded_model), image_size)
  kwargs = {'keep_head': False, 'keep_pre_logits': False, **kwargs}
  with pytest.raises(ValueError, match=message) as error:
    adapting.adapt_params(loaded, adapting.param_shapes(_model(**target_model), 16), **kwargs)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize(
    'loaded_model, target_model, message',
    [
        (dict(), dict(), r'the checkpoint has none: set --config\.keep_pre_logits=False$'),
        (
            dict(representation_size=16),
            dict(),
            r'the model has none: add it with --config\.model\.representation_size=16$',
        ),
    ],
)
def test_keep_pre_logits_without_a_layer_to_keep_is_a_one_line_error(
    loaded_model, target_model, message
):
  """It did nothing: the checkpoint's layer dropped, or none to keep."""
  loaded = helpers.random_params(_model(**loaded_model), 8)
  with pytest.raises(ValueError, match=r'^config\.keep_pre_logits=True keeps .*' + message):
    adapting.adapt_params(
        loaded,
        adapting.param_shapes(_model(**target_model), 8),
        keep_head=False,
        keep_pre_logits=True,
    )


def test_adapt_params_rejects_an_unknown_interpolation_even_without_resizing():
  with pytest.raises(
      ValueError,
      match=r"Unknown config.posemb_interpolation 'nearest'.*"
      r'--config.posemb_interpolation=bilinear',
  ):
    adapting.adapt_params(
        helpers.random_params(_model(), 8),
        adapting.param_shapes(_model(), 8),
        keep_head=True,
        keep_pre_logits=False,
        posemb_method='nearest',
    )


def test_adapt_params_rejects_a_posemb_that_is_not_a_square_grid():
  loaded = helpers.random_params(_model(), 8)
  loaded['Transformer']['posembed_input']['pos_embedding'] = np.zeros((1, 7, 32), np.float32)
  with pytest.raises(
      ValueError,
      match=r'^Transformer/posembed_input/pos_embedding: checkpoint '
      r'\(1, 7, 32\) vs model \(1, 17, 32\): the checkpoint is another architecture',
  ):
    adapting.adapt_params(
        loaded, adapting.param_shapes(_model(), 16), keep_head=True, keep_pre_logits=False
    )


def test_find_checkpoint_of_a_workdir_without_one_is_a_clear_error(tmp_path):
  (tmp_path / 'checkpoints').mkdir()
  with pytest.raises(ValueError, match=r'holds no checkpoint yet: train first'):
    saved_state.find_checkpoint(str(tmp_path))
