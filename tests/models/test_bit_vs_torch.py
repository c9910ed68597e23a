"""The BiT ResNet against timm's ResNetV2: published weights, logits, export: the comparisons of
test_bit.py with the torch-based peers, which `make test-all` runs (they need the test extra)."""

import functools
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
from flax import traverse_util
from timm.layers import StdConv2d
from timm.models.resnetv2 import ResNetV2

import helpers
from vit_jax.checkpoints import warm_start
from vit_jax.tools import classifiers, export
from vit_jax.checkpoints import adapting, npz_files
from vit_jax.models import bit, variants
from test_bit import _NO_VIT, tiny_run  # noqa: F401 (tiny_run: a fixture)


def _timm_bit(num_classes: int, seed: int = 0) -> torch.nn.Module:
  """timm's BiT-R50x1 with every parameter random: GroupNorm affines around (1, 0), the head small, the
  kernels at BiT's scale (std 0.01, where weight standardisation's epsilon shows)."""
  torch.manual_seed(seed)
  model = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=num_classes).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.copy_(
            (1.0 if name.endswith('weight') and 'head' not in name else 0.0)
            + 0.2 * torch.randn_like(p)
        )
      else:
        p.copy_(torch.randn_like(p) * (0.05 if name.startswith('head') else 0.01))
  return model


def timm_to_bit_npz(model: torch.nn.Module) -> dict[str, np.ndarray]:
  """timm's ResNetV2 state dict in the published BiT .npz layout: the inverse of timm's
  `_load_weights` (kernels OIHW -> HWIO; stage i block j -> block{i+1}/unit{j+1:02d}; norm/conv 1, 2,
  3 -> a, b, c; the shortcut -> a/proj)."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  hwio = lambda w: w.transpose(2, 3, 1, 0)
  flat = {
      'resnet/root_block/standardized_conv2d/kernel': hwio(sd.pop('stem.conv.weight')),
      'resnet/group_norm/gamma': sd.pop('norm.weight'),
      'resnet/group_norm/beta': sd.pop('norm.bias'),
      'resnet/head/conv2d/kernel': hwio(sd.pop('head.fc.weight')),
      'resnet/head/conv2d/bias': sd.pop('head.fc.bias'),
  }
  for name, value in sd.items():
    stage, block, rest = re.fullmatch(r'stages\.(\d+)\.blocks\.(\d+)\.(.+)', name).groups()
    unit = f'resnet/block{int(stage) + 1}/unit{int(block) + 1:02d}/'
    if rest == 'downsample.conv.weight':
      flat[unit + 'a/proj/standardized_conv2d/kernel'] = hwio(value)
      continue
    kind, n, param = re.fullmatch(r'(conv|norm)([123])\.(weight|bias)', rest).groups()
    layer = 'abc'[int(n) - 1]
    if kind == 'conv':
      flat[f'{unit}{layer}/standardized_conv2d/kernel'] = hwio(value)
    else:
      flat[f'{unit}{layer}/group_norm/{"gamma" if param == "weight" else "beta"}'] = value
  return flat


def _timm_logits(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()  # timm takes NCHW.


def _images(n: int, size: int, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


R50 = bit.BiT(num_classes=10, resnet_layers=(3, 4, 6, 3))


@pytest.fixture(scope='module')
def timm_r50():
  return _timm_bit(10)


@pytest.mark.parametrize('size', [64, 97])  # 97: odd sizes through every stride.
def test_the_published_npz_gives_timms_logits_through_init_from(tmp_path, timm_r50, size):
  np.savez(tmp_path / 'BiT-M-R50x1.npz', **timm_to_bit_npz(timm_r50))
  config = helpers.load_config(
      'demo',
      {
          'variant': 'BiT-R50x1',
          'image_size': size,
          'keep_head': True,
          'init_from': str(tmp_path / 'BiT-M-R50x1.npz'),
          **_NO_VIT,
      },
  )
  # Nothing is resized at any resolution: a ResNet has no position embeddings.
  params = warm_start.load_init_params(config, R50)
  images = _images(2, size)
  expected = _timm_logits(timm_r50, images)
  np.testing.assert_allclose(
      np.asarray(jax.jit(R50.apply)({'params': params}, images)), expected, atol=1e-4
  )
  assert np.abs(expected).max() > 0.5  # Logits of substance, not a vacuous match.


def test_our_npz_loads_into_timm_with_the_same_logits(tmp_path, timm_r50):
  rng = np.random.RandomState(1)
  params = jax.tree.map(
      lambda x: (0.01 if x.ndim > 1 else 0.2) * rng.randn(*x.shape).astype(np.float32),
      adapting.param_shapes(R50, 64),
  )
  npz_files.save_npz(bit.to_bit_npz(params), str(tmp_path / 'ours.npz'))
  with np.load(tmp_path / 'ours.npz') as npz:
    assert set(npz.files) == set(timm_to_bit_npz(timm_r50))
  reference = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=10).eval()
  reference.load_pretrained(str(tmp_path / 'ours.npz'))
  images = _images(2, 64, seed=1)
  ours = np.asarray(jax.jit(R50.apply)({'params': params}, images))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.5
  # And back: the layout round-trips exactly.
  flat = traverse_util.flatten_dict(npz_files.load_npz(str(tmp_path / 'ours.npz')), sep='/')
  assert all(
      np.array_equal(flat[k], v) for k, v in traverse_util.flatten_dict(params, sep='/').items()
  )


def test_a_new_class_count_gets_a_zero_head_and_nothing_else_changes(tmp_path, timm_r50):
  np.savez(tmp_path / 'BiT-M-R50x1.npz', **timm_to_bit_npz(timm_r50))
  loaded = npz_files.load_npz(str(tmp_path / 'BiT-M-R50x1.npz'))
  target = adapting.param_shapes(bit.BiT(num_classes=3, resnet_layers=(3, 4, 6, 3)), 128)
  params, notes = adapting.adapt_params(loaded, target, keep_head=False, keep_pre_logits=False)
  assert notes == ['replaced head (2048, 10) with zeros (2048, 3)']
  assert not np.any(params['head']['kernel']) and not np.any(params['head']['bias'])
  del params['head'], loaded['head']
  chex.assert_trees_all_equal(params, loaded)


@pytest.mark.parametrize(
    'variant,timm_name',
    [
        ('BiT-R50x1', 'resnetv2_50x1_bit'),
        ('BiT-R101x3', 'resnetv2_101x3_bit'),
        ('BiT-R152x4', 'resnetv2_152x4_bit'),
    ],
)
def test_parameter_counts_are_timms(variant, timm_name):
  reference = timm.create_model(timm_name, pretrained=False, device='meta')  # Shapes only.
  model = variants.make_model(variant, num_classes=1000, dtype=jnp.float32)
  ours = sum(x.size for x in jax.tree.leaves(adapting.param_shapes(model, 224)))
  assert ours == sum(p.numel() for p in reference.parameters())


def test_export_predict_and_timm_agree(tiny_run, tmp_path):
  workdir, _, _ = tiny_run
  description = export.export(workdir, str(tmp_path / 'export'))
  assert description['timm'] == (
      "not written: timm's VisionTransformer needs a ViT variant: BiT-R50x1 " 'is a BiT ResNet'
  )
  images = _images(4, 16, seed=2)
  ours = np.asarray(classifiers.load_run(workdir).logits_fn(images))
  np.testing.assert_allclose(
      np.asarray(classifiers.load_export(str(tmp_path / 'export')).logits_fn(images)),
      ours,
      atol=1e-5,
  )  # The jax.export artefact.
  reference = ResNetV2(
      layers=[1, 1, 1, 1],
      width_factor=0.5,
      num_classes=10,
      stem_type='fixed',
      conv_layer=functools.partial(StdConv2d, eps=1e-8),
  ).eval()  # timm's BiT builder.
  reference.load_pretrained(str(tmp_path / 'export' / 'model.npz'))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.01  # The trained head is no longer zero.
