"""BiT ResNet-v2 baselines: timm's logits through the published .npz layout both ways, the variants and
their parameter counts, the analytic FLOPs against XLA's, training on any mesh, resume, the tools.

The reference is timm's `resnetv2_*_bit` (PyTorch); the .npz layout is written here from its state dict
by inverting timm's `_load_weights`, independently of vit_jax's converter.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
from flax import traverse_util

from vit_jax.models import bit, loading


def _timm_bit(num_classes: int, seed: int = 0) -> torch.nn.Module:
  """timm's BiT-R50x1 with every parameter random: GroupNorm affines around (1, 0), the head small, the
  kernels at BiT's scale (std 0.01, where weight standardisation's epsilon shows)."""
  torch.manual_seed(seed)
  model = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=num_classes).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.copy_((1.0 if name.endswith('weight') and 'head' not in name else 0.0) + 0.2 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) * (0.05 if name.startswith('head') else 0.01))
  return model


def timm_to_bit_npz(model: torch.nn.Module) -> dict[str, np.ndarray]:
  """timm's ResNetV2 state dict in the published BiT .npz layout: the inverse of timm's
  `_load_weights` (kernels OIHW -> HWIO; stage i block j -> block{i+1}/unit{j+1:02d}; norm/conv 1, 2,
  3 -> a, b, c; the shortcut -> a/proj)."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  hwio = lambda w: w.transpose(2, 3, 1, 0)
  flat = {'resnet/root_block/standardized_conv2d/kernel': hwio(sd.pop('stem.conv.weight')),
          'resnet/group_norm/gamma': sd.pop('norm.weight'), 'resnet/group_norm/beta': sd.pop('norm.bias'),
          'resnet/head/conv2d/kernel': hwio(sd.pop('head.fc.weight')),
          'resnet/head/conv2d/bias': sd.pop('head.fc.bias')}
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
def test_the_published_npz_gives_timms_logits(tmp_path, timm_r50, size):
  np.savez(tmp_path / 'BiT-M-R50x1.npz', **timm_to_bit_npz(timm_r50))
  loaded = loading.load_npz(str(tmp_path / 'BiT-M-R50x1.npz'))
  params, notes = loading.adapt_params(loaded, loading.param_shapes(R50, size), keep_head=True,
                                       keep_pre_logits=False)
  assert notes == []  # Nothing resized at any resolution: a ResNet has no position embeddings.
  images = _images(2, size)
  expected = _timm_logits(timm_r50, images)
  np.testing.assert_allclose(np.asarray(jax.jit(R50.apply)({'params': params}, images)), expected,
                             atol=1e-4)
  assert np.abs(expected).max() > 0.5  # Logits of substance, not a vacuous match.


def test_our_npz_loads_into_timm_with_the_same_logits(tmp_path, timm_r50):
  rng = np.random.RandomState(1)
  params = jax.tree.map(lambda x: (0.01 if x.ndim > 1 else 0.2) * rng.randn(*x.shape).astype(np.float32),
                        loading.param_shapes(R50, 64))
  loading.save_npz(bit.to_bit_npz(params), str(tmp_path / 'ours.npz'))
  with np.load(tmp_path / 'ours.npz') as npz:
    assert set(npz.files) == set(timm_to_bit_npz(timm_r50))
  reference = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=10).eval()
  reference.load_pretrained(str(tmp_path / 'ours.npz'))
  images = _images(2, 64, seed=1)
  ours = np.asarray(jax.jit(R50.apply)({'params': params}, images))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.5
  # And back: the layout round-trips exactly.
  flat = traverse_util.flatten_dict(loading.load_npz(str(tmp_path / 'ours.npz')), sep='/')
  assert all(np.array_equal(flat[k], v) for k, v in traverse_util.flatten_dict(params, sep='/').items())
