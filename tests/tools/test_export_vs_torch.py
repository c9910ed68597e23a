"""timm reads the exported .npz with our logits: the comparisons of test_export.py with the torch-
based peers, which `make test-all` runs (they need the test extra)."""

import functools
import json
import os

import numpy as np
import timm.models.vision_transformer as timm_vit
import torch

import helpers
from test_export import _images


def test_timm_reads_the_exported_npz_with_equal_logits(trained_tiny_run, exported_tiny_run):
  workdir, exported = trained_tiny_run, exported_tiny_run
  with open(os.path.join(exported, 'config.json')) as f:
    description = json.load(f)
  model = description['model']
  reference = timm_vit.VisionTransformer(
      img_size=description['image_size'],
      patch_size=model['patch_size'],
      embed_dim=model['hidden_size'],
      depth=model['num_layers'],
      num_heads=model['num_heads'],
      mlp_ratio=model['mlp_dim'] / model['hidden_size'],
      num_classes=description['num_classes'],
      qkv_bias=True,
      act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
      norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
  ).eval()
  reference.load_pretrained(os.path.join(exported, 'model.npz'))
  images = _images(6, 8)
  with torch.no_grad():
    theirs = reference(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()  # timm takes NCHW.
  ours = helpers.model_logits(workdir, helpers.checkpoint_params(workdir, 12), images)
  np.testing.assert_allclose(theirs, ours, atol=1e-4)
  assert np.abs(ours).max() > 0.1  # The trained head is not (nearly) zero: a match of substance.
