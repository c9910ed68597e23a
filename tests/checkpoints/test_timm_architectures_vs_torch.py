"""timm's ViT architectures through config.init_from as the hub ships them (a config.json naming the
architecture, without its model arguments): each either loads and computes timm's logits, or is a
one-line error before anything is written. Never another function. The references are random tiny
models of each architecture, written by timm's save_for_hf."""

import json

import numpy as np
import pytest
import timm
import torch
from timm.models import eva, vision_transformer

import timm_registry
from torch_references import (
    prepared_from_checkpoint,
    randomize,
    timm_input,
    timm_rebuilt,
    torch_outputs,
)
from vit_jax.checkpoints import meta_dinov3_layout, timm_arguments, torch_files
from vit_jax.models import rope

SIZE = 28

# Architectures vit_jax computes, one of each kind: the paper's ViT, CLIP (quick GELU, 1e-5 norms, a
# norm before the blocks), SigLIP (MAP pooling; v2's tanh GELU, which only timm's code says), timm's
# SBB ViTs (registers, global pooling, rotary embeddings), DINOv2 with registers, DeiT (distilled)
# and DeiT III, EVA-02, FlexiViT, DINOv3 (its rotary embeddings; without and with query and value
# biases) and LingBot (DINOv3's, token pooling); and MAP pooling beside a class token or registers,
# which timm's attn_pool does not attend to.
COMPUTED = (
    ('vit_tiny_patch16_224', {}),
    ('vit_base_patch32_clip_quickgelu_224', {}),
    ('vit_xsmall_patch16_clip_224', {}),
    ('vit_base_patch16_siglip_224', {}),
    ('vit_base_patch16_siglip_224', {'class_token': True}),
    ('vit_giantopt_patch16_siglip_256', {}),
    ('vit_base_patch16_siglip_gap_256', {}),
    ('vit_so150m_patch16_reg4_map_256', {}),
    ('vit_betwixt_patch16_reg4_gap_256', {}),
    ('vit_betwixt_patch16_rope_reg4_gap_256', {}),
    ('vit_small_patch14_reg4_dinov2', {'patch_size': 14}),
    ('vit_giant_patch14_dinov2', {'patch_size': 14}),  # SwiGLU, packed in one fc1.
    ('deit_tiny_distilled_patch16_224', {}),
    ('deit3_small_patch16_224', {}),
    ('eva02_tiny_patch14_224', {'patch_size': 14}),
    ('flexivit_small', {}),
    ('vit_small_patch16_dinov3', {}),
    ('vit_small_patch16_dinov3_qkvb', {}),
    ('vit_small_patch16_lingbot', {}),
    ('vit_small_patch16_rope_224', {}),  # RoPE-ViT's axial embeddings: 'xy' grid, temperature 100.
    ('vit_small_patch16_rope_ape_224', {}),  # And position embeddings without the class token's.
    # RoPE-Mixed: frequencies learned per block and head (timm's rope.freqs).
    ('vit_small_patch16_rope_mixed_224', {}),
    ('vit_small_patch16_rope_mixed_ape_224', {}),
    # Perception Encoder: its rotary embeddings ('xy' grid from 1, rescaled), a norm before the
    # blocks, MAP pooling of 8 heads over every token, the class token too.
    ('vit_pe_core_tiny_patch16_384', {}),
    # Perception Encoder G's lang tower: rotary embeddings from 0 on an 'xy' grid (rope_style
    # 'eva02_xy'); its core tower, whose MAP head's MLP is narrower than its blocks' (map_mlp_dim).
    ('vit_pe_lang_gigantic_patch14_448', {'patch_size': 14}),
    ('vit_pe_core_gigantic_patch14_448', {'patch_size': 14}),
    # EVA-02 CLIP: a LayerNorm of the attention's heads before its projection (scale_attn_inner).
    ('eva02_base_patch16_clip_224', {}),
    # AIMv2: RMSNorms (one of the patch embeddings too), SwiGLU, no biases in its blocks.
    ('aimv2_large_patch14_224', {'patch_size': 14}),
    # BEiT-3's vision tower: LayerNorms in the attention and the MLP (scale_attn_norm, scale_mlp_norm).
    ('beit3_base_patch16_224', {}),
    # No final LayerNorm (final_norm=False): InternViT, C-RADIOv3 (7 registers, position embeddings
    # without the class token's), Perception Encoder lang (an Eva).
    ('vit_intern300m_patch14_448', {'patch_size': 14}),
    ('vit_base_patch16_radio_v3', {}),
    ('vit_pe_lang_large_patch14_448', {'patch_size': 14}),
    # Res-post-norm blocks (model.res_post_norm): timm's ResPostBlock, EVA-02-CLIP-E's Eva blocks.
    ('vit_base_patch16_rpn_224', {}),
    ('eva02_enormous_patch14_clip_224', {'patch_size': 14}),
    # BEiT (timm's Beit): relative position biases in every block (model.posemb=relative), or one
    # all blocks share; its attention's q and v biases, layer scale, 'avg' pooling with fc_norm.
    ('beit_base_patch16_224', {}),
    ('beitv2_base_patch16_224', {}),
    ('beitv2_base_patch16_224', {'use_rel_pos_bias': False, 'use_shared_rel_pos_bias': True}),
    ('beit_base_patch16_224', {'global_pool': 'token'}),
    # Sapiens 2: grouped-query attention in some blocks (model.num_kv_heads, each block's), layer
    # scale of the attention alone (model.layer_scale_mlp=False), RMSNorms, DINOv3's rotary
    # embeddings, 8 registers; and its grouped-query attention in every block.
    ('vit_base_patch16_sapiens2', {'num_kv_heads': (2, 1)}),
    ('vit_base_patch16_sapiens2', {'num_kv_heads': 1}),
    # Parallel blocks (ViT-22B's; timm's ParallelScalingBlock: model.parallel_block): SBB's with
    # biases of its packed in_proj, and the xp ones without (the MLP's then its own mlp_bias), with
    # qk-norm, RMSNorms and a norm before the blocks.
    ('vit_pwee_patch16_reg1_gap_256', {}),
    ('vit_base_patch16_xp_224', {}),
    # Differential attention (model.diff_attention; timm's attn_layer='diff'), and in parallel
    # blocks (DiffParallelScalingBlock, one output projection of both branches).
    ('vit_dwee_patch16_reg1_gap_256', {}),
    ('vit_dlittle_patch16_reg1_gap_256', {}),
    ('vit_dpwee_patch16_reg1_gap_256', {}),
    # With qk-norms, of each half of a head.
    ('vit_dwee_patch16_reg1_gap_256', {'qk_norm': True}),
    ('vit_dpwee_patch16_reg1_gap_256', {'qk_norm': True}),
)
# Architectures whose weights would load but compute another function, and what the error names.
REFUSED = (('vit_small_patch16_18x2_224', "block_fn='ParallelThingsBlock'"),)


def _saved(directory, architecture: str, **kwargs):
  """A random tiny timm model of `architecture`, saved as the hub has it: its config.json names the
  architecture, and of the arguments it was made with (the tiny ones) only its heads, the one the
  tensors cannot show."""
  patch_size = kwargs.pop('patch_size', 4)
  tiny = dict(
      img_size=SIZE, patch_size=patch_size, embed_dim=32, depth=2, num_heads=2, num_classes=10
  )
  reference = randomize(timm.create_model(architecture, pretrained=False, **tiny, **kwargs)).eval()
  timm.models.save_for_hf(reference, directory, safe_serialization=True)
  config = json.loads((directory / 'config.json').read_text())
  config['model_args'] = {'num_heads': 2, **kwargs}
  (directory / 'config.json').write_text(json.dumps(config))
  return reference


def _assert_timms_logits(run, reference) -> None:
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
  ours = np.asarray(run.model.apply({'params': run.init_params}, inputs))
  theirs = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize('architecture,kwargs', COMPUTED)
def test_an_architecture_vit_jax_computes_gives_timms_logits(tmp_path, architecture, kwargs):
  reference = _saved(tmp_path / 'timm', architecture, **kwargs)
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  _assert_timms_logits(run, reference)


@pytest.mark.parametrize('size', [44, 20])
@pytest.mark.parametrize(
    'architecture,kwargs',
    [('beit_base_patch16_224', {'global_pool': 'token'}), ('beitv2_base_patch16_224', {})],
)
def test_beits_relative_biases_at_another_size_are_resized_as_timm_resizes_them(
    tmp_path, architecture, kwargs, size
):
  """timm loads a BEiT at another image size by reading its relative bias tables linearly at
  geometric offsets (resize_rel_pos_bias_table): config.posemb_interpolation='bicubic' (timm's)
  resizes ours so, from 7 x 7 patches to 11 x 11 and to 5 x 5."""
  _saved(tmp_path / 'timm', architecture, **kwargs)
  reference = timm.create_model(
      architecture,
      pretrained=True,
      # Its head too: timm drops one of other classes than the overlay's.
      pretrained_cfg_overlay={
          'file': str(tmp_path / 'timm' / 'model.safetensors'),
          'num_classes': 10,
      },
      **dict(img_size=size, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10),
      **kwargs,
  ).eval()
  run = prepared_from_checkpoint(
      tmp_path / 'workdir', str(tmp_path / 'timm'), size, posemb_interpolation='bicubic'
  )
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
  ours = np.asarray(run.model.apply({'params': run.init_params}, inputs))
  theirs = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize(
    'architecture,kwargs,fields',
    [
        ('vit_intern300m_patch14_448', {'patch_size': 14}, {'final_norm': False}),
        ('vit_pe_lang_large_patch14_448', {'patch_size': 14}, {'final_norm': False}),
        (
            'vit_pe_lang_gigantic_patch14_448',
            {'patch_size': 14},
            {'final_norm': False, 'rope_style': 'eva02_xy'},
        ),
        # Its MLPs int(32 * 35 / 6) = 186 units wide, its MAP head's 4 * 32.
        (
            'vit_pe_core_gigantic_patch14_448',
            {'patch_size': 14},
            {'mlp_dim': 186, 'map_mlp_dim': 128, 'map_heads': 8, 'rope_style': 'eva02_xy'},
        ),
        ('beit3_base_patch16_224', {}, {'mlp_norm': True}),
        ('vit_base_patch16_rpn_224', {}, {'res_post_norm': True}),
        ('beitv2_base_patch16_224', {}, {'posemb': 'relative', 'classifier': 'gap'}),
        ('beit_base_patch16_224', {'global_pool': 'token'}, {'posemb': 'relative'}),
        ('eva02_enormous_patch14_clip_224', {'patch_size': 14}, {'res_post_norm': True}),
        ('vit_pwee_patch16_reg1_gap_256', {}, {'parallel_block': True}),
        ('vit_dwee_patch16_reg1_gap_256', {}, {'diff_attention': True}),
        (
            'vit_dwee_patch16_reg1_gap_256',
            {'qk_norm': True},
            {'diff_attention': True, 'qk_norm': True},
        ),
        (
            'vit_dpwee_patch16_reg1_gap_256',
            {},
            {'diff_attention': True, 'parallel_block': True},
        ),
        (
            'vit_pwee_patch16_reg1_gap_256',
            {'qkv_bias': False, 'qk_norm': True},
            {'parallel_block': True, 'qk_norm': True},
        ),
        # RMSNorms: AIMv2's (of 1e-5: its architecture's, one of the patch embeddings too, which
        # the config.json can also leave out), and of timm's default 1e-6, which the config.json
        # names ('rmsnorm') in any block kind, the MAP head's too; Sapiens 2's (an Eva).
        (
            'aimv2_large_patch14_224',
            {'patch_size': 14},
            {'norm_layer': 'rmsnorm', 'layernorm_epsilon': 1e-5, 'embed_norm': True},
        ),
        (
            'aimv2_large_patch14_224',
            {'patch_size': 14, 'embed_norm_layer': ''},  # timm's none, as create_model drops None.
            {'norm_layer': 'rmsnorm', 'embed_norm': False, 'mlp_gated': True},
        ),
        (
            'vit_base_patch16_224',
            {'norm_layer': 'rmsnorm', 'embed_norm_layer': 'rmsnorm'},
            {'norm_layer': 'rmsnorm', 'layernorm_epsilon': 1e-6, 'embed_norm': True},
        ),
        ('vit_base_patch16_siglip_224', {'norm_layer': 'rmsnorm'}, {'classifier': 'map'}),
        ('vit_base_patch16_xp_224', {}, {'norm_layer': 'rmsnorm', 'parallel_block': True}),
        (
            'vit_base_patch16_sapiens2',
            {'num_kv_heads': (2, 1)},
            {'norm_layer': 'rmsnorm', 'num_kv_heads': (2, 1), 'layer_scale_mlp': False},
        ),
        # BEiT's SwiGLU MLPs (never packed in one fc1, as Eva's are without a norm).
        ('beit_base_patch16_224', {'swiglu_mlp': True}, {'mlp_gated': True}),
        # Sapiens 2's grouped-query attention and layer scale of the attention alone, with
        # LayerNorms.
        (
            'vit_small_patch16_dinov3',
            {
                'attn_type': 'rope',
                'qkv_fused': False,
                'qkv_bias': True,
                'num_kv_heads': (2, 1),
                'attn_only_layer_scale': True,
            },
            {'num_kv_heads': (2, 1), 'layer_scale_mlp': False},
        ),
    ],
)
def test_the_newer_fields_export_back_to_timm(tmp_path, architecture, kwargs, fields):
  """model.final_norm=False written as timm's VisionTransformer's final_norm=False or Eva's
  use_post_transformer_norm=False, model.mlp_norm without rotary embeddings or a gated MLP as
  VisionTransformer's scale_mlp_norm (BEiT-3's), model.map_mlp_dim as Eva's attn_pool_mlp_ratio,
  model.res_post_norm as timm's ResPostBlocks: timm's model rebuilt from the export gives the
  logits; model.num_kv_heads and model.layer_scale_mlp as Eva's num_kv_heads and
  attn_only_layer_scale, model.parallel_block as timm's ParallelScalingBlocks,
  model.diff_attention as its attn_layer='diff' or DiffParallelScalingBlocks; RMSNorms
  (model.norm_layer, embed_norm) as the architecture's own or the config.json's norm_layer."""
  reference = _saved(tmp_path / 'timm', architecture, **kwargs)
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  assert {field: run.model_config[field] for field in fields} == fields
  rebuilt = timm_rebuilt(
      run.init_params, run.model_config, SIZE, run.config.pp_eval.to_dict(), tmp_path / 'export'
  )
  _assert_timms_logits(run, rebuilt)
  inputs = np.random.RandomState(0).uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)
  np.testing.assert_allclose(
      torch_outputs(rebuilt, inputs).numpy(),
      torch_outputs(reference, timm_input(reference, inputs)).numpy(),
      atol=1e-4,
  )


def _metas_names(timm_state_dict: dict) -> dict:
  """A timm Sapiens 2 state dict in Meta's names (timm's eva.checkpoint_filter_fn reversed), with
  the buffer and the pretraining token Meta's files hold beside them."""
  meta = {'mask_token': torch.zeros(1, 32), 'rope.periods': torch.ones(4)}
  for name, tensor in timm_state_dict.items():
    for timms, metas in (
        ('reg_token', 'storage_tokens'),
        ('patch_embed.proj.', 'patch_embed.projection.'),
        ('attn.q_proj.', 'attn.wq.'),
        ('attn.k_proj.', 'attn.wk.'),
        ('attn.v_proj.', 'attn.wv.'),
        ('gamma_1', 'attn.gamma.weight'),
        ('mlp.fc1.', 'ffn.w12.'),
        ('mlp.fc2.', 'ffn.w3.'),
        ('norm1.', 'ln1.'),
        ('norm2.', 'ln2.'),
    ):
      name = name.replace(timms, metas)
    meta['ln1.' + name[len('norm.') :] if name.startswith('norm.') else name] = tensor
  return meta


def test_sapiens2_in_metas_naming_loads_as_timm_loads_it(tmp_path):
  """The hub's Sapiens 2 files are Meta's naming, which timm renames as it loads them: a state dict
  that timm's own loader renames back to its model's, read by vit_jax, computes timm's logits."""
  reference = _saved(tmp_path / 'timm', 'vit_base_patch16_sapiens2', num_kv_heads=(2, 1))
  meta = _metas_names(reference.state_dict())
  renamed = eva.checkpoint_filter_fn(meta, reference)
  assert sorted(renamed) == sorted(reference.state_dict())
  for name, tensor in reference.state_dict().items():
    torch.testing.assert_close(renamed[name], tensor, rtol=0, atol=0)
  (tmp_path / 'timm' / 'model.safetensors').unlink()
  torch_files.write_safetensors(
      {k: v.numpy() for k, v in meta.items()}, str(tmp_path / 'timm' / 'model.safetensors')
  )
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  assert run.model_config['num_kv_heads'] == (2, 1)
  _assert_timms_logits(run, reference)


def _apples_names(timm_state_dict: dict) -> dict:
  """A timm AIMv2 state dict in Apple's names (timm's _convert_aimv2 reversed)."""
  apple = {}
  for name, tensor in timm_state_dict.items():
    for timms, apples in (
        ('patch_embed.', 'preprocessor.patchifier.'),
        ('pos_embed', 'preprocessor.pos_embed'),
        ('norm1', 'norm_1'),
        ('norm2', 'norm_2'),
        ('mlp.fc1_g', 'mlp.fc1'),
        ('mlp.fc1_x', 'mlp.fc3'),
    ):
      name = name.replace(timms, apples)
    name = 'trunk.post_trunk_norm.' + name[len('norm.') :] if name.startswith('norm.') else name
    apple['trunk.' + name if name.startswith('blocks.') else name] = tensor
  return apple


def test_aimv2_in_apples_naming_loads_as_timm_loads_it(tmp_path):
  """Apple's AIMv2 files (custom code, its own names and config.json) are what timm renames as it
  loads them: a state dict that timm's own loader renames back to its model's, beside Apple's
  config.json and image processor's, computes timm's logits, its heads and epsilon from Apple's."""
  reference = _saved(tmp_path / 'timm', 'aimv2_large_patch14_224', patch_size=14)
  apple = _apples_names(reference.state_dict())
  renamed = vision_transformer.checkpoint_filter_fn(apple, reference)
  assert sorted(renamed) == sorted(reference.state_dict())
  directory = tmp_path / 'apple'
  directory.mkdir()
  torch_files.write_safetensors(
      {k: v.numpy() for k, v in apple.items()}, str(directory / 'model.safetensors')
  )
  (directory / 'config.json').write_text(
      json.dumps({'model_type': 'aimv2', 'num_attention_heads': 2, 'rms_norm_eps': 1e-5})
  )
  (directory / 'preprocessor_config.json').write_text(
      json.dumps(  # AIMv2's, CLIP's: folded into the patch embedding.
          {
              'image_mean': reference.pretrained_cfg['mean'],
              'image_std': reference.pretrained_cfg['std'],
          }
      )
  )
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(directory), SIZE)
  assert (run.model_config['num_heads'], run.model_config['layernorm_epsilon']) == (2, 1e-5)
  _assert_timms_logits(run, reference)
  del apple['preprocessor.pos_embed']  # A native-resolution one's: computed sin-cos embeddings.
  torch_files.write_safetensors(
      {k: v.numpy() for k, v in apple.items()}, str(directory / 'model.safetensors')
  )
  with pytest.raises(
      ValueError,
      match=r"an AIMv2 of native resolution in Apple's own naming, .* load its transformers files",
  ):
    prepared_from_checkpoint(tmp_path / 'native', str(directory), SIZE)
  assert not (tmp_path / 'native').exists()


def _metas_dinov3_names(timm_state_dict: dict) -> dict:
  """A timm DINOv3 state dict in Meta's names (timm's filter reversed): the query and value biases
  in a fused qkv bias beside its mask, whose key part, random here, the mask zeroes; the rotary
  embeddings' periods and the masked-image token beside them."""
  meta = {
      'mask_token': torch.zeros(1, 384),
      # Kept in bfloat16, as Meta's files do.
      'rope_embed.periods': torch.from_numpy(rope.dinov3_periods(64)).bfloat16().float(),
  }
  for name, tensor in timm_state_dict.items():
    if name.endswith('attn.q_bias'):
      key = torch.randn_like(tensor)
      value = timm_state_dict[name.replace('q_bias', 'v_bias')]
      meta[name.replace('q_bias', 'qkv.bias')] = torch.cat([tensor, key, value])
      meta[name.replace('q_bias', 'qkv.bias_mask')] = torch.cat(
          [torch.ones_like(tensor), torch.zeros_like(key), torch.ones_like(value)]
      )
      continue
    if name.endswith('attn.v_bias'):
      continue
    for timms, metas in (
        ('gamma_1', 'ls1.gamma'),
        ('gamma_2', 'ls2.gamma'),
        ('reg_token', 'storage_tokens'),
        ('mlp.fc1_g', 'mlp.w1'),
        ('mlp.fc1_x', 'mlp.w2'),
        ('mlp.fc2', 'mlp.w3' if 'blocks.0.mlp.fc1_g.weight' in timm_state_dict else 'mlp.fc2'),
    ):
      name = name.replace(timms, metas)
    meta[name] = tensor
  return meta


@pytest.mark.parametrize(
    'architecture', ['vit_small_patch16_dinov3_qkvb', 'vit_small_plus_patch16_dinov3']
)
def test_dinov3_in_metas_naming_loads_as_timm_loads_it(tmp_path, architecture):
  """Meta's DINOv3 files (facebookresearch/dinov3's .pth: no config.json) are what timm renames as
  it loads them: a state dict that timm's own loader renames back to its model's computes timm's
  logits, its heads and epsilon those of timm's DINOv3 of its width (S's 384, with SwiGLU S+'s),
  pooling the class token, its images ImageNet-normalised as timm's DINOv3 configs say; periods of
  other rotary embeddings are a one-line error."""
  reference = randomize(
      timm.create_model(
          architecture, img_size=SIZE, patch_size=4, depth=2, num_classes=10, global_pool='token'
      )
  ).eval()
  meta = _metas_dinov3_names(reference.state_dict())
  renamed = eva.checkpoint_filter_fn(dict(meta), reference)
  assert sorted(renamed) == sorted(reference.state_dict())
  directory = tmp_path / 'meta'
  directory.mkdir()
  write = lambda tensors: torch_files.write_safetensors(
      {k: v.numpy() for k, v in tensors.items()}, str(directory / 'model.safetensors')
  )
  write(meta)
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(directory), SIZE)
  assert (run.model_config['num_heads'], run.model_config['layernorm_epsilon']) == (6, 1e-5)
  assert run.model_config['classifier'] == 'token'
  assert reference.pretrained_cfg['mean'] == (0.485, 0.456, 0.406)
  _assert_timms_logits(run, reference)
  write({**meta, 'rope_embed.periods': meta['rope_embed.periods'] * 2})
  with pytest.raises(ValueError, match=r"rope_embed.periods\) are not DINOv3's") as error:
    prepared_from_checkpoint(tmp_path / 'other', str(directory), SIZE)
  assert '\n' not in str(error.value) and not (tmp_path / 'other').exists()


def test_metas_dinov3_files_are_normalised_as_their_names_say():
  """ImageNet's mean and std (LVD-1689M's), the satellite models' for Meta's SAT-493M files, a
  config.json's pretrained_cfg over both."""
  imagenet = meta_dinov3_layout.normalization({}, '/w/dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth')
  satellite = meta_dinov3_layout.normalization({}, '/w/dinov3_vitl16_pretrain_sat493m-eadcf0ff.pth')
  assert imagenet == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
  assert satellite == ([0.430, 0.411, 0.296], [0.213, 0.156, 0.143])
  said = {'pretrained_cfg': {'mean': [0.5] * 3, 'std': [0.25] * 3}}
  assert meta_dinov3_layout.normalization(said, '/w/sat493m/') == ([0.5] * 3, [0.25] * 3)


@pytest.mark.parametrize('architecture,named', REFUSED)
def test_an_architecture_vit_jax_does_not_compute_is_one_line(tmp_path, architecture, named):
  _saved(tmp_path / 'timm', architecture)
  with pytest.raises(ValueError, match=f'{architecture} is created with {named}, which') as error:
    prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()


def test_the_table_is_the_pinned_timms_registry():
  """vit_jax/checkpoints/timm_architectures.json is what tests/timm_registry.py writes from the
  installed timm: after a timm update, regenerate it (the module's docstring says how)."""
  with open(timm_arguments._TABLE, encoding='utf-8') as f:
    shipped = f.read()
  assert timm_arguments.timm_version() == timm.__version__
  assert shipped == timm_registry.dumps(timm_registry.table())


@pytest.mark.parametrize('architecture', list(timm_arguments._table()['architectures']))
def test_every_registered_architecture_is_timms_function_or_one_line(tmp_path, architecture):
  """The general case: each architecture of the table, tiny, either computes timm's logits or is a
  one-line ValueError; never another function, never another exception."""
  try:
    reference = _saved(
        tmp_path / 'timm', architecture, patch_size=14 if 'patch14' in architecture else 4
    )
  except AssertionError as e:  # timm's own checks of its arguments (Sapiens 2's per-block heads).
    pytest.skip(f'timm builds no tiny {architecture}: {e}')
  try:
    run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  except ValueError as error:
    assert '\n' not in str(error)
    return
  _assert_timms_logits(run, reference)


@pytest.mark.parametrize(
    'architecture', ['vit_relpos_small_patch16_224', 'vit_srelpos_small_patch16_224']
)
def test_a_timm_model_of_another_class_is_named_as_one(tmp_path, architecture):
  """Another class of timm's (relative position MLPs here): one line naming the architecture the
  config.json names, not a field it does not say, as for an unnamed checkpoint."""
  _saved(tmp_path / 'timm', architecture)
  with pytest.raises(ValueError, match=f"names timm's '{architecture}', none of timm") as error:
    prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / 'timm'), SIZE)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()
