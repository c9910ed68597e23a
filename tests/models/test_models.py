"""The ViT family: parameter tree of the original checkpoints, parameter counts, variants, dtypes, and
the errors for inputs that do not fit the model."""

from unittest import mock

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from vit_jax.models import (
    VisionTransformer,
    attention,
    block,
    differential,
    pooling,
    variants,
    vit_variants,
)


def _param_shapes(num_classes=1000, image_size=224, **overrides):
  model = VisionTransformer(
      num_classes=num_classes, **variants.get_model_config('ViT-B_16', overrides)
  )
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))[
      'params'
  ]
  return {'/'.join(k): v.shape for k, v in traverse_util.flatten_dict(shapes).items()}


def test_vit_b16_has_the_paper_parameter_count():
  assert sum(np.prod(s) for s in _param_shapes().values()) == 86_567_656


def test_vit_b16_tree_matches_the_original_checkpoint_layout():
  shapes = _param_shapes(representation_size=768)
  block = 'Transformer/encoderblock_11'
  expected = {
      'embedding/kernel': (16, 16, 3, 768),
      'embedding/bias': (768,),
      'cls': (1, 1, 768),
      'Transformer/posembed_input/pos_embedding': (1, 197, 768),
      f'{block}/LayerNorm_0/scale': (768,),
      f'{block}/LayerNorm_2/bias': (768,),
      f'{block}/MultiHeadDotProductAttention_1/query/kernel': (768, 12, 64),
      f'{block}/MultiHeadDotProductAttention_1/key/bias': (12, 64),
      f'{block}/MultiHeadDotProductAttention_1/value/kernel': (768, 12, 64),
      f'{block}/MultiHeadDotProductAttention_1/out/kernel': (12, 64, 768),
      f'{block}/MultiHeadDotProductAttention_1/out/bias': (768,),
      f'{block}/MlpBlock_3/Dense_0/kernel': (768, 3072),
      f'{block}/MlpBlock_3/Dense_1/kernel': (3072, 768),
      'Transformer/encoder_norm/scale': (768,),
      'pre_logits/kernel': (768, 768),
      'head/kernel': (768, 1000),
      'head/bias': (1000,),
  }
  for name, shape in expected.items():
    assert shapes[name] == shape, name
  assert 'Transformer/encoderblock_12/LayerNorm_0/scale' not in shapes
  # embedding, cls, pos_embedding; 16 per block; encoder_norm, pre_logits, head.
  assert len(shapes) == 2 + 1 + 1 + 12 * 16 + 2 + 2 + 2


@pytest.mark.parametrize(
    'variant,layers,width,mlp,heads',
    [
        ('ViT-Ti_16', 12, 192, 768, 3),
        ('ViT-S_32', 12, 384, 1536, 6),
        ('ViT-B_8', 12, 768, 3072, 12),
        ('ViT-L_16', 24, 1024, 4096, 16),
        ('ViT-H_14', 32, 1280, 5120, 16),
    ],
)
def test_variants_follow_table_1(variant, layers, width, mlp, heads):
  c = variants.get_model_config(variant)
  assert (c['num_layers'], c['hidden_size'], c['mlp_dim'], c['num_heads']) == (
      layers,
      width,
      mlp,
      heads,
  )
  assert c['patch_size'] == int(variant.split('_')[1])


def test_unknown_variant_names_the_choices():
  with pytest.raises(ValueError, match='ViT-B_16'):
    variants.get_model_config('ViT-X_16')
  with pytest.raises(ValueError, match='num_heads'):
    variants.get_model_config('ViT-testing_4', {'num_heads': 3})
  # The attention names are the kernels' registry: one list validates and dispatches.
  with pytest.raises(ValueError, match='use one of xla, dot_product_attention'):
    variants.get_model_config('ViT-testing_4', {'attention': 'flash'})
  assert list(attention.ATTENTION_FNS) == ['xla', 'dot_product_attention']


def _tiny(**kwargs):
  config = variants.get_model_config('ViT-testing_4')
  config.update(kwargs)
  return VisionTransformer(num_classes=5, **config)


def test_gap_has_no_class_token_and_pre_logits_is_tanh():
  model = _tiny(classifier='gap', representation_size=8)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  assert 'cls' not in params
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 16, 32)
  features = VisionTransformer(
      num_classes=None,
      **{
          **variants.get_model_config('ViT-testing_4'),
          'classifier': 'gap',
          'representation_size': 8,
      },
  ).apply({'params': params}, images)
  assert features.shape == (2, 8) and np.all(np.abs(features) < 1)


@pytest.mark.parametrize('scan', [False, True])
def test_layer_scale_multiplies_each_residual_branch_by_a_learned_scale(scan):
  """Per block `ls1` (attention) and `ls2` (MLP) of the width, starting at `layer_scale`: at 1 the
  model computes what the model without them computes; halving the scales changes the logits."""
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  plain = _tiny(scan=scan)
  params = plain.init(jax.random.key(0), images)['params']
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  scaled = _tiny(scan=scan, layer_scale=1.0)
  scaled_params = scaled.init(jax.random.key(0), images)['params']
  block = scaled_params['Transformer']['encoderblock_1']
  assert block['ls1'].shape == block['ls2'].shape == (32,) and np.all(block['ls1'] == 1.0)
  with_scales = jax.tree.map(lambda x: x, params)
  for i in range(2):
    with_scales['Transformer'][f'encoderblock_{i}'].update(ls1=np.ones(32), ls2=np.ones(32))
  expected = plain.apply({'params': params}, images)
  np.testing.assert_allclose(
      scaled.apply({'params': with_scales}, images), expected, rtol=1e-6, atol=1e-6
  )
  halved = jax.tree.map(lambda x: x, with_scales)
  halved['Transformer']['encoderblock_1']['ls2'] = np.full(32, 0.5)
  assert not np.allclose(scaled.apply({'params': halved}, images), expected, atol=1e-3)


@pytest.mark.parametrize('classifier', ['token', 'gap', 'map', 'token_gap'])
def test_register_tokens_follow_the_class_token_and_no_pooling_reads_them(classifier):
  model = _tiny(classifier=classifier, num_registers=3, scan=True)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  prefix = 3 + (classifier in ('token', 'token_gap'))
  assert model.num_prefix_tokens == prefix and params['reg'].shape == (1, 3, 32)
  assert len(np.unique(np.asarray(params['reg'])[0, :, 0])) == 3  # Drawn apart.
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (1, prefix + 16, 32)
  assert model.apply({'params': params}, images).shape == (2, 5)
  tokens = jax.random.normal(jax.random.key(3), (2, prefix + 16, 32))
  if classifier == 'gap':  # The mean of the patches' tokens.
    np.testing.assert_allclose(
        pooling.CLASSIFIERS['gap'](tokens, model), tokens[:, prefix:].mean(axis=1), rtol=1e-6
    )
  if classifier == 'token_gap':  # The class token's, then the patches' mean: [b, 2 D].
    expected = np.concatenate([tokens[:, 0], tokens[:, prefix:].mean(axis=1)], axis=-1)
    np.testing.assert_allclose(pooling.CLASSIFIERS['token_gap'](tokens, model), expected, rtol=1e-6)


def test_the_map_heads_own_heads_and_the_tokens_it_attends_to():
  """map_heads splits the MAP head's attention apart from the blocks'; map_include_prefix lets its
  probe attend to the registers too (timm's Eva; the function against timm's in
  tests/checkpoints)."""
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  model = _tiny(classifier='map', num_registers=2, map_heads=4)
  params = model.init(jax.random.key(0), images)['params']
  attention = params['MAPHead_0']['MultiHeadDotProductAttention_0']
  assert attention['query']['kernel'].shape == (32, 4, 8)
  assert params['Transformer']['encoderblock_0']['MultiHeadDotProductAttention_1']['query'][
      'kernel'
  ].shape == (32, 2, 16)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  patches_only = model.apply({'params': params}, images)
  every_token = _tiny(classifier='map', num_registers=2, map_heads=4, map_include_prefix=True)
  assert not np.allclose(every_token.apply({'params': params}, images), patches_only, atol=1e-4)


def test_the_map_heads_mlp_has_its_own_width():
  """map_mlp_dim (Perception Encoder G's MAP head, narrower than its blocks; timm's function in
  tests/checkpoints); unset, the blocks' mlp_dim."""
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  for width, expected in ((None, 64), (48, 48)):
    params = _tiny(classifier='map', map_mlp_dim=width).init(jax.random.key(0), images)['params']
    assert params['MAPHead_0']['MlpBlock_0']['Dense_0']['kernel'].shape == (32, expected)
    block = params['Transformer']['encoderblock_0']['MlpBlock_3']
    assert block['Dense_0']['kernel'].shape == (32, 64)


def test_token_gap_heads_read_twice_the_width():
  model = _tiny(classifier='token_gap')
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  assert model.num_prefix_tokens == 1 and params['head']['kernel'].shape == (64, 5)
  features = VisionTransformer(
      num_classes=None, **{**variants.get_model_config('ViT-testing_4'), 'classifier': 'token_gap'}
  ).apply({'params': params}, images)
  assert features.shape == (2, 64)


def test_a_gap_model_may_keep_a_class_token_it_does_not_pool():
  model = _tiny(classifier='gap', class_token=True)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  assert model.num_prefix_tokens == 1 and params['cls'].shape == (1, 1, 32)
  assert params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 17, 32)
  tokens = jax.random.normal(jax.random.key(3), (2, 17, 32))
  np.testing.assert_allclose(
      pooling.CLASSIFIERS['gap'](tokens, model), tokens[:, 1:].mean(axis=1), rtol=1e-6
  )
  assert _tiny(classifier='gap').num_prefix_tokens == 0  # Unset: a class token for 'token' only.
  with pytest.raises(ValueError, match=r'Axial-ViT does not take model.class_token=True'):
    variants.get_model_config('Axial-ViT-testing_4', {'class_token': True})


def test_register_tokens_are_refused_by_axial_blocks_and_must_be_whole():
  with pytest.raises(ValueError, match=r'Axial-ViT does not take model.num_registers=2'):
    variants.get_model_config('Axial-ViT-testing_4', {'num_registers': 2})
  with pytest.raises(ValueError, match=r'model.num_registers=-1 must be a whole number'):
    variants.get_model_config('ViT-testing_4', {'num_registers': -1})


def test_pre_norm_normalises_before_the_blocks_and_drops_the_patch_bias():
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = _tiny(pre_norm=True).init(jax.random.key(0), images)['params']
  assert 'bias' not in params['embedding']
  assert params['Transformer']['pre_norm']['scale'].shape == (32,)
  assert 'pre_norm' not in _tiny().init(jax.random.key(0), images)['params']['Transformer']


def test_quick_gelu_is_clips():
  x = np.linspace(-6, 6, 101, dtype=np.float32)
  np.testing.assert_allclose(
      block.MLP_ACTIVATIONS['quick_gelu'](x), x / (1 + np.exp(-1.702 * x)), rtol=1e-6, atol=1e-7
  )


def test_qk_norm_layernorms_each_heads_queries_and_keys_in_every_layout():
  """`q_norm` and `k_norm` per block, over a head's 16 channels and shared by the 2 heads: the
  scanned blocks (stored per block) compute what the unrolled ones do, the axial blocks have them in
  both halves, and the norms change the function."""
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  model = _tiny(qk_norm=True)
  params = model.init(jax.random.key(0), images)['params']
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  for i in range(2):
    norms = params['Transformer'][f'encoderblock_{i}']
    assert norms['q_norm']['scale'].shape == norms['k_norm']['bias'].shape == (16,)
    norms['q_norm']['scale'] = jax.random.uniform(jax.random.key(3 + i), (16,), minval=0.5)
  logits = model.apply({'params': params}, images)
  scanned = _tiny(qk_norm=True, scan=True)
  np.testing.assert_allclose(
      scanned.apply({'params': params}, images), logits, rtol=1e-5, atol=1e-5
  )
  without = {
      **params,
      'Transformer': {
          name: {k: v for k, v in tree.items() if k not in ('q_norm', 'k_norm')}
          for name, tree in params['Transformer'].items()
      },
  }
  assert not np.allclose(_tiny().apply({'params': without}, images), logits, atol=1e-3)
  axial = variants.make_model(
      'Axial-ViT-testing_4', {'qk_norm': True}, num_classes=5, dtype=jnp.float32
  )
  axial_params = axial.init(jax.random.key(0), images)['params']
  assert set(axial_params['Transformer']['encoderblock_0']['row']) >= {'q_norm', 'k_norm'}


def test_a_distilled_model_has_a_second_token_and_head_and_averages_them():
  """DeiT's distillation token `dist` after the class token, read by `head_dist`: the logits are the
  mean of the two heads' (their pair with both_heads), the features the mean of the two tokens'."""
  model = _tiny(distilled=True, num_registers=1)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  assert model.num_prefix_tokens == 3 and params['dist'].shape == (1, 1, 32)
  assert not np.allclose(params['dist'], params['cls'])  # Drawn apart, or the heads would mirror.
  for i, head in enumerate(('head', 'head_dist')):
    params[head]['kernel'] = jax.random.normal(jax.random.key(5 + i), (32, 5))
  first, second = model.apply({'params': params}, images, both_heads=True)
  assert not np.allclose(first, second, atol=1e-3)
  np.testing.assert_allclose(model.apply({'params': params}, images), (first + second) / 2)
  # With both heads equal, a head applied to the features is the two tokens' logits averaged.
  params['head_dist'] = params['head']
  first, second = model.apply({'params': params}, images, both_heads=True)
  features = _tiny(distilled=True, num_registers=1).clone(num_classes=None)
  pooled = features.apply({'params': params}, images)
  np.testing.assert_allclose(
      pooled @ params['head']['kernel'] + params['head']['bias'],
      (first + second) / 2,
      rtol=1e-5,
      atol=1e-5,
  )
  plain = _tiny()
  plain_params = plain.init(jax.random.key(0), images)['params']
  logits = plain.apply({'params': plain_params}, images)
  for each in plain.apply({'params': plain_params}, images, both_heads=True):
    np.testing.assert_array_equal(each, logits)
  with pytest.raises(ValueError, match=r'model.distilled=True .* takes the class token'):
    variants.get_model_config('ViT-testing_4', {'distilled': True, 'classifier': 'gap'})


@pytest.mark.parametrize('scale', [0.0, float('inf'), float('nan')])
def test_layer_scale_must_be_positive_and_finite(scale):
  with pytest.raises(
      ValueError, match=rf'model.layer_scale={scale} must be a positive finite initial scale'
  ):
    variants.get_model_config('ViT-testing_4', {'layer_scale': scale})


def test_zero_head_gives_zero_logits_and_dropout_needs_train():
  model = _tiny(dropout_rate=0.5)
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  np.testing.assert_array_equal(model.apply({'params': params}, images), 0.0)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  eval_logits = model.apply({'params': params}, images)
  np.testing.assert_array_equal(eval_logits, model.apply({'params': params}, images))
  train_logits = model.apply(
      {'params': params}, images, train=True, rngs={'dropout': jax.random.key(3)}
  )
  assert not np.allclose(eval_logits, train_logits)


def test_head_dropout_drops_the_pooled_features_before_the_head_only_in_training():
  # timm's drop_rate: fc_norm -> dropout -> head. An identity head shows the dropped features as logits.
  model = _tiny(num_heads=2, head_dropout_rate=0.5)
  model = model.clone(num_classes=model.hidden_size)
  images = jax.random.normal(jax.random.key(1), (64, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  params['head']['kernel'] = jnp.eye(model.hidden_size)
  features = model.clone(num_classes=None).apply({'params': params}, images, train=True)
  np.testing.assert_array_equal(model.apply({'params': params}, images), features)
  train_logits = np.asarray(
      model.apply({'params': params}, images, train=True, rngs={'dropout': jax.random.key(3)})
  )
  kept = train_logits != 0
  np.testing.assert_allclose(train_logits[kept], 2 * np.asarray(features)[kept], rtol=1e-6)
  assert abs(kept.mean() - 0.5) < 0.05


def test_bfloat16_compute_keeps_float32_params_and_logits():
  model = VisionTransformer(
      num_classes=5, dtype=jnp.bfloat16, **variants.get_model_config('ViT-testing_4')
  )
  images = jax.random.normal(jax.random.key(1), (2, 16, 16, 3))
  params = model.init(jax.random.key(0), images)['params']
  chex.assert_type(jax.tree.leaves(params), jnp.float32)
  params['head']['kernel'] = jax.random.normal(jax.random.key(2), params['head']['kernel'].shape)
  logits = model.apply({'params': params}, images)
  assert logits.dtype == jnp.float32
  reference = _tiny().apply({'params': params}, images)
  np.testing.assert_allclose(logits, reference, atol=0.1, rtol=0.05)


@pytest.mark.parametrize(
    'variant,overrides,stride',
    [
        ('ViT-B_16', {}, 16),
        ('R50+ViT-B_16', {}, 16),
        ('R50+ViT-L_32', {}, 32),
        ('R50+ViT-testing_8', {'resnet_layers': (1, 1)}, 8),
    ],
)
def test_input_stride_counts_the_resnet_stem(variant, overrides, stride):
  config = variants.get_model_config(variant, overrides)
  assert VisionTransformer(num_classes=3, **config).input_stride == stride
  assert vit_variants.input_stride(config) == stride


def test_params_of_another_image_size_are_a_clear_error():
  model = _tiny()
  params = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)))['params']  # 4x4 patches + cls.
  with pytest.raises(
      ValueError,
      match=r'position embeddings \(1, 17, 32\) are for 17 tokens, but the '
      r'images give 37: .*another image size.*adapt_params',
  ):
    model.apply({'params': params}, jnp.zeros((1, 24, 24, 3)))


def test_images_that_do_not_fit_the_model_are_clear_errors():
  model = _tiny()
  with pytest.raises(ValueError, match='images of 18x16 pixels do not divide into patches of 4x4'):
    model.init(jax.random.key(0), jnp.zeros((1, 18, 16, 3)))  # Would drop 2 rows silently.
  for shape in ((16, 16, 3), (1, 16, 16, 1)):
    with pytest.raises(AssertionError, match=r'RGB images \[batch, height, width, 3\]'):
      model.init(jax.random.key(0), jnp.zeros(shape))


def test_res_post_norm_normalises_each_branch_before_its_residual_add():
  """x + LN0(MSA(x)), then x + LN2(MLP(x)), from the same tree as the pre-norm block's; composed
  here from the block's own attention, MLP and norms."""
  fields = dict(mlp_dim=64, num_heads=2, mlp_activation='gelu')
  x = jax.random.normal(jax.random.key(0), (2, 5, 32))
  post = block.Encoder1DBlock(**fields, res_post_norm=True)
  params = post.init(jax.random.key(1), x, True)['params']
  flat = traverse_util.flatten_dict(params, sep='/')
  flat = {k: jax.random.normal(jax.random.key(len(k)), v.shape) for k, v in flat.items()}
  params = traverse_util.unflatten_dict(flat, sep='/')
  pre_tree = block.Encoder1DBlock(**fields).init(jax.random.key(1), x, True)['params']
  chex.assert_trees_all_equal_shapes(params, pre_tree)
  layer_norm = lambda p, v: (
      (v - v.mean(-1, keepdims=True)) / jnp.sqrt(v.var(-1, keepdims=True) + 1e-6) * p['scale']
      + p['bias']
  )
  attention_out = block.SelfAttention(
      num_heads=2, attention_fn=attention.ATTENTION_FNS['xla']
  ).apply({'params': params['MultiHeadDotProductAttention_1']}, x, deterministic=True)
  y = x + layer_norm(params['LayerNorm_0'], attention_out)
  mlp_out = block.MlpBlock(64, activation='gelu').apply(
      {'params': params['MlpBlock_3']}, y, deterministic=True
  )
  expected = y + layer_norm(params['LayerNorm_2'], mlp_out)
  np.testing.assert_allclose(post.apply({'params': params}, x, True), expected, atol=1e-5)
  pre = block.Encoder1DBlock(**fields).apply({'params': params}, x, True)
  assert not np.allclose(pre, expected, atol=1e-3)


@pytest.mark.parametrize('kernel', list(attention.ATTENTION_FNS))
def test_grouped_query_attention_is_numpys_with_each_key_head_shared(kernel):
  """num_kv_heads=2 of 4 heads: query head h attends with key and value head h // 2 (timm's and
  transformers' repeat_interleave), a NumPy formula of the same parameters."""
  x = np.random.RandomState(0).normal(size=(2, 5, 32)).astype(np.float32)
  layer = block.SelfAttention(
      num_heads=4, num_kv_heads=2, attention_fn=attention.ATTENTION_FNS[kernel]
  )
  params = layer.init(jax.random.key(0), x, deterministic=True)['params']
  params = jax.tree.map(lambda v: np.random.RandomState(v.size).normal(size=v.shape), params)
  assert params['key']['kernel'].shape == params['value']['kernel'].shape == (32, 2, 8)
  project = lambda p: np.einsum('bnd,dhk->bnhk', x, p['kernel']) + p['bias']
  q, k, v = (project(params[name]) for name in ('query', 'key', 'value'))
  heads = []
  for h in range(4):
    logits = q[:, :, h] @ k[:, :, h // 2].transpose(0, 2, 1) / np.sqrt(8)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    heads.append((weights / weights.sum(-1, keepdims=True)) @ v[:, :, h // 2])
  expected = np.einsum('bnhk,hkd->bnd', np.stack(heads, 2), params['out']['kernel'])
  expected += params['out']['bias']
  ours = layer.apply({'params': params}, x, deterministic=True)
  np.testing.assert_allclose(ours, expected, rtol=1e-4, atol=1e-4)


def test_scanned_blocks_of_grouped_heads_and_attention_only_layer_scale_are_the_loop():
  """model.num_kv_heads and model.layer_scale_mlp=False: the scanned encoder computes what the
  per-block loop does from the same tree, which has no ls2."""
  fields = dict(num_kv_heads=1, layer_scale=0.5, layer_scale_mlp=False)
  images = jnp.asarray(np.random.RandomState(0).uniform(-1, 1, (2, 16, 16, 3)), jnp.float32)
  loop = VisionTransformer(num_classes=5, **variants.get_model_config('ViT-testing_4', fields))
  params = loop.init(jax.random.key(0), images)['params']
  params = jax.tree.map(lambda v: np.random.RandomState(v.size).normal(size=v.shape) * 0.3, params)
  assert 'ls2' not in params['Transformer']['encoderblock_0']
  scanned = VisionTransformer(
      num_classes=5, **variants.get_model_config('ViT-testing_4', {**fields, 'scan': True})
  )
  np.testing.assert_allclose(
      scanned.apply({'params': params}, images),
      loop.apply({'params': params}, images),
      rtol=1e-5,
      atol=1e-5,
  )


@pytest.mark.parametrize(
    'fields', [{}, {'qk_norm': True}, {'parallel_block': True}, {'remat': 'dots_saveable'}]
)
def test_scanned_blocks_of_differential_attention_are_the_loop(fields):
  """model.diff_attention under model.scan: each scanned block's lambda_init is its index's, so the
  scan computes what the loop does from the same tree (with qk-norms of half a head's width, in
  parallel blocks, rematerialised); a loop whose blocks all had one lambda_init differs."""
  fields = {'diff_attention': True, 'num_layers': 3, **fields}
  images = jnp.asarray(np.random.RandomState(0).uniform(-1, 1, (2, 16, 16, 3)), jnp.float32)
  loop = VisionTransformer(num_classes=5, **variants.get_model_config('ViT-testing_4', fields))
  params = loop.init(jax.random.key(0), images)['params']
  params = jax.tree.map(lambda v: np.random.RandomState(v.size).normal(size=v.shape) * 0.3, params)
  if fields.get('qk_norm'):  # Of each half of a head (timm's DiffAttention's).
    first = params['Transformer']['encoderblock_0']
    head_dim = first['MultiHeadDotProductAttention_1']['query']['kernel'].shape[-1]
    assert first['q_norm']['scale'].shape == (head_dim // 2,)
  scanned = VisionTransformer(
      num_classes=5, **variants.get_model_config('ViT-testing_4', {**fields, 'scan': True})
  )
  looped = loop.apply({'params': params}, images)
  np.testing.assert_allclose(
      scanned.apply({'params': params}, images), looped, rtol=1e-6, atol=1e-6
  )
  with mock.patch.object(differential, 'lambda_init', lambda layer: np.float32(0.2)):
    alike = loop.apply({'params': params}, images)
  assert np.abs(alike - looped).max() > 1e-3


def test_a_parallel_block_adds_attention_and_mlp_of_one_norm():
  """model.parallel_block: x + ls1 * (MSA(LN(x)) + MLP(LN(x))) (ViT-22B's parallel layers),
  composed here from the block's own attention, MLP and norm; no LayerNorm_2, no ls2."""
  fields = dict(mlp_dim=64, num_heads=2, mlp_activation='gelu', layer_scale=0.5)
  x = jax.random.normal(jax.random.key(0), (2, 5, 32))
  parallel = block.Encoder1DBlock(**fields, parallel_block=True)
  params = parallel.init(jax.random.key(1), x, True)['params']
  assert sorted(params) == ['LayerNorm_0', 'MlpBlock_3', 'MultiHeadDotProductAttention_1', 'ls1']
  flat = traverse_util.flatten_dict(params, sep='/')
  params = traverse_util.unflatten_dict(
      {k: jax.random.normal(jax.random.key(len(k)), v.shape) for k, v in flat.items()}, sep='/'
  )
  norm = params['LayerNorm_0']
  y = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-6) * norm['scale']
  y = y + norm['bias']
  attention_out = block.SelfAttention(
      num_heads=2, attention_fn=attention.ATTENTION_FNS['xla']
  ).apply({'params': params['MultiHeadDotProductAttention_1']}, y, deterministic=True)
  mlp_out = block.MlpBlock(64, activation='gelu').apply(
      {'params': params['MlpBlock_3']}, y, deterministic=True
  )
  expected = x + params['ls1'] * (attention_out + mlp_out)
  np.testing.assert_allclose(
      parallel.apply({'params': params}, x, True), expected, rtol=1e-5, atol=1e-5
  )


def test_differential_attention_is_a_difference_of_two_softmax_maps():
  """model.diff_attention: the weights the block sows are A1 - lambda A2 (each row summing to
  1 - lambda), lambda = exp(q1 . k1) - exp(q2 . k2) + lambda_init of its index; both kernels give
  the same heads. Parity with timm's DiffAttention:
  tests/checkpoints/test_timm_architectures_vs_torch.py."""
  x = jax.random.normal(jax.random.key(0), (2, 5, 32))
  outputs = []
  start = differential.lambda_init(3)
  for kernel in attention.ATTENTION_FNS:
    layer = block.SelfAttention(
        num_heads=2, attention_fn=attention.ATTENTION_FNS[kernel], differential=True
    )
    params = layer.init(jax.random.key(1), x, deterministic=True, lambda_init=start)['params']
    assert params['sub_norm']['scale'].shape == params['query']['kernel'].shape[-1:]
    out, state = layer.apply(
        {'params': params},
        x,
        deterministic=True,
        lambda_init=start,
        sow_weights=kernel == 'xla',  # The fused kernel sows none (block.py asks the xla one).
        mutable=['intermediates'],
    )
    outputs.append(out)
    if kernel == 'xla':
      (weights,) = state['intermediates']['attention_weights']  # [b, heads, q, k].
  lambdas = [params[name] for name in differential.LAMBDAS]
  weight = (
      np.exp(np.dot(lambdas[0], lambdas[1]))
      - np.exp(np.dot(lambdas[2], lambdas[3]))
      + 0.8
      - 0.6 * np.exp(-0.9)
  )
  np.testing.assert_allclose(weights.sum(-1), np.full((2, 2, 5), 1 - weight), rtol=1e-5)
  np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5, atol=1e-5)
