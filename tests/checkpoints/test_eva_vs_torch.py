"""timm's Eva (EVA-02 and its CLIP, timm's SBB ViTs with rotary embeddings, DINOv3, RoPE-ViT,
Perception Encoder) through config.init_from with
config.variant='checkpoint': the fields read from the files timm writes, timm's logits, the tensors
exported back and timm's model rebuilt from our export; and what is refused, in one line."""

import json
import shutil

import numpy as np
import pytest
import timm

import helpers
from torch_references import (
    prepared_from_checkpoint,
    OR_VARIANT,
    TIMM_TINY,
    assert_exported_tensors,
    timm_input,
    timm_rebuilt,
    timm_saved,
    torch_outputs,
)
from vit_jax.checkpoints import timm_export
from vit_jax.train import setup

SIZE, NUM_CLASSES = 28, 10
# timm's architectures, made tiny (patches of 7 px: a 4x4 grid, which EVA-02's rotary embeddings
# measure on their 16x16 reference grid, DINOv3's on [-1, 1]), and the fields each fixes beside
# model.rope=True.
_EVAS = {
    # Fused qkv with q and v biases, the SwiGLU MLP packed in one fc1.
    'eva02_small_patch14_224': (
        dict(mlp_ratio=4 * 2 / 3),
        dict(mlp_gated=True, mlp_norm=False, key_bias=False, classifier='gap', posemb='learn'),
    ),
    # Separate q, k, v projections (no key bias), SwiGLU's fc1_g / fc1_x with its norm.
    'eva02_base_patch14_224': (
        dict(mlp_ratio=4 * 2 / 3),
        dict(mlp_gated=True, mlp_norm=True, key_bias=False, classifier='gap', posemb='learn'),
    ),
    # No class token, a register, layer scale (gamma_1, gamma_2), rotary embeddings alone.
    'vit_medium_patch16_rope_reg1_gap_256': (
        dict(mlp_ratio=4.0),
        dict(mlp_gated=False, key_bias=False, num_registers=1, class_token=False, posemb='none'),
    ),
    # DINOv3's rotary embeddings, a class token and 4 registers, LayerNorms of epsilon 1e-5, layer
    # scale; exported as timm's vit_base_patch16_dinov3.
    'vit_small_patch16_dinov3_qkvb': (
        dict(mlp_ratio=4.0),
        dict(
            mlp_gated=False,
            key_bias=False,
            num_registers=4,
            class_token=True,
            posemb='none',
            rope_grid=None,
            rope_style='dinov3',
            layernorm_epsilon=1e-5,
        ),
    ),
    # RoPE-ViT's axial embeddings ('xy' grid, temperature 100) and its attention's key bias (timm's
    # AttentionRope, as which ours exports it), a class token it pools, layer scale.
    'vit_small_patch16_rope_224': (
        dict(mlp_ratio=4.0),
        dict(
            mlp_gated=False,
            key_bias=True,
            num_registers=0,
            class_token=True,
            classifier='token',
            posemb='none',
            rope_grid=None,
            rope_style='rope_vit',
        ),
    ),
    # RoPE-Mixed: RoPE-ViT's frequencies learned per block and head (timm's rope.freqs), exported
    # back as one tensor.
    'vit_small_patch16_rope_mixed_224': (
        dict(mlp_ratio=4.0),
        dict(
            mlp_gated=False,
            key_bias=True,
            class_token=True,
            classifier='token',
            posemb='none',
            rope_grid=None,
            rope_style='rope_mixed',
        ),
    ),
    # Eva's post-norm blocks (use_post_norm: the same tensors, each norm after its branch) with a
    # gated MLP, exported back as Eva's.
    'eva02_tiny_patch14_224': (
        dict(mlp_ratio=4 * 2 / 3, use_post_norm=True),
        dict(
            mlp_gated=True,
            key_bias=False,
            classifier='gap',
            posemb='learn',
            res_post_norm=True,
        ),
    ),
    # EVA-02 CLIP's image tower: a LayerNorm of the attention's heads before its projection.
    'eva02_base_patch16_clip_224': (
        dict(mlp_ratio=4 * 2 / 3),
        dict(
            mlp_gated=True,
            mlp_norm=True,
            key_bias=False,
            attn_norm=True,
            classifier='token',
            posemb='learn',
        ),
    ),
    # Perception Encoder: its rotary embeddings ('xy' grid from 1, on a 24x24 reference grid), a
    # norm before the blocks and no patch bias, a MAP head of 8 heads over every token; exported as
    # an Eva with its attn_pool.
    'vit_pe_core_tiny_patch16_384': (
        dict(mlp_ratio=4.0),
        dict(
            mlp_gated=False,
            key_bias=True,
            num_registers=0,
            class_token=True,
            classifier='map',
            map_heads=8,
            map_include_prefix=True,
            pre_norm=True,
            posemb='learn',
            rope_grid=(24, 24),
            rope_style='pe',
            layernorm_epsilon=1e-5,
        ),
    ),
}


def _saved(directory, architecture: str, **kwargs):
  args, _ = _EVAS[architecture]
  return timm_saved(directory, architecture, img_size=SIZE, patch_size=7, **{**args, **kwargs})


def _prepare(tmp_path, init_from: str, **overrides) -> setup.Setup:
  overrides = {'image_size': SIZE, **overrides}
  return prepared_from_checkpoint(
      tmp_path / 'workdir', init_from, overrides.pop('image_size'), **overrides
  )


def _images(n: int, size: int = SIZE) -> np.ndarray:
  return np.random.RandomState(2).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def _logits(run: setup.Setup, inputs: np.ndarray) -> np.ndarray:
  return np.asarray(run.model.apply({'params': run.init_params}, inputs))


@pytest.mark.parametrize('architecture', list(_EVAS))
def test_timms_eva_loads_from_its_files_alone_with_equal_logits_and_exports_back(
    tmp_path, architecture
):
  reference = _saved(tmp_path / 'eva', architecture)
  run = _prepare(tmp_path, str(tmp_path / 'eva'))
  _, fields = _EVAS[architecture]
  expected = {
      'rope': True,
      'rope_grid': (16, 16),
      'rope_style': 'eva02',
      **fields,
      'patch_size': 7,
      'num_layers': 2,
  }
  assert {k: run.model_config[k] for k in expected} == expected
  assert run.model_config['mlp_activation'] == ('silu' if fields['mlp_gated'] else 'gelu')
  inputs = _images(3)
  expected_logits = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(_logits(run, inputs), expected_logits, atol=1e-4)
  exported = timm_export.export(
      run.init_params,
      run.model_config,
      SIZE,
      NUM_CLASSES,
      pp_eval=run.config.pp_eval.to_dict(),
  )[0]
  theirs = reference.state_dict()
  if 'blocks.0.attn.q_proj.weight' in theirs:  # Ours writes Eva's other form: qkv fused.
    for i in range(2):
      t = f'blocks.{i}.attn.'
      np.testing.assert_array_equal(
          exported.pop(t + 'qkv.weight'),
          np.concatenate([theirs.pop(f'{t}{n}_proj.weight').numpy() for n in 'qkv']),
      )
      for n in 'qv':
        np.testing.assert_array_equal(exported.pop(f'{t}{n}_bias'), theirs.pop(f'{t}{n}_proj.bias'))
    theirs = {
        k: v.numpy() for k, v in theirs.items() if not k.startswith(('patch_embed.', 'pos_embed'))
    }
    assert sorted(theirs) == sorted(
        k for k in exported if not k.startswith(('patch_embed.', 'pos_embed'))
    )
    for name, tensor in theirs.items():
      np.testing.assert_allclose(exported[name], tensor, atol=1e-6, err_msg=name)
  else:
    assert_exported_tensors(exported, reference, folded=('patch_embed.', 'pos_embed'))
  rebuilt = timm_rebuilt(
      run.init_params, run.model_config, SIZE, run.config.pp_eval.to_dict(), tmp_path / 'export'
  )
  assert type(rebuilt).__name__ == 'Eva'
  np.testing.assert_allclose(torch_outputs(rebuilt, inputs).numpy(), expected_logits, atol=1e-4)


@pytest.mark.parametrize(
    'architecture', ['vit_medium_patch16_rope_reg1_gap_256', 'vit_small_patch16_rope_mixed_224']
)
def test_rotary_embeddings_follow_timm_at_a_new_resolution(tmp_path, architecture):
  """Fine-tuning at another size: the rotary embeddings of a 6x6 grid are measured on the same 16x16
  reference grid as timm's, or (RoPE-Mixed's) counted on it with the same learned frequencies (no
  position embeddings to resize in these architectures)."""
  saved = _saved(tmp_path / 'eva', architecture)
  larger = 42
  reference = timm.create_model(
      architecture,
      pretrained=False,
      **{**TIMM_TINY, **_EVAS[architecture][0], 'img_size': larger, 'patch_size': 7},
  ).eval()
  reference.load_state_dict(saved.state_dict())
  run = _prepare(tmp_path, str(tmp_path / 'eva'), image_size=larger)
  inputs = _images(2, larger)
  np.testing.assert_allclose(
      _logits(run, inputs),
      torch_outputs(reference, timm_input(reference, inputs)).numpy(),
      atol=1e-4,
  )


def test_what_the_eva_files_do_not_say_or_contradict_is_one_line(tmp_path):
  _saved(tmp_path / 'eva', 'eva02_small_patch14_224')
  bare = tmp_path / 'bare'
  bare.mkdir()
  shutil.copy(tmp_path / 'eva' / 'model.safetensors', bare)
  # Rotary embeddings have no tensors: a bare file cannot say whether it has them.
  with pytest.raises(
      ValueError,
      match=r'does not say its rotary position embeddings \(model.rope\): .* set '
      r'--config.model.rope$',
  ):
    _prepare(
        tmp_path,
        str(bare / 'model.safetensors'),
        **{
            'model.num_heads': 2,
            'model.mlp_activation': 'silu',
            'model.layernorm_epsilon': 1e-6,
            'model.classifier': 'gap',
        },
    )
  named = {
      'variant': 'ViT-testing_7',
      'model.hidden_size': 32,
      'model.num_layers': 2,
      'model.num_heads': 2,
      'model.mlp_dim': 85,  # int(32 * 4 * 2 / 3), each half of the packed fc1.
      'model.classifier': 'gap',
      'model.class_token': True,
      'model.fc_norm': True,
      'model.mlp_activation': 'silu',
  }
  with pytest.raises(
      ValueError,
      match=r"checkpoint's rotary position embeddings is True, the model's False: set "
      r'--config.model.rope=True' + OR_VARIANT,
  ):
    _prepare(tmp_path, str(tmp_path / 'eva'), **named)
  with pytest.raises(
      ValueError,
      match=r'/MlpBlock_3/Dense_linear/.*the checkpoint has gated MLPs \(GLU\); set '
      r'--config.model.mlp_gated=True$',
  ):
    _prepare(
        tmp_path,
        str(tmp_path / 'eva'),
        **named,
        **{'model.rope': True, 'model.rope_grid': (16, 16), 'model.key_bias': False},
    )
  with pytest.raises(
      ValueError,
      match=r'/key/bias: .*the checkpoint has no key biases; set --config.model.key_bias=False$',
  ):
    _prepare(
        tmp_path,
        str(tmp_path / 'eva'),
        **named,
        **{'model.rope': True, 'model.rope_grid': (16, 16), 'model.mlp_gated': True},
    )
  config = json.loads((tmp_path / 'eva' / 'config.json').read_text())
  config['model_args'].update(rope_grid_indexing='xy', rope_grid_offset=0.5)
  (tmp_path / 'eva' / 'config.json').write_text(json.dumps(config))
  with pytest.raises(
      ValueError,
      match=r"created with rope_type='cat', rope_rotate_half=False, rope_temperature=10000.0, "
      r"rope_grid_indexing='xy', rope_grid_offset=0.5, which vit_jax's ViT does not compute",
  ):
    _prepare(tmp_path, str(tmp_path / 'eva'))


def test_a_timm_eva_feature_we_lack_is_refused_naming_it(tmp_path):
  """A gated Eva's attention pooling, whose MLP is GELU's, by what differs."""
  _saved(tmp_path / 'pooled', 'eva02_small_patch14_224', global_pool='map')
  with pytest.raises(
      ValueError,
      match=r"attention pooling has a GELU MLP, its blocks a gated one: vit_jax's MAP head has the "
      r"blocks' activation$",
  ):
    _prepare(tmp_path, str(tmp_path / 'pooled'))


@pytest.mark.parametrize(
    'fields,message',
    [
        (
            {'mlp_activation': 'gelu'},
            r"has no model.mlp_activation='gelu': it needs mlp_activation='silu'",
        ),
        (
            {'classifier': 'map', 'class_token': True},
            r'pools with attention over every token.*model.map_include_prefix=True to export it$',
        ),
        (
            {'classifier': 'map', 'map_include_prefix': True},
            r"timm's Eva pools with a GELU MLP, not the blocks' model.mlp_activation='silu'$",
        ),
    ],
)
def test_what_timms_eva_cannot_hold_is_said_before_anything_is_written(tmp_path, fields, message):
  model_config = {
      **helpers.model_config(helpers.load_config('demo')),
      'mlp_activation': 'silu',
      'mlp_gated': True,
      'key_bias': False,
      'rope': True,
      'classifier': 'gap',
      **fields,
  }
  with pytest.raises(ValueError, match=message):
    timm_export.export(None, model_config, SIZE, NUM_CLASSES, pp_eval={'crop': 'resize'})
