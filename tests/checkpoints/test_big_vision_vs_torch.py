"""big_vision's ViT checkpoints (.npz) through config.init_from with config.variant='checkpoint':
random tiny trees of big_vision's models/vit.py (SigLIP's two-tower image tower with its blocks
scanned and a MAP head, a class-token ViT and a GAP one per block) and of the original code's
layout, read by timm's own loader of those files (VisionTransformer.load_pretrained), whose logits
ours must be; the fields are read from the tensors alone."""

import ml_dtypes
import numpy as np
import pytest
import timm
import torch

import helpers
from torch_references import prepared_from_checkpoint, torch_outputs
from vit_jax.checkpoints import teacher

SIZE, PATCH, WIDTH, HEADS, MLP, DEPTH, CLASSES = 28, 4, 32, 2, 64, 2, 10
GRID = (SIZE // PATCH) ** 2


def _random(shape, rng, scale: bool = False) -> np.ndarray:
  noise = 0.3 * rng.standard_normal(shape).astype(np.float32)
  return 1 + noise if scale else noise


def _layer_norm(name: str, rng) -> dict:
  return {f'{name}/scale': _random(WIDTH, rng, scale=True), f'{name}/bias': _random(WIDTH, rng)}


def _attention(name: str, rng) -> dict:
  """flax's MultiHeadDotProductAttention: kernels [D, heads, head dim], out [heads, head dim, D]."""
  head_dim = WIDTH // HEADS
  tree = {f'{name}/out/kernel': _random((HEADS, head_dim, WIDTH), rng)}
  tree[f'{name}/out/bias'] = _random(WIDTH, rng)
  for part in ('query', 'key', 'value'):
    tree[f'{name}/{part}/kernel'] = _random((WIDTH, HEADS, head_dim), rng)
    tree[f'{name}/{part}/bias'] = _random((HEADS, head_dim), rng)
  return tree


def _mlp(name: str, rng) -> dict:
  return {
      f'{name}/Dense_0/kernel': _random((WIDTH, MLP), rng),
      f'{name}/Dense_0/bias': _random(MLP, rng),
      f'{name}/Dense_1/kernel': _random((MLP, WIDTH), rng),
      f'{name}/Dense_1/bias': _random(WIDTH, rng),
  }


def _block(rng, original: bool) -> dict:
  """An Encoder1DBlock's tree: big_vision's module names, or the original code's."""
  attention, norm, mlp = ('_1', '_2', '_3') if original else ('_0', '_1', '_0')
  return {
      **_layer_norm('LayerNorm_0', rng),
      **_attention(f'MultiHeadDotProductAttention{attention}', rng),
      **_layer_norm(f'LayerNorm{norm}', rng),
      **_mlp(f'MlpBlock{mlp}', rng),
  }


def _tree(pool: str, scan: bool = False, original: bool = False, seed: int = 0) -> dict:
  """A flat tree of a big_vision `_Model` (or the original code's ViT) of `pool` ('map', 'tok',
  'gap'), its blocks scanned (stacked in `encoderblock`) or per block."""
  rng = np.random.default_rng(seed)
  tree = {
      'embedding/kernel': _random((PATCH, PATCH, 3, WIDTH), rng),
      'embedding/bias': _random(WIDTH, rng),
      **_layer_norm('Transformer/encoder_norm', rng),
      'head/kernel': _random((WIDTH, CLASSES), rng),
      'head/bias': _random(CLASSES, rng),
  }
  blocks = [_block(rng, original) for _ in range(DEPTH)]
  if scan:
    tree.update(
        {f'Transformer/encoderblock/{k}': np.stack([b[k] for b in blocks]) for k in blocks[0]}
    )
  else:
    for i, block in enumerate(blocks):
      tree.update({f'Transformer/encoderblock_{i}/{k}': v for k, v in block.items()})
  if pool == 'tok':
    tree['cls'] = _random((1, 1, WIDTH), rng)
  if original:  # The class token's row first.
    tree['Transformer/posembed_input/pos_embedding'] = _random((1, GRID + 1, WIDTH), rng)
  else:
    tree['pos_embedding'] = _random((1, GRID, WIDTH), rng)
  if pool == 'map':
    tree.update(
        {
            'MAPHead_0/probe': _random((1, 1, WIDTH), rng),
            **_attention('MAPHead_0/MultiHeadDotProductAttention_0', rng),
            **_layer_norm('MAPHead_0/LayerNorm_0', rng),
            **_mlp('MAPHead_0/MlpBlock_0', rng),
        }
    )
  return tree


def _siglip(tree: dict) -> dict:
  """A two-tower checkpoint's: the image tower under params/img/, beside a text tower and SigLIP's
  logit scale and bias."""
  return {
      **{f'params/img/{k}': v for k, v in tree.items()},
      'params/txt/Embed_0/embedding': np.zeros((8, WIDTH), np.float32),
      'params/t': np.ones(1, np.float32),
      'params/b': np.zeros(1, np.float32),
  }


def _timm(
    path: str, pool: str, original: bool = False, size: int = SIZE, patch: int = PATCH
) -> torch.nn.Module:
  """timm's ViT of big_vision's function (tanh GELU, 1e-6 LayerNorms, the class token without a
  position embedding), loaded by timm from the file (at another `patch` size: resampled by timm)."""
  model = timm.models.VisionTransformer(
      img_size=size,
      patch_size=patch,
      embed_dim=WIDTH,
      depth=DEPTH,
      num_heads=HEADS,
      mlp_ratio=MLP / WIDTH,
      num_classes=CLASSES,
      class_token=pool == 'tok',
      global_pool={'map': 'map', 'tok': 'token', 'gap': 'avg'}[pool],
      fc_norm=False,
      no_embed_class=not original,
      act_layer='gelu_tanh',
  )
  model.load_pretrained(path)
  return model.eval()


CASES = {
    'siglip': ('map', dict(scan=True), _siglip),
    'class_token': ('tok', {}, lambda tree: {f'params/{k}': v for k, v in tree.items()}),
    'gap': ('gap', {}, dict),
    'gap_scanned': ('gap', dict(scan=True), dict),
    'original': ('tok', dict(original=True), dict),
}


@pytest.mark.parametrize('case', list(CASES))
def test_a_big_vision_vit_gives_timms_logits(tmp_path, case):
  pool, kwargs, written = CASES[case]
  path = str(tmp_path / f'{case}.npz')
  np.savez(path, **written(_tree(pool, **kwargs)))
  reference = _timm(path, pool, kwargs.get('original', False))
  run = prepared_from_checkpoint(tmp_path / 'workdir', path, SIZE)
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
  ours = np.asarray(run.model.apply({'params': run.init_params}, inputs))
  np.testing.assert_allclose(ours, torch_outputs(reference, inputs).numpy(), atol=1e-4)
  classifier = {'map': 'map', 'tok': 'token', 'gap': 'gap'}[pool]
  expected = {
      'hidden_size': WIDTH,
      'num_layers': DEPTH,
      'num_heads': HEADS,
      'mlp_dim': MLP,
      'patch_size': PATCH,
      'classifier': classifier,
      'class_token': pool == 'tok',
      'mlp_activation': 'gelu_tanh',
      'layernorm_epsilon': 1e-6,
  }
  assert {field: run.model_config[field] for field in expected} == expected


@pytest.mark.parametrize('patch', [2, 7])
def test_a_big_vision_vit_at_another_patch_size_gives_timms_logits(tmp_path, patch):
  """A GAP ViT of patch 4 with a 7x7 grid (FlexiViT's checkpoints: patch 32, 7x7) at patch 2 on
  28 px (14x14) or patch 7 on 49 px (7x7): timm's npz loader resamples the patch embedding and the
  position embeddings bilinear at pixel centres, not antialiased, as big_vision's FlexiViT
  resamples its kernel: --config.patch_interpolation=bilinear, and posemb_interpolation=
  bilinear_antialiased (FlexiViT's own; the embeddings grow, where antialiasing changes nothing)."""
  path = str(tmp_path / 'flexi.npz')
  np.savez(path, **_tree('gap'))
  size = patch * (SIZE // PATCH) * (2 if patch == 2 else 1)
  reference = _timm(path, 'gap', size=size, patch=patch)
  run = prepared_from_checkpoint(
      tmp_path / 'workdir',
      path,
      size,
      **{
          'model.patch_size': patch,
          'patch_interpolation': 'bilinear',
          'posemb_interpolation': 'bilinear_antialiased',
      },
  )
  assert run.model_config['patch_size'] == patch
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
  ours = np.asarray(run.model.apply({'params': run.init_params}, inputs))
  np.testing.assert_allclose(ours, torch_outputs(reference, inputs).numpy(), atol=1e-4)


def test_the_pre_logits_and_a_narrower_map_heads_mlp_are_read(tmp_path):
  tree = _tree('map')
  tree['pre_logits/kernel'] = np.zeros((WIDTH, 24), np.float32)
  tree['pre_logits/bias'] = np.zeros(24, np.float32)
  tree['head/kernel'] = np.zeros((24, CLASSES), np.float32)
  for layer, shape in (
      ('Dense_0/kernel', (WIDTH, 48)),
      ('Dense_0/bias', 48),
      ('Dense_1/kernel', (48, WIDTH)),
  ):
    tree[f'MAPHead_0/MlpBlock_0/{layer}'] = np.zeros(shape, np.float32)
  np.savez(tmp_path / 'm.npz', **tree)
  run = prepared_from_checkpoint(
      tmp_path / 'workdir', str(tmp_path / 'm.npz'), SIZE, keep_pre_logits=True
  )
  assert run.model_config['representation_size'] == 24
  assert run.model_config['map_mlp_dim'] == 48
  assert run.model_config['map_heads'] is None
  # The paper's fine-tuning drops it, with the head.
  run = prepared_from_checkpoint(
      tmp_path / 'new_head', str(tmp_path / 'm.npz'), SIZE, keep_head=False
  )
  assert run.model_config['representation_size'] is None
  assert 'pre_logits' not in run.init_params


def test_another_models_npz_is_one_line(tmp_path):
  np.savez(tmp_path / 'other.npz', x=np.zeros(1))
  with pytest.raises(ValueError, match="reads the fields of a plain ViT's .npz") as error:
    prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'other.npz'), SIZE)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()


def test_a_bfloat16_npz_loads_as_its_float32_values(tmp_path):
  """big_vision's .bf16.npz files (PaliGemma's): NumPy writes bfloat16 as 2-byte voids."""
  rounded = {k: v.astype(ml_dtypes.bfloat16) for k, v in _siglip(_tree('map', scan=True)).items()}
  np.savez(tmp_path / 'bf16.npz', **rounded)
  np.savez(tmp_path / 'f32.npz', **{k: v.astype(np.float32) for k, v in rounded.items()})
  reference = _timm(str(tmp_path / 'f32.npz'), 'map')
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'bf16.npz'), SIZE)
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
  ours = np.asarray(run.model.apply({'params': run.init_params}, inputs))
  np.testing.assert_allclose(ours, torch_outputs(reference, inputs).numpy(), atol=1e-4)


def test_a_big_vision_vit_is_a_distillation_teacher(tmp_path):
  np.savez(tmp_path / 'teacher.npz', **_siglip(_tree('map', scan=True)))
  config = helpers.load_config('demo', {'distill.teacher': str(tmp_path / 'teacher.npz')})
  variant, fields = teacher.architecture(config)
  assert variant == 'checkpoint'
  assert (fields['hidden_size'], fields['num_heads'], fields['classifier']) == (WIDTH, HEADS, 'map')
  loaded = teacher.load_teacher(config, CLASSES)
  assert loaded.params['head']['kernel'].shape == (WIDTH, CLASSES)
