"""Initialisations against timm's ViT: the comparisons of test_inits.py with the torch-based peers,
which `make test-all` runs (they need the test extra)."""

import numpy as np
import pytest
import timm.models.vision_transformer as timm_vit
import torch
from flax import traverse_util

from vit_jax.checkpoints import timm_layout
from test_inits import _fresh_params


def _timm_params() -> dict:
  torch.manual_seed(0)
  reference = timm_vit.VisionTransformer(
      img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10
  )
  tree = timm_layout.from_state_dict(
      {k: v.numpy() for k, v in reference.state_dict().items()}, num_heads=4
  )
  return traverse_util.flatten_dict(tree, sep='/')


def test_timm_scheme_draws_each_parameter_as_timm_does():
  ours, theirs = _fresh_params(**{'model.weight_init': 'timm'}), _timm_params()
  assert ours.keys() == theirs.keys()
  for path, value in ours.items():
    reference = theirs[path]
    assert value.shape == reference.shape, path
    if not reference.any():  # Biases and LayerNorm offsets.
      assert not value.any(), path
      continue
    # Same spread (two sample stds of n values differ by ~1/sqrt(n) relative: 4 of those), same bounds.
    assert np.std(value) == pytest.approx(np.std(reference), rel=4 / np.sqrt(value.size)), path
    assert np.abs(value).max() <= np.abs(reference).max() * 1.3 + 1e-12, path
  assert np.std(ours['head/kernel']) == pytest.approx(0.02, rel=0.15)  # Not zero: random as timm's.
  bound = 1 / np.sqrt(4 * 4 * 3)  # PyTorch's Conv2d default: U(+-1/sqrt(fan_in)), bias too.
  for name in ('embedding/kernel', 'embedding/bias'):
    assert np.abs(ours[name]).max() <= bound and np.abs(ours[name]).max() > 0.8 * bound, name
