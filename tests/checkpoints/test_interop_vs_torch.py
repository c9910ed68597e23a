"""timm's ViT reads what we write, and we read timm's: the comparisons of test_interop.py with the
torch-based peers, which `make test-all` runs (they need the test extra)."""

import functools

import numpy as np
import pytest
import timm.models.vision_transformer as timm_vit
import torch

import helpers
from vit_jax.checkpoints import adapting, npz_files, patch_resizing, posemb_resizing
from vit_jax.models import variants as model_variants
from test_interop import _model


@pytest.mark.parametrize('old,new,prefix', [(14, 24, 1), (7, 12, 1), (24, 14, 1), (7, 12, 0)])
def test_bicubic_posemb_matches_timms_resample_abs_pos_embed(old, new, prefix):
  from timm.layers import resample_abs_pos_embed  # pylint: disable=g-import-not-at-top

  posemb = np.random.RandomState(3).randn(1, prefix + old * old, 4).astype(np.float32)
  # timm's defaults: bicubic, antialiased (also when growing: PIL's kernel), the prefix kept.
  expected = resample_abs_pos_embed(
      torch.from_numpy(posemb), [new, new], num_prefix_tokens=prefix
  ).numpy()
  resized = posemb_resizing.interpolate_posemb(
      posemb, (new, new), num_prefix_tokens=prefix, method='bicubic'
  )
  np.testing.assert_allclose(resized, expected, atol=1e-5)
  # 'bilinear' is timm's bilinear with the corners aligned and no antialiasing (scipy's zoom).
  expected = resample_abs_pos_embed(
      torch.from_numpy(posemb),
      [new, new],
      num_prefix_tokens=prefix,
      interpolation='bilinear',
      antialias=False,
      align_corners=True,
  ).numpy()
  np.testing.assert_allclose(
      posemb_resizing.interpolate_posemb(posemb, (new, new), num_prefix_tokens=prefix),
      expected,
      atol=1e-5,
  )
  # 'bilinear_antialiased' is timm's bilinear at pixel centres, antialiased (NaFlex's resize).
  expected = resample_abs_pos_embed(
      torch.from_numpy(posemb), [new, new], num_prefix_tokens=prefix, interpolation='bilinear'
  ).numpy()
  resized = posemb_resizing.interpolate_posemb(
      posemb, (new, new), num_prefix_tokens=prefix, method='bilinear_antialiased'
  )
  np.testing.assert_allclose(resized, expected, atol=1e-5)
  # 'bicubic_torch' is torch's bicubic never antialiased (transformers' interpolate_pos_encoding).
  expected = resample_abs_pos_embed(
      torch.from_numpy(posemb), [new, new], num_prefix_tokens=prefix, antialias=False
  ).numpy()
  resized = posemb_resizing.interpolate_posemb(
      posemb, (new, new), num_prefix_tokens=prefix, method='bicubic_torch'
  )
  np.testing.assert_allclose(resized, expected, atol=1e-5)


def _timm_vit(
    classifier: str, num_classes: int, image_size: int, patch_size: int = 4
) -> timm_vit.VisionTransformer:
  """timm's ViT with the dimensions and numerics of ViT-testing_4 (at another `patch_size`)."""
  cfg = model_variants.get_model_config('ViT-testing_4')
  return timm_vit.VisionTransformer(
      img_size=image_size,
      patch_size=patch_size,
      embed_dim=cfg['hidden_size'],
      depth=cfg['num_layers'],
      num_heads=cfg['num_heads'],
      mlp_ratio=cfg['mlp_dim'] / cfg['hidden_size'],
      num_classes=num_classes,
      qkv_bias=True,
      class_token=classifier == 'token',
      global_pool='token' if classifier == 'token' else 'avg',
      fc_norm=False,  # The encoder norm before pooling, as ours; timm's GAP default norms after it.
      act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
      norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
  ).eval()


def timm_to_npz(model: timm_vit.VisionTransformer, path: str) -> None:
  """timm's parameters in the original ViT `.npz` layout: the inverse of timm's `_load_weights`."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  d = model.embed_dim
  heads = model.blocks[0].attn.num_heads
  flat = {
      'embedding/kernel': sd['patch_embed.proj.weight'].transpose(2, 3, 1, 0),
      'embedding/bias': sd['patch_embed.proj.bias'],
      'Transformer/posembed_input/pos_embedding': sd['pos_embed'],
      'Transformer/encoder_norm/scale': sd['norm.weight'],
      'Transformer/encoder_norm/bias': sd['norm.bias'],
      'head/kernel': sd['head.weight'].T,
      'head/bias': sd['head.bias'],
  }
  if 'cls_token' in sd:
    flat['cls'] = sd['cls_token']
  for i in range(len(model.blocks)):
    t, f = f'blocks.{i}.', f'Transformer/encoderblock_{i}/'
    for ln, name in (('norm1', 'LayerNorm_0'), ('norm2', 'LayerNorm_2')):
      flat[f + name + '/scale'], flat[f + name + '/bias'] = (
          sd[t + ln + '.weight'],
          sd[t + ln + '.bias'],
      )
    qkv_w, qkv_b = sd[t + 'attn.qkv.weight'], sd[t + 'attn.qkv.bias']  # (3D, D): rows q, k, v.
    for j, name in enumerate(('query', 'key', 'value')):
      a = f + f'MultiHeadDotProductAttention_1/{name}/'
      flat[a + 'kernel'] = qkv_w[j * d : (j + 1) * d].T.reshape(d, heads, d // heads)
      flat[a + 'bias'] = qkv_b[j * d : (j + 1) * d].reshape(heads, d // heads)
    a = f + 'MultiHeadDotProductAttention_1/out/'
    flat[a + 'kernel'] = sd[t + 'attn.proj.weight'].T.reshape(heads, d // heads, d)
    flat[a + 'bias'] = sd[t + 'attn.proj.bias']
    for r in range(2):
      flat[f + f'MlpBlock_3/Dense_{r}/kernel'] = sd[t + f'mlp.fc{r + 1}.weight'].T
      flat[f + f'MlpBlock_3/Dense_{r}/bias'] = sd[t + f'mlp.fc{r + 1}.bias']
  np.savez(path, **flat)


def _timm_logits(model, images):
  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()  # timm takes NCHW.


def _images(n, size, seed=0):
  return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_timm_reads_our_npz_with_equal_logits(tmp_path, classifier):
  model = _model(num_classes=5, classifier=classifier)
  params = helpers.random_params(model, 12)
  npz_files.save_npz(params, str(tmp_path / 'ours.npz'))
  reference = _timm_vit(classifier, 5, 12)
  reference.load_pretrained(str(tmp_path / 'ours.npz'))
  images = _images(4, 12)
  ours = np.asarray(model.apply({'params': params}, images))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.1  # Logits of substance, not a vacuous match.


@pytest.mark.parametrize('classifier', ['token', 'gap'])
def test_we_read_timm_weights_with_equal_logits(tmp_path, classifier):
  torch.manual_seed(0)
  reference = _timm_vit(classifier, 6, 12)
  with torch.no_grad():  # timm initialises biases, cls and the head to zero: make them count.
    for p in reference.parameters():
      p.add_(0.1 * torch.randn_like(p))
  timm_to_npz(reference, str(tmp_path / 'timm.npz'))
  model = _model(num_classes=6, classifier=classifier)
  params, notes = adapting.adapt_params(
      npz_files.load_npz(str(tmp_path / 'timm.npz')),
      adapting.param_shapes(model, 12),
      keep_head=True,
      keep_pre_logits=False,
  )
  assert notes == []
  images = _images(4, 12, seed=1)
  np.testing.assert_allclose(
      np.asarray(model.apply({'params': params}, images)),
      _timm_logits(reference, images),
      atol=1e-4,
  )


@pytest.mark.parametrize('old,new', [(4, 8), (8, 4), (6, 4), (4, 14), (32, 10)])
@pytest.mark.parametrize(
    'method,interpolation,antialias',
    [
        ('bicubic', 'bicubic', True),  # timm's default.
        # big_vision's FlexiViT: tf.image.resize's bilinear, pixel centres, not antialiased.
        ('bilinear', 'bilinear', False),
        ('bilinear_antialiased', 'bilinear', True),
    ],
)
def test_a_patch_embedding_resampled_as_timms_resample_patch_embed(
    old, new, method, interpolation, antialias
):
  from timm.layers import resample_patch_embed  # pylint: disable=g-import-not-at-top

  kernel = np.random.RandomState(old * new).randn(old, old, 3, 5).astype(np.float32)
  expected = resample_patch_embed(  # timm's [out, in, h, w].
      torch.from_numpy(kernel.transpose(3, 2, 0, 1)),
      [new, new],
      interpolation=interpolation,
      antialias=antialias,
  ).numpy()
  resampled = patch_resizing.resample_kernel(kernel, (new, new), method)
  np.testing.assert_allclose(resampled.transpose(3, 2, 0, 1), expected, atol=2e-5 * old)


@pytest.mark.parametrize('patch_size,image_size', [(8, 24), (2, 12)])
def test_timm_weights_at_another_patch_size_match_timms_own_resampling(
    tmp_path, patch_size, image_size
):
  """A patch-4 ViT at 12 px read into a ViT of another patch size (and grid: 12 px at patch 2 is 6x6)
  gives the logits of timm's model of that patch size loaded by its own checkpoint filter, which
  resamples the patch embedding (resample_patch_embed) and position embeddings, bicubic."""
  torch.manual_seed(0)
  reference = _timm_vit('token', 6, 12)
  with torch.no_grad():
    for p in reference.parameters():
      p.add_(0.1 * torch.randn_like(p))
  timm_to_npz(reference, str(tmp_path / 'timm.npz'))
  resampled = _timm_vit('token', 6, image_size, patch_size)
  resampled.load_state_dict(timm_vit.checkpoint_filter_fn(reference.state_dict(), resampled))
  model = _model(num_classes=6, patch_size=patch_size)
  params, notes = adapting.adapt_params(
      npz_files.load_npz(str(tmp_path / 'timm.npz')),
      adapting.param_shapes(model, image_size),
      keep_head=True,
      keep_pre_logits=False,
      posemb_method='bicubic',
      patch_method='bicubic',
  )
  assert notes[-1] == (
      f'resampled the patch embedding 4x4 -> {patch_size}x{patch_size} pixels (pseudo-inverse, '
      'bicubic)'
  )
  images = _images(4, image_size, seed=2)
  ours = np.asarray(model.apply({'params': params}, images))
  np.testing.assert_allclose(ours, _timm_logits(resampled, images), atol=1e-4)
  assert np.abs(ours).max() > 0.1
