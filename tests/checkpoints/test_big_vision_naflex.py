"""SigLIP 2's NaFlex towers (big_vision's `*_naflex.npz`) through config.init_from with
config.variant='checkpoint': random tiny trees of big_vision's own NaFlex ViT (big_vision_naflex.py),
whose outputs on square images of its patches ours must be, at its position embeddings' grid and,
with posemb_interpolation=bilinear_antialiased, at the grids of other resolutions."""

import jax
import numpy as np
import pytest
from flax import traverse_util

import helpers
from big_vision_naflex import NaFlexViT, patchify
from vit_jax.train import setup

PATCH, WIDTH, HEADS, MLP, DEPTH, CLASSES, NPOSEMB = 4, 32, 2, 64, 2, 10, 6
SIZE = PATCH * NPOSEMB  # The grid of its position embeddings: NaFlex resizes nothing there.


def _reference(pool_type: str = 'map', patchln_post: bool = False) -> tuple[NaFlexViT, dict]:
  """big_vision's NaFlex ViT and random parameters: every one drawn (zeros or ones would hide a
  layout bug), LayerNorm scales near 1."""
  model = NaFlexViT(
      num_classes=CLASSES,
      width=WIDTH,
      depth=DEPTH,
      mlp_dim=MLP,
      num_heads=HEADS,
      pool_type=pool_type,
      nposemb=NPOSEMB,
      patchln_post=patchln_post,
  )
  inputs = tuple(x[None] for x in patchify(np.zeros((SIZE, SIZE, 3), np.float32), PATCH))
  shapes = jax.eval_shape(model.init, jax.random.key(0), inputs)['params']
  rng = np.random.default_rng(0)
  flat = {}
  for key, leaf in traverse_util.flatten_dict(shapes).items():
    noise = 0.3 * rng.standard_normal(leaf.shape).astype(np.float32)
    flat[key] = 1 + noise if key[-1] == 'scale' else noise
  return model, traverse_util.unflatten_dict(flat)


def _saved(path, params: dict, scan: bool = False) -> str:
  """A two-tower SigLIP 2 file as big_vision writes it: the image tower under `img/`, blocks per
  layer or stacked by `scan=True`, beside a text tower and the logit scale and bias."""
  flat = traverse_util.flatten_dict(params, sep='/')
  if scan:
    blocks = [k for k in flat if k.startswith('Transformer/encoderblock_0/')]
    for key in blocks:
      rest = key[len('Transformer/encoderblock_0/') :]
      layers = [flat.pop(f'Transformer/encoderblock_{i}/{rest}') for i in range(DEPTH)]
      flat[f'Transformer/encoderblock/{rest}'] = np.stack(layers)
  tree = {f'params/img/{k}': np.asarray(v) for k, v in flat.items()}
  tree.update({'params/txt/Embed_0/embedding': np.zeros((7, WIDTH)), 'params/t': np.ones(1)})
  np.savez(path, **tree)
  return str(path)


def _images(size: int) -> np.ndarray:
  return np.random.RandomState(1).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)


def _references(model: NaFlexViT, params: dict, images: np.ndarray) -> np.ndarray:
  inputs = [patchify(image, PATCH) for image in images]
  batch = tuple(np.stack(parts) for parts in zip(*inputs))
  return np.asarray(model.apply({'params': params}, batch))


def _prepared(workdir, init_from: str, size: int, **overrides) -> setup.Setup:
  config = helpers.load_config(
      'demo',
      {
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': init_from,
          'image_size': size,
          'keep_head': True,
          **overrides,
      },
  )
  return setup.prepare(config, str(workdir))


def _ours(run: setup.Setup, images: np.ndarray) -> np.ndarray:
  return np.asarray(run.model.apply({'params': run.init_params}, images))


@pytest.mark.parametrize(
    'pool_type,scan,patchln_post',
    [('map', False, False), ('map', True, True), ('gap', True, False)],
)
def test_a_naflex_tower_is_the_vit_it_computes_on_square_images(
    tmp_path, pool_type, scan, patchln_post
):
  model, params = _reference(pool_type, patchln_post)
  path = _saved(tmp_path / 'naflex.npz', params, scan)
  run = _prepared(tmp_path / 'workdir', path, SIZE)
  expected = {
      'patch_size': PATCH,
      'hidden_size': WIDTH,
      'num_layers': DEPTH,
      'num_heads': HEADS,
      'mlp_dim': MLP,
      'class_token': False,
      'classifier': pool_type,
      'embed_norm': patchln_post,
      'posemb': 'learn',
      'mlp_activation': 'gelu_tanh',
      'layernorm_epsilon': 1e-6,
  }
  assert {field: run.model_config[field] for field in expected} == expected
  images = _images(SIZE)
  np.testing.assert_allclose(_ours(run, images), _references(model, params, images), atol=2e-5)


@pytest.mark.parametrize('size', [4 * PATCH, 9 * PATCH])
def test_at_another_grid_bilinear_antialiased_resizes_as_naflex_does(tmp_path, size):
  model, params = _reference()
  path = _saved(tmp_path / 'naflex.npz', params)
  images = _images(size)
  expected = _references(model, params, images)
  run = _prepared(tmp_path / 'w1', path, size, posemb_interpolation='bilinear_antialiased')
  np.testing.assert_allclose(_ours(run, images), expected, atol=2e-5)
  # The original code's resize (corners aligned) is another function of the same weights.
  run = _prepared(tmp_path / 'w2', path, size)
  assert np.abs(_ours(run, images) - expected).max() > 1e-3


def test_what_vit_jax_does_not_compute_is_one_line(tmp_path):
  _, params = _reference()
  flat = traverse_util.flatten_dict(params, sep='/')
  with_pre = {**flat, 'patchln_pre/scale': np.ones(PATCH * PATCH * 3, np.float32)}
  path = _saved(tmp_path / 'pre.npz', traverse_util.unflatten_dict(with_pre, sep='/'))
  with pytest.raises(ValueError, match='a big_vision NaFlex tower with patchln_pre') as error:
    _prepared(tmp_path / 'workdir', path, SIZE)
  assert '\n' not in str(error.value)
  grey = {**flat, 'embedding/kernel': np.zeros((PATCH * PATCH, WIDTH), np.float32)}
  path = _saved(tmp_path / 'grey.npz', traverse_util.unflatten_dict(grey, sep='/'))
  with pytest.raises(ValueError, match='not the pixels of a square RGB patch') as error:
    _prepared(tmp_path / 'workdir', path, SIZE)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()
