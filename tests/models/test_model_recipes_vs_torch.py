"""Model recipes (drop path, class token choices, pooling) against timm's ViT: the comparisons of
test_model_recipes.py with the torch-based peers, which `make test-all` runs (they need the test
extra)."""

import functools
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm.models.vision_transformer as timm_vit
import torch

import helpers
from vit_jax.checkpoints import npz_files
from vit_jax.models import encoder
from test_model_recipes import _images, _model

TIMM_POOL = {'token': 'token', 'gap': 'avg', 'map': 'map'}


def _timm(classifier, *, fc_norm=False, num_classes=0, image_size=8, depth=2, drop_path_rate=0.0):
  """timm's ViT with the dimensions and numerics of ViT-testing_4 (num_classes=0: pooled features)."""
  return timm_vit.VisionTransformer(
      img_size=image_size,
      patch_size=4,
      embed_dim=32,
      depth=depth,
      num_heads=2,
      mlp_ratio=2,
      num_classes=num_classes,
      qkv_bias=True,
      class_token=classifier == 'token',
      global_pool=TIMM_POOL[classifier],
      fc_norm=fc_norm,
      drop_path_rate=drop_path_rate,
      act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
      norm_layer=functools.partial(torch.nn.LayerNorm, eps=1e-6),
  ).eval()


def _timm_reading(params, tmp_path, **timm_kwargs):
  """timm's model with our parameters, read by timm's own `.npz` reader (and fc_norm by hand: the
  reader knows the original and big_vision layouts, which have no fc_norm)."""
  npz_files.save_npz(params, str(tmp_path / 'ours.npz'))
  reference = _timm(**timm_kwargs)
  reference.load_pretrained(str(tmp_path / 'ours.npz'))
  if 'fc_norm' in params:
    with torch.no_grad():
      reference.fc_norm.weight.copy_(torch.from_numpy(np.asarray(params['fc_norm']['scale'])))
      reference.fc_norm.bias.copy_(torch.from_numpy(np.asarray(params['fc_norm']['bias'])))
  return reference


def _timm_out(model, images):
  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()  # timm takes NCHW.


def test_drop_path_rates_are_timm_linspace():
  np.testing.assert_allclose(encoder.drop_path_rates(0.2, 12), np.linspace(0, 0.2, 12))
  reference = _timm('token', depth=5, drop_path_rate=0.4)
  timm_rates = [getattr(b.drop_path1, 'drop_prob', 0.0) for b in reference.blocks]
  np.testing.assert_allclose(encoder.drop_path_rates(0.4, 5), timm_rates, atol=1e-7)


class _Scale(torch.nn.Module):
  """A residual branch kept and scaled by s, or dropped (s = 0): timm's DropPath with its coin fixed."""

  def __init__(self, scale):
    super().__init__()
    self.scale = scale

  def forward(self, x):
    return x * self.scale


@functools.lru_cache()
def _drop_path_case():
  """Random parameters of a 3-block model, 256 images, and timm's features for each of the 16 ways
  to keep or drop the four branches of blocks 1 and 2 (rates 0, 0.25, 0.5: block 0 is never dropped).
  """
  params = helpers.random_params(_model(num_layers=3), 8)
  images = _images(256, 8, seed=3)
  reference = _timm('token', depth=3, drop_path_rate=0.5)
  with tempfile.TemporaryDirectory() as tmp:
    npz_files.save_npz(params, f'{tmp}/params.npz')
    reference.load_pretrained(f'{tmp}/params.npz')
  rates = [0.25, 0.25, 0.5, 0.5]  # Blocks 1 and 2: attention, MLP.
  combos, outputs = [], []
  for keep in np.ndindex(2, 2, 2, 2):
    scales = [k / (1 - r) for k, r in zip(keep, rates)]
    for i, timm_block in enumerate(reference.blocks[1:]):
      timm_block.drop_path1, timm_block.drop_path2 = _Scale(scales[2 * i]), _Scale(
          scales[2 * i + 1]
      )
    combos.append(keep)
    outputs.append(_timm_out(reference, images))
  return params, images, np.array(combos), np.stack(outputs, axis=1)  # [256, 16, D]


@pytest.mark.parametrize(
    'scan,remat',
    [(False, None), (True, None), (False, 'nothing_saveable'), (True, 'nothing_saveable')],
)
def test_drop_path_in_the_model_matches_timm_with_each_branch_kept_or_dropped(scan, remat):
  params, images, combos, references = _drop_path_case()
  model = _model(num_layers=3, drop_path_rate=0.5, scan=scan, remat=remat)
  apply = functools.partial(model.apply, {'params': params}, images, train=True)
  ours = np.asarray(apply(rngs={'dropout': jax.random.key(0)}))
  distance = np.abs(references - ours[:, None]).max(axis=-1)  # [256, 16]
  best = distance.argmin(axis=1)
  assert np.all(distance.min(axis=1) < 1e-4)  # Each sample is one of timm's 16 drop patterns...
  assert np.all(np.sort(distance, axis=1)[:, 1] > 1e-2)  # ...and plainly which one.
  np.testing.assert_allclose(combos[best].mean(axis=0), [0.75, 0.75, 0.5, 0.5], atol=0.12)
  np.testing.assert_array_equal(apply(rngs={'dropout': jax.random.key(0)}), ours)  # Deterministic.


@pytest.mark.parametrize('scan', [False, True])
def test_remat_keeps_the_drop_path_keys_results_and_gradients(scan):
  params, images, _, _ = _drop_path_case()
  images = images[:8]

  def loss_and_grads(remat):
    model = _model(num_layers=3, drop_path_rate=0.5, scan=scan, remat=remat)
    loss = lambda p: jnp.sum(
        model.apply({'params': p}, images, train=True, rngs={'dropout': jax.random.key(5)}) ** 2
    )
    return jax.value_and_grad(loss)(params)

  (loss, grads), (remat_loss, remat_grads) = loss_and_grads(None), loss_and_grads(
      'nothing_saveable'
  )
  np.testing.assert_allclose(remat_loss, loss, rtol=1e-6)
  jax.tree.map(
      functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6), remat_grads, grads
  )


@pytest.mark.parametrize('classifier,fc_norm', [('gap', True), ('map', False), ('map', True)])
def test_pooling_matches_timm_reading_our_weights(tmp_path, classifier, fc_norm):
  model = _model(num_classes=5, classifier=classifier, fc_norm=fc_norm)
  params = helpers.random_params(model, 8)
  reference = _timm_reading(params, tmp_path, classifier=classifier, fc_norm=fc_norm, num_classes=5)
  images = _images(4, 8)
  ours = np.asarray(model.apply({'params': params}, images))
  assert ours.shape == (4, 5) and np.abs(ours).max() > 0.1
  np.testing.assert_allclose(_timm_out(reference, images), ours, atol=1e-4)
  features = _model(classifier=classifier, fc_norm=fc_norm).apply(
      {'params': {k: v for k, v in params.items() if k != 'head'}}, images
  )
  assert features.shape == (4, 32)
