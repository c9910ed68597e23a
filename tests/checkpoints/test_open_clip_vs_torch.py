"""OpenCLIP's checkpoints through config.init_from, as its hub directories hold them: random tiny
CLIP models of each kind of image tower, written by open_clip's own `save_for_hf`
(open_clip_model.safetensors, open_clip_pytorch_model.bin, open_clip_config.json). Our model's
outputs are open_clip's `encode_image` embeddings; what vit_jax's ViT does not compute is a
one-line error before anything is written."""

import functools
import json
import re
import types

import numpy as np
import open_clip
import pytest
import timm
import torch
from open_clip.push_to_hf_hub import save_for_hf

import helpers
from torch_references import (
    prepared_from_checkpoint,
    randomize,
    timm_input,
    timm_rebuilt,
    torch_outputs,
)
from vit_jax.checkpoints import timm_arguments, torch_files, warm_start
from vit_jax.tasks import classification

SIZE = 28
EMBEDDING = 10  # The demo's classes: a head into the text tower's space is kept as the logits.
_TEXT = {'context_length': 8, 'vocab_size': 64, 'width': 32, 'heads': 2, 'layers': 1}
# Another normalisation than OpenAI's (open_clip's default), which must be folded into the weights.
_MEAN, _STD = (0.4, 0.5, 0.6), (0.2, 0.3, 0.25)


def _native(quick_gelu: bool = False, **vision) -> dict:
  """The model config of a CLIP of open_clip's own VisionTransformer, tiny: 2 heads of 16."""
  tower = {'image_size': SIZE, 'patch_size': 4, 'width': 32, 'head_width': 16, 'layers': 2}
  config = {'embed_dim': EMBEDDING, 'vision_cfg': {**tower, **vision}, 'text_cfg': _TEXT}
  return {**config, 'quick_gelu': True} if quick_gelu else config


def _trunk(name: str, pool: str, proj, **vision) -> dict:
  """The model config of a CLIP of timm's `name` (made tiny by `_tiny_timm`)."""
  tower = {'image_size': SIZE, 'timm_model_name': name, 'timm_pool': pool, 'timm_proj': proj}
  return {'embed_dim': EMBEDDING, 'vision_cfg': {**tower, **vision}, 'text_cfg': _TEXT}


# One of each kind of tower the hub's OpenCLIP models have: open_clip's own (laion's, OpenAI's and
# DFN's QuickGELU, CLIPA's pooled mean normalised after the pooling without a LayerNorm before the
# blocks, layer scale, and the other pooling options), and timm's (SigLIP's MAP head without a
# projection, Perception Encoder's and EVA-02's with timm's head, a linear projection of timm's
# pooling or of another one).
TOWERS = {
    'clip': _native(),
    'quick_gelu': _native(quick_gelu=True),
    'clipa': _native(no_ln_pre=True, pool_type='avg', final_ln_after_pool=True),
    'layer_scale': _native(ls_init_value=1e-4),
    'mean_of_normalised_patches': _native(pool_type='avg'),
    'token_normalised_after': _native(final_ln_after_pool=True),
    'epsilon': _native(norm_kwargs={'eps': 1e-6}),
    'fixed_sin_cos_position_embeddings': _native(pos_embed_type='sin_cos_2d'),
    'siglip': _trunk('vit_base_patch16_siglip_224', 'map', 'none'),
    'pe_core': _trunk('vit_pe_core_tiny_patch16_384', 'map', None),
    'eva02': _trunk('eva02_base_patch16_clip_224', 'token', None),
    'linear_projection': _trunk('vit_medium_patch16_gap_256', '', 'linear'),
    'linear_projection_of_another_pooling': _trunk(
        'vit_base_patch16_224', 'avg', 'linear', timm_proj_bias=True
    ),
}


def _tiny_timm(create_model):
  """timm.create_model of tiny models with the architecture's heads (which the config, naming only
  the architecture, says), 16 units each."""

  @functools.wraps(create_model)
  def tiny(name, **kwargs):
    heads = timm_arguments.architectures()[name]['args'].get('num_heads', 12)
    tiny_size = dict(img_size=SIZE, patch_size=4, embed_dim=16 * heads, depth=2)
    return create_model(name, **{**kwargs, **tiny_size})

  return tiny


def _saved(directory, model_config: dict, monkeypatch) -> torch.nn.Module:
  """A random CLIP of `model_config`, written as open_clip writes a hub directory."""
  with monkeypatch.context() as patched:
    patched.setattr(timm, 'create_model', _tiny_timm(timm.create_model))
    reference = randomize(open_clip.model.CLIP(**model_config)).eval()
  reference.visual.image_mean, reference.visual.image_std = _MEAN, _STD
  no_tokenizer = types.SimpleNamespace(save_pretrained=lambda directory: None)
  save_for_hf(reference, no_tokenizer, model_config, directory)
  return reference


def _theirs(reference: torch.nn.Module, inputs: np.ndarray) -> np.ndarray:
  """open_clip's image embeddings of our images x = 2u - 1, normalised as its config says."""
  pixels = ((inputs + 1) / 2 - np.asarray(_MEAN)) / np.asarray(_STD)
  with torch.no_grad():
    nchw = torch.from_numpy(pixels.transpose(0, 3, 1, 2).astype(np.float32))
    return reference.encode_image(nchw).numpy()


def _has_head(model_config: dict) -> bool:
  """Whether the tower projects into the text tower's space (timm_proj='none' is its features)."""
  return model_config['vision_cfg'].get('timm_proj', 'linear') != 'none'


def _ours(path: str, has_head: bool, inputs: np.ndarray) -> tuple[np.ndarray, dict]:
  """Our outputs (the logits of the checkpoint's head, or where it has none its features) of the
  model config.variant='checkpoint' builds from `path`, and its fields."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': path,
          'image_size': SIZE,
          'keep_head': has_head,
      },
  )
  warm_start.fill_from_checkpoint(config)
  model_config = helpers.model_config(config)
  model = classification.make_model(config, model_config, EMBEDDING if has_head else None)
  params = warm_start.load_init_params(config, model)
  return np.asarray(model.apply({'params': params}, inputs)), model_config


def _inputs() -> np.ndarray:
  return np.random.RandomState(0).uniform(-1, 1, (2, SIZE, SIZE, 3)).astype(np.float32)


@pytest.mark.parametrize('tower', list(TOWERS))
def test_an_open_clip_image_tower_gives_its_embeddings(tmp_path, monkeypatch, tower):
  reference = _saved(tmp_path / tower, TOWERS[tower], monkeypatch)
  ours, _ = _ours(str(tmp_path / tower), _has_head(TOWERS[tower]), _inputs())
  theirs = _theirs(reference, _inputs())
  np.testing.assert_allclose(ours, theirs, atol=1e-4 * np.abs(theirs).max())


# The fields each kind fixes that no tensor shows: heads (its width over head_width, or the
# architecture's), activation, epsilon and pooling.
FIELDS = {
    'clip': {
        'num_heads': 2,
        'mlp_activation': 'gelu',
        'layernorm_epsilon': 1e-5,
        'pre_norm': True,
        'classifier': 'token',
        'fc_norm': False,
    },
    'quick_gelu': {'mlp_activation': 'quick_gelu'},
    'clipa': {'pre_norm': False, 'classifier': 'gap', 'fc_norm': True},
    'mean_of_normalised_patches': {'classifier': 'gap', 'fc_norm': False},
    'layer_scale': {'layer_scale': 1e-4},
    'epsilon': {'layernorm_epsilon': 1e-6},
    'siglip': {'num_heads': 12, 'classifier': 'map', 'mlp_activation': 'gelu'},
    'pe_core': {'num_heads': 3, 'classifier': 'map', 'rope': True, 'rope_style': 'pe'},
}


@pytest.mark.parametrize('tower', list(FIELDS))
def test_an_open_clip_towers_fields_are_read_from_its_config(tmp_path, monkeypatch, tower):
  _saved(tmp_path / tower, TOWERS[tower], monkeypatch)
  _, model_config = _ours(str(tmp_path / tower), _has_head(TOWERS[tower]), _inputs())
  assert {field: model_config[field] for field in FIELDS[tower]} == FIELDS[tower]


def test_its_pickled_weights_and_its_file_beside_transformers_config_load(tmp_path, monkeypatch):
  """A directory of open_clip_pytorch_model.bin alone; the file named beside a config.json of
  another model (laion's directories hold transformers' CLIPModel beside OpenCLIP's)."""
  directory = tmp_path / 'clip'
  reference = _saved(directory, TOWERS['quick_gelu'], monkeypatch)
  theirs = _theirs(reference, _inputs())
  (directory / 'open_clip_model.safetensors').rename(tmp_path / 'open_clip_model.safetensors')
  np.testing.assert_allclose(_ours(str(directory), True, _inputs())[0], theirs, atol=1e-5)
  (tmp_path / 'open_clip_config.json').write_text((directory / 'open_clip_config.json').read_text())
  other = {'model_type': 'clip', 'vision_config': {'num_attention_heads': 4, 'hidden_act': 'gelu'}}
  (tmp_path / 'config.json').write_text(json.dumps(other))
  ours, _ = _ours(str(tmp_path / 'open_clip_model.safetensors'), True, _inputs())
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


@pytest.mark.parametrize('tower', ['quick_gelu', 'clipa', 'layer_scale', 'pe_core'])
def test_an_open_clip_tower_exports_to_timm_with_its_embeddings(tmp_path, monkeypatch, tower):
  reference = _saved(tmp_path / tower, TOWERS[tower], monkeypatch)
  run = prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / tower), SIZE)
  rebuilt = timm_rebuilt(
      run.init_params, run.model_config, SIZE, run.config.pp_eval.to_dict(), tmp_path / 'export'
  )
  theirs = _theirs(reference, _inputs())
  exported = torch_outputs(rebuilt, timm_input(rebuilt, _inputs())).numpy()
  np.testing.assert_allclose(exported, theirs, atol=1e-4 * np.abs(theirs).max())


def test_openais_torchscript_file_reads_as_open_clip_reads_it(tmp_path):
  """OpenAI's CLIP `.pt` files are TorchScript archives without a config: open_clip's
  `load_openai_model` reads one as a CLIP of QuickGELU and heads of 64."""
  wide = {'width': 128, 'head_width': 64}
  model_config = {**_native(quick_gelu=True, **wide), 'text_cfg': {**_TEXT, 'width': 64}}
  reference = randomize(open_clip.model.CLIP(**model_config)).eval()
  del reference.attn_mask  # The text tower's, a buffer of open_clip's; no tensor of OpenAI's files.
  # OpenAI's files hold the weights of the products in float16.
  open_clip.model.convert_weights_to_fp16(reference)
  path = tmp_path / 'ViT-T-4.pt'
  image = torch.zeros(1, 3, SIZE, SIZE, dtype=torch.float16)
  torch.jit.save(
      torch.jit.trace_module(reference, {'encode_image': image}, check_trace=False), path
  )
  openai = open_clip.load_openai_model(str(path), device='cpu').eval()
  pixels = ((_inputs() + 1) / 2 - np.asarray(open_clip.OPENAI_DATASET_MEAN)) / np.asarray(
      open_clip.OPENAI_DATASET_STD
  )
  with torch.no_grad():
    theirs = openai.encode_image(torch.from_numpy(pixels.transpose(0, 3, 1, 2).astype(np.float32)))
  ours, model_config = _ours(str(path), True, _inputs())
  np.testing.assert_allclose(ours, theirs.numpy(), atol=1e-4 * np.abs(theirs.numpy()).max())
  assert (model_config['mlp_activation'], model_config['num_heads']) == ('quick_gelu', 2)


REFUSED = {
    'coca': (
        _native(attentional_pool=True, attn_pooler_queries=4, attn_pooler_heads=2),
        "CoCa's attentional pooler",
    ),
    'custom_blocks': (_native(qk_norm=True), 'custom blocks (qk_norm)'),
    'no_pooling': (_native(pool_type='none'), "pool_type='none'"),
    'mlp_projection': (
        _trunk('vit_base_patch16_224', 'avg', 'mlp'),
        'projects with an MLP',
    ),
    'no_pooled_token': (_trunk('vit_base_patch16_224', '', 'none'), 'pools no token'),
}


@pytest.mark.parametrize('tower', list(REFUSED))
def test_an_open_clip_tower_vit_jax_does_not_compute_is_one_line(tmp_path, monkeypatch, tower):
  model_config, named = REFUSED[tower]
  _saved(tmp_path / tower, model_config, monkeypatch)
  with pytest.raises(ValueError, match=f"OpenCLIP's image tower .*{re.escape(named)}") as error:
    prepared_from_checkpoint(tmp_path / 'workdir', str(tmp_path / tower), SIZE)
  assert '\n' not in str(error.value)
  assert not (tmp_path / 'workdir').exists()


def test_a_timm_tower_that_is_no_vit_or_no_config_is_one_line(tmp_path):
  directory = tmp_path / 'convnext'
  directory.mkdir()
  tensors = {'visual.trunk.stem.0.weight': np.zeros((8, 3, 4, 4), np.float32)}
  torch_files.write_safetensors(tensors, str(directory / 'open_clip_model.safetensors'))
  with pytest.raises(ValueError, match="'s image tower is timm's convnext_base, not one of") as e:
    (directory / 'open_clip_config.json').write_text(
        json.dumps({'model_cfg': _trunk('convnext_base', '', 'linear')})
    )
    prepared_from_checkpoint(tmp_path / 'workdir', str(directory), SIZE)
  assert '\n' not in str(e.value)
  (directory / 'open_clip_config.json').unlink()
  with pytest.raises(ValueError, match='without the open_clip_config.json beside them') as e:
    prepared_from_checkpoint(tmp_path / 'workdir', str(directory), SIZE)
  assert '\n' not in str(e.value)
  assert not (tmp_path / 'workdir').exists()
