"""What a timm checkpoint's config.json says without its tensors (timm_arguments.py,
timm_fields.py): the arguments of its registered architecture, from the table of timm's registry,
merged with its model_args as timm merges them. The state dicts are our export's (timm's naming),
so no timm is needed here; the comparisons with timm's own models are
test_timm_architectures_vs_torch.py's."""

import json

import pytest

import helpers
from vit_jax.checkpoints import (
    state_dicts,
    timm_architecture,
    timm_export,
    timm_export_tensors,
    torch_files,
)
from vit_jax.models import VisionTransformer

PATH = 'ck'


def _state_dict(**fields):
  model = VisionTransformer(
      **{**helpers.model_config(helpers.load_config('demo')), 'num_classes': 10, **fields}
  )
  return timm_export_tensors.to_state_dict(helpers.random_params(model, 8))


def _fields(config, **model_fields):
  return timm_architecture.architecture(_state_dict(**model_fields), config, PATH)


def test_a_hub_config_json_gets_the_registered_architectures_arguments():
  """The hub's config.json names the architecture alone: its heads, activation and epsilon are
  timm's code's, which the table holds."""
  clip = _fields({'architecture': 'vit_base_patch16_clip_quickgelu_224'}, pre_norm=True)
  assert (clip['num_heads'], clip['mlp_activation'], clip['layernorm_epsilon']) == (
      12,
      'quick_gelu',
      1e-5,
  )
  siglip2 = _fields(
      {'architecture': 'vit_giantopt_patch16_siglip_256', 'global_pool': 'map'},
      classifier='map',
      class_token=False,
  )
  assert (siglip2['num_heads'], siglip2['mlp_activation'], siglip2['classifier']) == (
      16,
      'gelu_tanh',  # Only the architecture's act_layer says so.
      'map',
  )
  plain = _fields({'architecture': 'vit_base_patch16_224'})
  assert (plain['mlp_activation'], plain['layernorm_epsilon'], plain['rope']) == (
      'gelu',
      1e-6,
      False,
  )


def test_an_architecture_named_with_its_pretrained_tag_is_the_architecture():
  fields = _fields({'architecture': 'vit_base_patch16_clip_quickgelu_224.openai'}, pre_norm=True)
  assert (fields['num_heads'], fields['mlp_activation']) == (12, 'quick_gelu')


def test_model_args_override_the_registered_ones():
  fields = _fields(
      {
          'architecture': 'vit_base_patch16_224',
          'model_args': {'num_heads': 2, 'act_layer': 'gelu_tanh'},
      }
  )
  assert (fields['num_heads'], fields['mlp_activation']) == (2, 'gelu_tanh')


def test_an_unknown_architecture_says_only_what_its_model_args_say():
  fields = _fields({'architecture': 'vit_from_a_newer_timm', 'model_args': {'num_heads': 2}})
  assert fields['num_heads'] == 2
  assert 'mlp_activation' not in fields and 'layernorm_epsilon' not in fields
  assert 'num_heads' not in _fields({'architecture': 'vit_from_a_newer_timm'})


@pytest.mark.parametrize(
    'config,message',
    [
        (
            {'architecture': 'vit_small_patch16_dinov3', 'model_args': {'rope_type': 'cat'}},
            r"^ck: timm's vit_small_patch16_dinov3 is created with rope_type='cat', "
            r"rope_rotate_half=True, rope_temperature=100, rope_grid_indexing='ij', "
            r"rope_grid_offset=0.0, which vit_jax's ViT does not compute \(its model.rope_style "
            r"computes rope_type='cat', rope_rotate_half=False, rope_temperature=10000.0, "
            r"rope_grid_indexing='ij', rope_grid_offset=0.0 \(eva02\) or ",
        ),
        (
            {'architecture': 'vit_small_patch16_dinov3', 'model_args': {'rope_grid_offset': 0.5}},
            r"created with rope_type='dinov3', rope_rotate_half=True, rope_temperature=100, "
            r"rope_grid_indexing='ij', rope_grid_offset=0.5, which vit_jax's ViT does not compute",
        ),
        (
            {'architecture': 'vit_small_patch16_18x2_224'},
            r"created with block_fn='ParallelThingsBlock', which vit_jax's ViT does not compute",
        ),
        (
            {'architecture': 'vit_base_patch16_224', 'model_args': {'sandwich_norm': True}},
            r'created with sandwich_norm=True, an argument vit_jax does not read \(its table is '
            r'of timm [\d.]+\)',
        ),
        (
            {'architecture': 'vit_base_patch16_224', 'model_args': {'act_layer': 'relu'}},
            r"^ck: timm's vit_base_patch16_224's MLP uses the activation 'relu'",
        ),
        (
            {'architecture': 'vit_base_patch16_224', 'global_pool': 'avgmax'},
            r"pools with global_pool='avgmax', which vit_jax's ViT does not compute",
        ),
        (
            {'architecture': 'vit_base_patch16_224', 'model_args': {'norm_layer': 'batchnorm'}},
            r"normalises with 'batchnorm', which vit_jax's ViT does not compute",
        ),
        (  # The tensors here are a LayerNorm ViT's (with biases).
            {'architecture': 'vit_base_patch16_224', 'model_args': {'norm_layer': 'rmsnorm'}},
            r'normalises with rmsnorm, its tensors with layernorm: the config.json is another',
        ),
    ],
)
def test_arguments_of_another_function_are_one_line(config, message):
  with pytest.raises(ValueError, match=message) as error:
    _fields(config)
  assert '\n' not in str(error.value)


def test_dinov3s_rotary_embeddings_are_its_rope_style():
  """DINOv3's registered rope arguments are model.rope_style='dinov3', without a grid: timm's
  'dinov3' type ignores ref_feat_shape. EVA-02's are 'eva02', with its grid."""
  dinov3 = _fields(
      {'architecture': 'vit_small_patch16_dinov3', 'model_args': {'ref_feat_shape': [16, 16]}}
  )
  assert (dinov3['rope'], dinov3['rope_grid'], dinov3['rope_style']) == (True, None, 'dinov3')
  eva02 = _fields({'architecture': 'eva02_small_patch14_224'})
  assert (eva02['rope'], eva02['rope_grid'], eva02['rope_style']) == (True, (16, 16), 'eva02')


def test_an_argument_at_its_default_is_no_error():
  fields = _fields(
      {'architecture': 'vit_base_patch16_224', 'model_args': {'attn_layer': 'Attention'}}
  )
  assert fields['num_heads'] == 12


def test_rope_mixeds_frequencies_show_its_rotary_embeddings_without_a_config_json():
  """RoPE-Mixed's learned frequencies (timm's rope.freqs) are tensors: a bare file shows the style;
  a config.json that says otherwise is another model's, in one line."""
  model = VisionTransformer(
      **{
          **helpers.model_config(helpers.load_config('demo')),
          'num_classes': 10,
          'rope': True,
          'rope_style': 'rope_mixed',
          'posemb': 'none',
          'key_bias': True,
      }
  )
  state_dict = timm_export_tensors.to_state_dict(helpers.random_params(model, 8), 'eva')
  assert state_dict['rope.freqs'].shape == (2, 4, 4, 8)  # [2, depth, heads, head_dim / 2].
  fields = timm_architecture.architecture(state_dict, {}, PATH)
  assert (fields['rope'], fields['rope_grid'], fields['rope_style']) == (True, None, 'rope_mixed')
  axial = {'architecture': 'vit_small_patch16_rope_224'}
  with pytest.raises(
      ValueError,
      match=r"^ck: timm's vit_small_patch16_rope_224 is created with no RoPE-Mixed's learned "
      r'rotary frequencies, and its tensors have them \(rope.freqs\): the config.json is another '
      r"model's$",
  ):
    timm_architecture.architecture(state_dict, axial, PATH)
  del state_dict['rope.freqs']
  mixed = {'architecture': 'vit_small_patch16_rope_mixed_224'}
  with pytest.raises(ValueError, match=r"created with RoPE-Mixed's .* its tensors have none: "):
    timm_architecture.architecture(state_dict, mixed, PATH)


@pytest.mark.parametrize(
    'fields,message',
    [
        ({'key_bias': True}, r'model.key_bias=True: it needs key_bias=False \(its q_bias'),
        (
            {'classifier': 'gap', 'fc_norm': False},
            r'model.fc_norm=False: it needs fc_norm with gap',
        ),
        ({'num_registers': 2}, r'model.num_registers=2: it needs num_registers=0$'),
        ({'layernorm_epsilon': 1e-5}, r'model.layernorm_epsilon=1e-05: it needs layernorm_epsilon'),
        # gap pools no class token, and Beit always has one: a KeyError of its tensors.
        ({'class_token': None}, r'model.class_token=None: it needs class_token=True$'),
    ],
)
def test_what_timms_beit_cannot_hold_is_one_line(fields, message):
  """Relative position biases export as timm's Beit, which has fewer options than our ViT."""
  model = {
      **helpers.model_config(helpers.load_config('demo')),
      'posemb': 'relative',
      'classifier': 'gap',
      'class_token': True,
      'fc_norm': True,
      'key_bias': False,
      'mlp_activation': 'gelu',
      **fields,
  }
  with pytest.raises(
      ValueError, match=r"^timm's Beit \(the class of relative position biases\) has no " + message
  ):
    timm_export.export(None, model, 16, 10, pp_eval={'crop': 'resize'})


def test_timms_naflexvit_is_one_line_naming_where_siglip2_naflex_loads(tmp_path):
  renamed = {}
  for name, tensor in _state_dict().items():
    if name == 'patch_embed.proj.weight':  # timm's Linear over (row, column, channel) patches.
      name, tensor = 'embeds.proj.weight', tensor.transpose(0, 2, 3, 1).reshape(len(tensor), -1)
    renamed[name.replace('pos_embed', 'embeds.pos_embed')] = tensor
  torch_files.write_safetensors(renamed, str(tmp_path / 'model.safetensors'))
  (tmp_path / 'config.json').write_text(
      json.dumps({'architecture': 'naflexvit_base_patch16_siglip'})
  )
  with pytest.raises(ValueError, match="timm's NaFlexVit .*siglip2_.*_naflex.npz") as error:
    state_dicts.architecture(str(tmp_path))
  assert '\n' not in str(error.value)
