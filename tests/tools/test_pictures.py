"""Attention rollout, attention distances, embedding pictures: the numbers on constructed inputs, the
attention weights against a NumPy computation, and the pictures of a trained run."""

import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.tools import classifiers, introspection, pictures
from vit_jax.models import vit

PICTURES = (
    'attention_rollout.png',
    'attention_rollout_layers.png',
    'position_embeddings.png',
    'embedding_filters.png',
    'attention_distance.png',
)


def _model_and_params(classifier='token', num_layers=11, **fields):
  """A tiny ViT on 12x12 images, 4x4 patches; 11 blocks, so that encoderblock_10 is among them;
  `fields` of the model's."""
  model = vit.VisionTransformer(
      num_classes=10,
      patch_size=4,
      hidden_size=32,
      num_layers=num_layers,
      mlp_dim=64,
      num_heads=2,
      classifier=classifier,
      **fields,
  )
  params = model.init(jax.random.key(0), np.zeros((1, 12, 12, 3)))['params']
  # Spread the query and key weights, so that attention is far from uniform: a comparison of substance.
  params = jax.tree_util.tree_map_with_path(
      lambda path, x: x * 8 if any(getattr(k, 'key', '') in ('query', 'key') for k in path) else x,
      params,
  )
  return model, params


def _numpy_attention_weights(model, params, images):
  """softmax(q kᵀ / sqrt(head_dim)) in NumPy from each block's parameters and attention input (its
  first LayerNorm's output, asked of flax by the test), block by block in numeric order."""
  _, state = model.apply(
      {'params': params},
      images,
      mutable=['intermediates'],
      capture_intermediates=lambda module, method: module.name == 'LayerNorm_0',
  )
  inputs, layers = state['intermediates']['Transformer'], []
  for i in range(model.num_layers):
    x = np.asarray(inputs[f'encoderblock_{i}']['LayerNorm_0']['__call__'][0], np.float64)
    attention = params['Transformer'][f'encoderblock_{i}']['MultiHeadDotProductAttention_1']
    q, k = (
        np.einsum('btd,dhk->bhtk', x, np.asarray(attention[name]['kernel'], np.float64))
        + np.asarray(attention[name]['bias'], np.float64)[:, None]
        for name in ('query', 'key')
    )
    logits = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    layers.append(e / e.sum(axis=-1, keepdims=True))
  return np.stack(layers)


def test_attention_weights_are_those_of_the_model_block_by_block():
  model, params = _model_and_params()
  images = np.random.RandomState(0).uniform(-1, 1, (2, 12, 12, 3)).astype(np.float32)
  ours = introspection.attention_weights(model, params, images)
  assert ours.shape == (11, 2, 2, 10, 10)  # Layers, batch, heads, and 9 patches + the class token.
  expected = _numpy_attention_weights(model, params, images)
  np.testing.assert_allclose(ours, expected, atol=1e-5)
  assert ours.max() > 0.5  # Peaked, not uniform.
  # The blocks differ, so the comparison also checks their order (encoderblock_10 after _9, not _1).
  assert np.abs(expected[10] - expected[1]).max() > 0.1


def test_attention_weights_of_a_model_with_fast_paths():
  """A scanned, rematerialised bfloat16 model with fused attention (which sows nothing) gives the
  weights of the plain float32 one: the tool measures a plain float32 clone."""
  model, params = _model_and_params()
  images = np.random.RandomState(0).uniform(-1, 1, (2, 12, 12, 3)).astype(np.float32)
  fast = model.clone(
      scan=True, remat='nothing_saveable', attention='dot_product_attention', dtype=jnp.bfloat16
  )
  np.testing.assert_allclose(
      introspection.attention_weights(fast, params, images),
      introspection.attention_weights(model, params, images),
      atol=1e-6,
  )


def test_uniform_attention_rolls_out_to_uniform_maps_and_stochastic_rows():
  attention = np.full((4, 3, 10, 10), 0.1)  # 4 layers, 3 heads, class token + 3x3 patches.
  rollout = introspection.attention_rollout(attention)
  np.testing.assert_allclose(rollout.sum(-1), 1.0)
  maps = introspection.rollout_maps(rollout, num_prefix_tokens=1, class_token=True)
  assert maps.shape == (4, 3, 3)
  for heat in maps:
    np.testing.assert_allclose(heat, heat[0, 0])


def test_rollout_is_the_product_of_head_averaged_attention_plus_identity():
  # Two layers of two heads over two tokens.
  first = np.array(
      [[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]]
  )  # Mean: [[.5, .5], [0, 1]].
  second = np.array(
      [[[1.0, 0.0], [0.5, 0.5]], [[1.0, 0.0], [0.5, 0.5]]]
  )  # Mean: [[1, 0], [.5, .5]].
  rollout = introspection.attention_rollout(np.stack([first, second]))
  layer1 = np.array([[0.75, 0.25], [0.0, 1.0]])  # (mean + I) / 2: rows sum to 2 before.
  layer2 = np.array([[1.0, 0.0], [0.25, 0.75]])
  np.testing.assert_allclose(rollout[0], layer1)
  np.testing.assert_allclose(rollout[1], layer2 @ layer1)
  np.testing.assert_allclose(rollout[1], [[0.75, 0.25], [0.1875, 0.8125]])


def test_rollout_maps_read_the_class_token_row_or_for_gap_the_mean_row():
  rollout = np.arange(2 * 5 * 5, dtype=float).reshape(2, 5, 5)
  np.testing.assert_array_equal(
      introspection.rollout_maps(rollout, 1, True), rollout[:, 0, 1:].reshape(2, 2, 2)
  )
  gap = rollout[:, 1:, 1:]  # Four patch tokens, no class token.
  np.testing.assert_array_equal(
      introspection.rollout_maps(gap, 0, False), gap.mean(1).reshape(2, 2, 2)
  )


def test_attention_to_itself_only_is_at_distance_zero():
  attention = np.broadcast_to(np.eye(17), (3, 4, 17, 17))  # Class token + 4x4 patches.
  np.testing.assert_array_equal(
      introspection.mean_attention_distance(attention, 16.0, 1), np.zeros((3, 4))
  )


def test_attention_distances_on_a_2x2_grid():
  uniform = np.full((4, 4), 0.25)
  # From each corner of a 2x2 grid of 4-pixel patches: 0, 4, 4 and 4√2 pixels.
  assert introspection.mean_attention_distance(uniform[None], 4.0, 0) == pytest.approx(
      2 + math.sqrt(2)
  )
  right_neighbour = np.zeros((5, 5))
  right_neighbour[:, 0] = 0.5  # Half on the class token, which has no position: ignored.
  for query, key in ((1, 2), (2, 1), (3, 4), (4, 3), (0, 1)):
    right_neighbour[query, key] = 0.5
  assert introspection.mean_attention_distance(right_neighbour[None], 4.0, 1) == pytest.approx(
      [4.0]
  )
  np.testing.assert_allclose(
      introspection.patch_distances((2, 2), 4.0)[0], [0, 4, 4, 4 * math.sqrt(2)]
  )


def test_position_similarity_is_cosine_similarity_on_the_grid():
  rng = np.random.RandomState(0)
  posemb = rng.normal(size=(1, 1 + 6 * 6, 8))
  posemb[0, 1 + 7] = 3 * posemb[0, 1 + 0]  # Position (1, 1) points as (0, 0) does.
  similarity = introspection.position_similarity(posemb, 1)
  assert similarity.shape == (6, 6, 6, 6)
  np.testing.assert_allclose(similarity[0, 0, 1, 1], 1.0)
  np.testing.assert_allclose(np.einsum('ijij->ij', similarity), 1.0)
  a, b = posemb[0, 1 + 2], posemb[0, 1 + 9]  # Positions (0, 2) and (1, 3).
  np.testing.assert_allclose(similarity[0, 2, 1, 3], a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_the_first_principal_component_is_the_filters_main_direction():
  rng = np.random.RandomState(0)
  direction = rng.normal(size=4 * 4 * 3)
  direction /= np.linalg.norm(direction)
  # 64 filters: multiples of one pattern plus a little noise.
  filters = rng.normal(0, 5, (64, 1)) * direction + rng.normal(0, 0.01, (64, 48))
  components = introspection.embedding_components(filters.T.reshape(4, 4, 3, 64))
  assert components.shape == (28, 4, 4, 3)
  assert abs(components[0].reshape(-1) @ direction) == pytest.approx(1.0, abs=1e-4)


def _assert_pictures(paths):
  for path in paths:
    with Image.open(path) as picture:
      assert picture.format == 'PNG'
      pixels = np.asarray(picture.convert('L'), np.float32)
    assert min(pixels.shape) > 100 and pixels.std() > 10, path  # A picture, not a blank.


def test_pictures_of_a_gap_model(tmp_path):
  model, params = _model_and_params('gap', num_layers=3)
  assert 'cls' not in params
  image = np.random.RandomState(0).randint(0, 256, (30, 20, 3), np.uint8)
  paths = pictures.write_pictures(model, params, image, 12, str(tmp_path))
  assert sorted(paths) == sorted(str(tmp_path / name) for name in PICTURES)
  _assert_pictures(paths)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_pictures_of_a_hybrid(tmp_path):
  """A ResNet stem of stride 8 makes 16 pixels 2 rows of patches: 4 patches and the class token (the
  tool asserts that count); its patch embedding reads features, so no embedding filters."""
  model = vit.VisionTransformer(
      num_classes=10,
      patch_size=1,
      hidden_size=32,
      num_layers=2,
      mlp_dim=64,
      num_heads=2,
      resnet_layers=(1, 1),
      resnet_width_factor=0.5,
  )
  params = model.init(jax.random.key(0), np.zeros((1, 16, 16, 3)))['params']
  assert params['Transformer']['posembed_input']['pos_embedding'].shape[1] == 5
  image = np.random.RandomState(0).randint(0, 256, (30, 20, 3), np.uint8)
  paths = pictures.write_pictures(model, params, image, 16, str(tmp_path))
  assert sorted(paths) == sorted(
      str(tmp_path / name) for name in PICTURES if name != 'embedding_filters.png'
  )


def test_command_line_writes_the_pictures_of_a_run(trained_tiny_run, tmp_path):
  Image.fromarray(np.random.RandomState(0).randint(0, 256, (40, 40), np.uint8)).save(
      tmp_path / 'x.png'
  )
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.pictures',
          f'--workdir={trained_tiny_run}',
          f'--image={tmp_path}/x.png',
          f'--out={tmp_path}/out',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split() == [f'{tmp_path}/out/{name}' for name in PICTURES]
  _assert_pictures(run.stdout.split())


def test_command_line_bad_input_is_one_line(tmp_path):
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.pictures',
          f'--workdir={tmp_path}/nothing',
          f'--image={tmp_path}/x.png',
          f'--out={tmp_path}/out',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  assert run.stderr.strip().splitlines() == [
      f"error: '{tmp_path}/nothing' has no checkpoints/ directory: pass the workdir of a vit_jax run "
      'that has saved a checkpoint'
  ]


def _numpy_probe_attention(model, params, images):
  """[b, tokens]: a MAP head's attention, softmax(q kᵀ / sqrt(head_dim)) of its probe over the
  encoder's output (the head's input, asked of flax by the test), averaged over the heads."""
  _, state = model.apply(
      {'params': params},
      images,
      mutable=['intermediates'],
      capture_intermediates=lambda module, method: module.name == 'Transformer',
  )
  x = np.asarray(state['intermediates']['Transformer']['__call__'][0], np.float64)
  head = params['MAPHead_0']['MultiHeadDotProductAttention_0']
  q = np.einsum(
      'd,dhk->hk',
      np.asarray(params['MAPHead_0']['probe'][0, 0], np.float64),
      np.asarray(head['query']['kernel']),
  ) + np.asarray(head['query']['bias'])
  k = (
      np.einsum('btd,dhk->bhtk', x, np.asarray(head['key']['kernel']))
      + np.asarray(head['key']['bias'])[:, None]
  )
  logits = np.einsum('hk,bhtk->bht', q, k) / math.sqrt(q.shape[-1])
  e = np.exp(logits - logits.max(-1, keepdims=True))
  return (e / e.sum(-1, keepdims=True)).mean(axis=1)


def _drawn_rollout(model, params, tmp_path, monkeypatch):
  """(the maps and query text write_pictures draws of a 12x12 image, the model's input, its rollout)."""
  image = np.random.RandomState(1).randint(0, 256, (12, 12, 3), np.uint8)
  drawn = {}
  monkeypatch.setattr(
      pictures,
      'plot_rollout',
      lambda image, maps, query, path: drawn.update(maps=maps, query=query) or path,
  )
  pictures.write_pictures(model, params, image, 12, str(tmp_path))
  inputs = classifiers.model_input(image, 12)[None]
  rollout = introspection.attention_rollout(
      introspection.attention_weights(model, params, inputs)[:, 0]
  )
  return drawn, inputs, rollout


def test_a_map_models_rollout_is_weighted_by_its_probes_attention(tmp_path, monkeypatch):
  """A MAP model has no class token: its representation is the probe's attention over the encoded
  tokens, so the rollout's rows are weighted by that attention (the mean of heads), not averaged."""
  model, params = _model_and_params('map', num_layers=3)
  drawn, inputs, rollout = _drawn_rollout(model, params, tmp_path, monkeypatch)
  probe = _numpy_probe_attention(model, params, inputs)[0]
  assert np.abs(probe - 1 / 9).max() > 0.01  # Not the mean over the 9 tokens.
  np.testing.assert_allclose(
      drawn['maps'], np.einsum('t,lts->ls', probe, rollout).reshape(3, 3, 3), atol=1e-5
  )
  assert 'MAP' in drawn['query'] and 'GAP' not in drawn['query']
  np.testing.assert_allclose(
      introspection.probe_weights(model, params, inputs)[0], probe, atol=1e-5
  )


@pytest.mark.parametrize('include_prefix', [False, True])
def test_a_map_model_with_a_class_token_weighs_the_tokens_its_probe_attends_to(
    tmp_path, monkeypatch, include_prefix
):
  """The probe attends to the patches alone (the class token weighs nothing in the map) or, with
  map_include_prefix, to the class token too."""
  model, params = _model_and_params(
      'map', num_layers=2, class_token=True, map_include_prefix=include_prefix
  )
  drawn, inputs, rollout = _drawn_rollout(model, params, tmp_path, monkeypatch)
  probe = introspection.probe_weights(model, params, inputs)[0]
  assert probe.shape == (10 if include_prefix else 9,)
  weights = np.concatenate([[0.0], probe]) if not include_prefix else probe
  np.testing.assert_allclose(
      drawn['maps'], np.einsum('t,lts->ls', weights, rollout)[:, 1:].reshape(2, 3, 3), atol=1e-5
  )


def test_a_token_gap_models_rollout_is_half_the_class_tokens_row_half_the_patches_mean(
    tmp_path, monkeypatch
):
  model, params = _model_and_params('token_gap', num_layers=3)
  drawn, _, rollout = _drawn_rollout(model, params, tmp_path, monkeypatch)
  rows = (rollout[:, 0] + rollout[:, 1:].mean(axis=1)) / 2
  np.testing.assert_allclose(drawn['maps'], rows[:, 1:].reshape(3, 3, 3), atol=1e-6)
  assert 'class token and the mean over patches' in drawn['query']


def test_the_pictures_show_the_part_of_the_image_the_eval_crop_keeps(tmp_path, monkeypatch):
  """With pp_eval.crop='central' the model sees the central square of a wide image: the maps cover
  that square, so the pictures show it, not the whole image stretched under them."""
  model, params = _model_and_params(num_layers=2)
  yy, xx = np.mgrid[:30, :90]
  image = np.stack([yy * 8, xx * 2, np.full_like(xx, 128)], -1).astype(np.uint8)
  pp_eval = {'crop': 'central', 'crop_fraction': 0.75}
  shown = []
  monkeypatch.setattr(pictures, 'attended', lambda image, heat: shown.append(image) or image / 255)
  pictures.write_pictures(model, params, image, 12, str(tmp_path), pp_eval)
  # Shorter side 30 -> 16, the central 12 of 16: 30 * 12/16 = 22.5 of the image's 30 rows and columns,
  # rows 3.75 to 26.25, columns 33.75 to 56.25.
  assert len(shown) == 1 + model.num_layers
  for seen in shown:
    assert seen.shape[0] in (22, 23) and seen.shape[1] in (22, 23)
    assert abs(seen[0, 0, 0] / 8 - 3.75) <= 0.5 and abs(seen[0, 0, 1] / 2 - 33.75) <= 0.5
  # What the model was given is that part, resized.
  resized = jax.image.resize(
      jnp.asarray(shown[0], jnp.float32), (12, 12, 3), 'bilinear', antialias=False
  )
  model_input = (classifiers.model_input(image, 12, pp_eval) + 1) * 127.5
  assert np.abs(np.asarray(resized) - model_input).max() < 8  # Up to a pixel's shift at the edges.
  assert pictures.seen_part(image, 12, {'crop': 'resize'}) is image  # 'resize' sees all of it.
