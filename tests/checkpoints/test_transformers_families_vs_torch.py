"""Hugging Face transformers' DINOv2 (with registers, with SwiGLU), DINOv3, I-JEPA, ViTMAE, BEiT,
data2vec, AIMv2, SigLIP, SigLIP 2, CLIP and MetaCLIP 2 image towers through config.init_from: tiny
random models saved by transformers' own `save_pretrained`, their features (pooler_output) against
ours, and the model fields state_dicts.architecture reads from the files.
"""

import json

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers

import helpers
from torch_references import (
    IMAGE_SIZE,
    NUM_CLASSES,
    OR_VARIANT,
    images,
    ours,
    randomize,
    torch_outputs,
)
from vit_jax.checkpoints import state_dicts, torch_names, warm_start
from vit_jax.tasks import classification

# The tiny shape of every reference: MLP width 64 (DINOv2's from its mlp_ratio).
_TINY = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=IMAGE_SIZE,
    patch_size=4,
)
_SIZES = {
    'patch_size': 4,
    'hidden_size': 32,
    'num_layers': 2,
    'mlp_dim': 64,
    'num_heads': 2,
    'fc_norm': False,
    'final_norm': True,
    'norm_layer': 'layernorm',
    'embed_norm': False,
    'posemb': 'learn',
    'posemb_where': 'input',
    'distilled': False,
    'map_heads': None,
    'map_mlp_dim': None,
    'map_include_prefix': False,
    # EVA-02's options, which no transformers family here has.
    'key_bias': True,
    'attn_norm': False,
    'mlp_gated': False,
    'mlp_norm': False,
    'res_post_norm': False,
    'layer_scale_mlp': True,
    'num_kv_heads': None,
    'parallel_block': False,
    'diff_attention': False,
    'rope': False,
    'rope_grid': None,
}


def _dinov2(**kwargs) -> transformers.Dinov2Model:
  return transformers.Dinov2Model(
      transformers.Dinov2Config(**_TINY, mlp_ratio=2, layerscale_value=1e-5, **kwargs)
  )


def _dinov2_registers() -> transformers.Dinov2WithRegistersModel:
  return transformers.Dinov2WithRegistersModel(
      transformers.Dinov2WithRegistersConfig(
          **_TINY, mlp_ratio=2, layerscale_value=1e-5, num_register_tokens=2
      )
  )


def _dinov3(**kwargs) -> transformers.DINOv3ViTModel:
  return transformers.DINOv3ViTModel(
      transformers.DINOv3ViTConfig(**_TINY, intermediate_size=64, layerscale_value=1e-5, **kwargs)
  )


class _MaeEncoder(torch.nn.Module):
  """transformers' ViTMAEForPreTraining (the hub's facebook/vit-mae-*: an encoder and a pixel
  decoder), unmasked: its encoder's class token, LayerNormed."""

  def __init__(self):
    super().__init__()
    self.inner = transformers.ViTMAEForPreTraining(
        transformers.ViTMAEConfig(
            **_TINY,
            intermediate_size=64,
            mask_ratio=0.0,
            decoder_hidden_size=16,
            decoder_num_hidden_layers=1,
            decoder_num_attention_heads=2,
            decoder_intermediate_size=32,
        )
    )
    self.config, self.save_pretrained = self.inner.config, self.inner.save_pretrained

  def forward(self, images: torch.Tensor):
    # Unmasked, the encoder still shuffles the patches (after their position embeddings): the class
    # token's output is the same.
    hidden = self.inner.vit(pixel_values=images).last_hidden_state
    return transformers.modeling_outputs.BaseModelOutputWithPooling(pooler_output=hidden[:, 0])


def _siglip(**kwargs) -> transformers.SiglipVisionModel:
  return transformers.SiglipVisionModel(
      transformers.SiglipVisionConfig(**_TINY, intermediate_size=64, **kwargs)
  )


class _Siglip2OnImages(torch.nn.Module):
  """transformers' Siglip2VisionModel (`tower`; a new tiny one by default) on NCHW images: its
  processor's patches (row, column, channel flattened, in raster order) of the whole image, all of
  them real."""

  def __init__(self, tower=None):
    super().__init__()
    self.inner = tower or transformers.Siglip2VisionModel(
        transformers.Siglip2VisionConfig(
            **{k: v for k, v in _TINY.items() if k != 'image_size'},
            intermediate_size=64,
            num_patches=(IMAGE_SIZE // _TINY['patch_size']) ** 2,
        )
    )
    self.config, self.save_pretrained = self.inner.config, self.inner.save_pretrained

  def forward(self, images: torch.Tensor):
    b, c, h, w = images.shape
    p = _TINY['patch_size']
    patches = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1)
    return self.inner(
        pixel_values=patches.reshape(b, (h // p) * (w // p), p * p * c),
        pixel_attention_mask=torch.ones(b, (h // p) * (w // p), dtype=torch.long),
        spatial_shapes=torch.tensor([[h // p, w // p]] * b),
    )


def _clip(cls=transformers.CLIPVisionModel, **kwargs) -> transformers.PreTrainedModel:
  return cls(transformers.CLIPVisionConfig(**_TINY, intermediate_size=64, **kwargs))


class _ClipWithProjection(torch.nn.Module):
  """transformers' CLIPVisionModelWithProjection (an image encoder of the hub's diffusion pipelines):
  its tower's pooler_output, before the image-text projection, which a classifier has no use for."""

  def __init__(self):
    super().__init__()
    self.inner = _clip(transformers.CLIPVisionModelWithProjection, projection_dim=16)
    self.config, self.save_pretrained = self.inner.config, self.inner.save_pretrained

  def forward(self, images: torch.Tensor):
    return self.inner.vision_model(pixel_values=images)


def _beit(cls=transformers.BeitModel, config_cls=transformers.BeitConfig, **kwargs):
  # Data2VecVisionModel has no pooler by default.
  return cls(config_cls(**_TINY, intermediate_size=64, **kwargs), add_pooling_layer=True)


_BEIT_FIELDS = {
    'class_token': True,
    'pre_norm': False,
    'num_registers': 0,
    'layer_scale': 0.1,
    'posemb': 'relative',
    'key_bias': False,
    'mlp_activation': 'gelu',
    'layernorm_epsilon': 1e-12,
}


def _aimv2(**kwargs) -> transformers.Aimv2VisionModel:
  return transformers.Aimv2VisionModel(
      transformers.Aimv2VisionConfig(**_TINY, intermediate_size=64, **kwargs)
  )


_AIMV2_FIELDS = {
    'class_token': False,
    'pre_norm': False,
    'num_registers': 0,
    'layer_scale': None,
    'norm_layer': 'rmsnorm',
    'embed_norm': True,
    'mlp_gated': True,
    'mlp_activation': 'silu',
    'layernorm_epsilon': 1e-5,
}


def _pooled(outputs) -> torch.Tensor:
  return outputs.pooler_output


def _mean_of_tokens(outputs) -> torch.Tensor:
  # SiglipVisionModel without its head and IJepaModel have no pooler_output; their
  # *ForImageClassification pool the LayerNormed tokens' mean.
  return outputs.last_hidden_state.mean(dim=1)


_DINOV2_FIELDS = {
    'classifier': 'token',
    'class_token': True,
    'pre_norm': False,
    'num_registers': 0,
    'layer_scale': 1e-5,
    'mlp_activation': 'gelu',
    'layernorm_epsilon': 1e-6,
}

# id: (the reference, its output ours equals, the fields it fixes but the sizes).
_FAMILIES = {
    'dinov2': (
        _dinov2,
        _pooled,
        _DINOV2_FIELDS,
    ),
    'dinov2_registers': (
        _dinov2_registers,
        _pooled,
        {**_DINOV2_FIELDS, 'num_registers': 2},
    ),
    'dinov2_swiglu': (
        lambda: _dinov2(use_swiglu_ffn=True),
        _pooled,
        {
            **_DINOV2_FIELDS,
            # transformers' hidden units: 2/3 of mlp_ratio's, rounded up to a multiple of 8.
            'mlp_dim': 48,
            'mlp_gated': True,
            'mlp_activation': 'silu',  # What Dinov2SwiGLUFFN applies, whatever its hidden_act.
        },
    ),
    # qkv_bias=False: no query, key or value biases (the query's and value's zeros, no key bias).
    'dinov2_without_qkv_bias': (
        lambda: _dinov2(qkv_bias=False),
        _pooled,
        {**_DINOV2_FIELDS, 'key_bias': False},
    ),
    'vit_without_qkv_bias': (
        lambda: transformers.ViTModel(
            transformers.ViTConfig(**_TINY, intermediate_size=64, qkv_bias=False),
            add_pooling_layer=False,
        ),
        lambda outputs: outputs.last_hidden_state[:, 0],  # The class token, LayerNormed.
        {
            'classifier': 'token',
            'class_token': True,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'key_bias': False,
            'distilled': False,
            'mlp_activation': 'gelu',
            'layernorm_epsilon': 1e-12,
        },
    ),
    'dinov3': (
        lambda: _dinov3(num_register_tokens=2),
        _pooled,
        {
            'classifier': 'token',
            'class_token': True,
            'pre_norm': False,
            'num_registers': 2,
            'layer_scale': 1e-5,
            'posemb': 'none',
            'key_bias': False,
            'rope': True,
            'rope_style': 'dinov3',
            'mlp_activation': 'gelu',
            'layernorm_epsilon': 1e-5,
        },
    ),
    # Its H+ and 7B models': a gated MLP of SiLU; the key bias of a config that has one.
    'dinov3_gated_key_bias': (
        lambda: _dinov3(use_gated_mlp=True, hidden_act='silu', key_bias=True),
        _pooled,
        {
            'classifier': 'token',
            'class_token': True,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': 1e-5,
            'posemb': 'none',
            'key_bias': True,
            'mlp_gated': True,
            'rope': True,
            'rope_style': 'dinov3',
            'mlp_activation': 'silu',
            'layernorm_epsilon': 1e-5,
        },
    ),
    'ijepa': (
        lambda: transformers.IJepaModel(transformers.IJepaConfig(**_TINY, intermediate_size=64)),
        _mean_of_tokens,  # IJepaForImageClassification's pooling.
        {
            'classifier': 'gap',
            'class_token': False,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'gelu',
            'layernorm_epsilon': 1e-12,
        },
    ),
    'vit_mae': (
        _MaeEncoder,
        _pooled,
        {
            'classifier': 'token',
            'class_token': True,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'gelu',
            'layernorm_epsilon': 1e-12,
        },
    ),
    # Relative position biases in each block, the patches' mean LayerNormed (use_mean_pooling).
    'beit': (
        lambda: _beit(use_relative_position_bias=True),
        _pooled,
        {**_BEIT_FIELDS, 'classifier': 'gap', 'fc_norm': True},
    ),
    # One relative position bias all blocks share, the class token's output LayerNormed.
    'beit_shared_token': (
        lambda: _beit(use_shared_relative_position_bias=True, use_mean_pooling=False),
        _pooled,
        {**_BEIT_FIELDS, 'classifier': 'token'},
    ),
    'data2vec_vision': (
        lambda: _beit(
            transformers.Data2VecVisionModel,
            transformers.Data2VecVisionConfig,
            use_relative_position_bias=True,
        ),
        _pooled,
        {**_BEIT_FIELDS, 'classifier': 'gap', 'fc_norm': True},
    ),
    'siglip': (
        _siglip,
        _pooled,
        {
            'classifier': 'map',
            'class_token': False,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'gelu_tanh',
            'layernorm_epsilon': 1e-6,
        },
    ),
    'siglip2': (
        _Siglip2OnImages,
        _pooled,
        {
            'classifier': 'map',
            'class_token': False,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'gelu_tanh',
            'layernorm_epsilon': 1e-6,
        },
    ),
    'siglip_without_head': (
        lambda: _siglip(vision_use_head=False),
        _mean_of_tokens,
        {
            'classifier': 'gap',
            'class_token': False,
            'pre_norm': False,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'gelu_tanh',
            'layernorm_epsilon': 1e-6,
        },
    ),
    # AIMv2 without biases in its blocks, its RMSNormed tokens' mean (timm's pooling of it).
    'aimv2': (
        lambda: _aimv2(use_head=False),
        _mean_of_tokens,
        {**_AIMV2_FIELDS, 'classifier': 'gap', 'key_bias': False},
    ),
    # Of native resolution: MAE's sin-cos position embeddings of each image's grid, no tensor.
    'aimv2_native': (
        lambda: _aimv2(use_head=False, is_native=True),
        _mean_of_tokens,
        {**_AIMV2_FIELDS, 'classifier': 'gap', 'key_bias': False, 'posemb': 'sincos2d_mae'},
    ),
    # With biases, and the LiT models' attention-pooling head: our MAP head.
    'aimv2_head_biases': (
        lambda: _aimv2(use_head=True, qkv_bias=True, mlp_bias=True),
        _pooled,
        {**_AIMV2_FIELDS, 'classifier': 'map', 'key_bias': True},
    ),
    'clip': (
        _clip,
        _pooled,
        {
            'classifier': 'token',
            'class_token': True,
            'pre_norm': True,
            'num_registers': 0,
            'layer_scale': None,
            'mlp_activation': 'quick_gelu',
            'layernorm_epsilon': 1e-5,
        },
    ),
}
_FAMILIES['clip_with_projection'] = (_ClipWithProjection, _pooled, _FAMILIES['clip'][2])


def _saved(family: str, directory) -> tuple[torch.nn.Module, str]:
  reference = randomize(_FAMILIES[family][0]())
  reference.save_pretrained(directory)
  return reference, str(directory)


def _overrides(fields: dict) -> dict:
  """--config overrides that set every model field the checkpoint fixes (a named variant's)."""
  return {f'model.{name}': value for name, value in fields.items() if value is not None}


@pytest.mark.parametrize('family', list(_FAMILIES))
def test_a_transformers_family_loads_with_its_features(tmp_path, family):
  reference, path = _saved(family, tmp_path / family)
  _, output, fields = _FAMILIES[family]
  expected = output(torch_outputs(reference, images())).numpy()
  np.testing.assert_allclose(
      ours(path, **_overrides(fields)), expected, atol=1e-4 * np.abs(expected).max()
  )


@pytest.mark.parametrize('size', [12, 28])
def test_siglip2_elsewhere_than_its_grid_is_ours_resized_bilinear_antialiased(tmp_path, size):
  """SigLIP 2 (NaFlex) resizes its 4 x 4 position embeddings to each image's grid, bilinearly at
  pixel centres, antialiased: ours, resized once to the run's grid with that method, at 3 x 3 and
  7 x 7."""
  tower = transformers.Siglip2VisionModel(
      transformers.Siglip2VisionConfig(
          **{k: v for k, v in _TINY.items() if k != 'image_size'},
          intermediate_size=64,
          num_patches=16,
      )
  )
  reference = randomize(_Siglip2OnImages(tower))
  reference.save_pretrained(tmp_path / 'siglip2')
  inputs = np.random.RandomState(1).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  expected = torch_outputs(reference, inputs).pooler_output.numpy()
  features = ours(
      str(tmp_path / 'siglip2'),
      inputs=inputs,
      image_size=size,
      posemb_interpolation='bilinear_antialiased',
      **_overrides(_FAMILIES['siglip2'][2]),
  )
  np.testing.assert_allclose(features, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(
    'family,method,kwargs',
    [
        ('dinov2', 'bicubic_torch', {}),  # Always resized to the image's grid.
        ('vit_without_qkv_bias', 'bicubic_torch', {'interpolate_pos_encoding': True}),
        ('dinov2_registers', 'bicubic', {}),  # Its interpolate_pos_encoding antialiases.
    ],
)
@pytest.mark.parametrize('size', [12, 28])
def test_a_transformers_model_at_another_image_size_is_ours_resized_by_its_method(
    tmp_path, family, method, kwargs, size
):
  """transformers resizes a checkpoint's position embeddings to each image's grid as it runs: ours,
  resized once to the run's grid by config.posemb_interpolation, computes the same features at
  3 x 3 and 7 x 7 patches from the checkpoint's 2 x 2."""
  reference, path = _saved(family, tmp_path / family)
  inputs = np.random.RandomState(1).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  expected = _FAMILIES[family][1](torch_outputs(reference, inputs, **kwargs)).numpy()
  features = ours(
      path,
      inputs=inputs,
      image_size=size,
      posemb_interpolation=method,
      **_overrides(_FAMILIES[family][2]),
  )
  np.testing.assert_allclose(features, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize('family', list(_FAMILIES))
def test_a_transformers_familys_fields_are_read_from_its_files(tmp_path, family):
  _, path = _saved(family, tmp_path / family)
  assert state_dicts.architecture(path) == {**_SIZES, **_FAMILIES[family][2]}


@pytest.mark.parametrize(
    'family', ['dinov2_registers', 'dinov3', 'ijepa', 'siglip_without_head', 'clip']
)
def test_variant_checkpoint_builds_a_transformers_familys_vit_from_its_files(tmp_path, family):
  reference, path = _saved(family, tmp_path / family)
  _, output, fields = _FAMILIES[family]
  unset = {f'model.{name}': None for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')}
  config = helpers.load_config(
      'demo',
      {**unset, 'variant': 'checkpoint', 'init_from': path, 'image_size': IMAGE_SIZE},
  )
  warm_start.fill_from_checkpoint(config)
  model_config = helpers.model_config(config)
  assert {name: model_config[name] for name in fields} == fields
  model = classification.make_model(config, model_config, None)
  features = model.apply({'params': warm_start.load_init_params(config, model)}, images())
  expected = output(torch_outputs(reference, images())).numpy()
  np.testing.assert_allclose(features, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize('family', list(_FAMILIES))
def test_a_config_json_without_the_defaults_gives_transformers_defaults(tmp_path, family):
  # transformers 4's save_pretrained left out the values equal to its config class's defaults.
  reference, path = _saved(family, tmp_path / family)
  config_json = tmp_path / family / 'config.json'
  config = json.loads(config_json.read_text())
  for key in ('hidden_act', 'layer_norm_eps', 'rms_norm_eps', 'layerscale_value'):
    config.pop(key, None)
  config_json.write_text(json.dumps(config))
  theirs = type(reference.config).from_pretrained(path)  # As transformers reads it back.
  fields = state_dicts.architecture(path)
  # DINOv2's SwiGLU MLP applies SiLU whatever its hidden_act.
  activation = 'silu' if family == 'dinov2_swiglu' else theirs.hidden_act
  assert fields['mlp_activation'] == torch_names.activation(activation, path)
  epsilon = theirs.rms_norm_eps if family.startswith('aimv2') else theirs.layer_norm_eps
  assert fields['layernorm_epsilon'] == epsilon
  if family.startswith('dinov'):
    assert fields['layer_scale'] == theirs.layerscale_value


@pytest.mark.parametrize(
    'make',
    [
        lambda: transformers.DINOv3ViTModel(  # ViT-S's 6 heads (facebook/dinov3-vits16-*).
            transformers.DINOv3ViTConfig(**{**_TINY, 'hidden_size': 48, 'num_attention_heads': 6})
        ),
        lambda: transformers.Aimv2VisionModel(  # AIMv2's 8.
            transformers.Aimv2VisionConfig(**{**_TINY, 'num_attention_heads': 8}, use_head=False)
        ),
        lambda: transformers.ViTModel(  # The others' 12.
            transformers.ViTConfig(**{**_TINY, 'hidden_size': 48, 'num_attention_heads': 12})
        ),
    ],
)
def test_a_config_json_without_its_heads_gives_the_config_classs(tmp_path, make):
  """A config.json may leave out what equals its config class's default (transformers' use_diff):
  the heads it leaves out are that class's (DINOv3's 6, AIMv2's 8, ViT's 12), as transformers reads
  them back, not another family's."""
  reference = make()
  reference.save_pretrained(tmp_path / 'model')
  config_json = tmp_path / 'model' / 'config.json'
  config = json.loads(config_json.read_text())
  assert config.pop('num_attention_heads') == type(reference.config)().num_attention_heads
  config_json.write_text(json.dumps(config))
  theirs = type(reference.config).from_pretrained(tmp_path / 'model').num_attention_heads
  assert state_dicts.architecture(str(tmp_path / 'model'))['num_heads'] == theirs


def test_a_transformers_vision_tower_written_by_transformers_4_loads_too(tmp_path):
  """transformers 4 wrote CLIPVisionModel's and SiglipVisionModel's names under `vision_model.`, with
  the `position_ids` buffer (0, 1, ...): the same features, the buffer dropped."""
  reference, path = _saved('clip', tmp_path / 'clip')
  tensors = {f'vision_model.{k}': v for k, v in reference.state_dict().items()}
  tensors['vision_model.embeddings.position_ids'] = torch.arange(5)[None]
  safetensors.torch.save_file(tensors, tmp_path / 'clip' / 'model.safetensors')
  expected = torch_outputs(reference, images()).pooler_output.numpy()
  fields = _FAMILIES['clip'][2]
  np.testing.assert_allclose(
      ours(path, **_overrides(fields)), expected, atol=1e-4 * np.abs(expected).max()
  )
  assert state_dicts.architecture(path) == {**_SIZES, **fields}


@pytest.mark.parametrize(
    'family,model,message',
    [
        (
            'dinov2',
            {'layernorm_epsilon': 1e-12, 'mlp_activation': 'gelu'},
            r"the checkpoint's LayerNorm epsilon is 1e-06, the model's 1e-12: set "
            r'--config.model.layernorm_epsilon=1e-06',
        ),
        (
            'siglip',
            {'layernorm_epsilon': 1e-6, 'mlp_activation': 'gelu'},
            r"the checkpoint's MLP activation is 'gelu_tanh', the model's 'gelu': set "
            r'--config.model.mlp_activation=gelu_tanh',
        ),
    ],
)
def test_a_field_without_tensors_that_differs_is_a_one_line_error(tmp_path, family, model, message):
  # Neither has tensors: the weights would load and compute another function.
  _, path = _saved(family, tmp_path / family)
  with pytest.raises(ValueError, match=message + OR_VARIANT) as error:
    state_dicts.load(path, {'num_heads': 2, **model})
  assert '\n' not in str(error.value)


@pytest.mark.parametrize(
    'reference,overrides,message',
    [
        (  # SimMIM's pixel decoder (a 1x1 convolution and a pixel shuffle).
            lambda: transformers.ViTForMaskedImageModeling(
                transformers.ViTConfig(**_TINY, intermediate_size=64)
            ),
            {'model.layernorm_epsilon': 1e-12},
            r"transformers tensor 'decoder.0.bias' \(768,\) has no counterpart in "
            r"vit_jax's ViT \(3 such\)",
        ),
    ],
    ids=['vit_simmim'],
)
def test_a_transformers_model_with_parts_ours_has_not_is_a_one_line_error(
    tmp_path, reference, overrides, message
):
  randomize(reference()).save_pretrained(tmp_path / 'hf')
  with pytest.raises(ValueError, match=message) as error:
    ours(str(tmp_path / 'hf'), **overrides)
  assert '\n' not in str(error.value)


@pytest.mark.parametrize('size', [IMAGE_SIZE, 2 * IMAGE_SIZE])
def test_a_native_resolution_aimv2_is_maes_fixed_sin_cos_at_any_resolution(tmp_path, size):
  """Its position embeddings have no tensor: transformers computes MAE's sin-cos table for each
  image's grid, as model.posemb='sincos2d_mae' (read from the files) does."""
  reference, path = _saved('aimv2_native', tmp_path / 'native')
  assert state_dicts.architecture(path)['posemb'] == 'sincos2d_mae'
  inputs = np.random.RandomState(1).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  features = ours(path, inputs=inputs, image_size=size, **_overrides(_FAMILIES['aimv2_native'][2]))
  expected = _mean_of_tokens(torch_outputs(reference, inputs)).numpy()
  np.testing.assert_allclose(features, expected, atol=1e-4 * np.abs(expected).max())


def _whole(cls, config_cls, **vision) -> torch.nn.Module:
  """A whole SigLIP or CLIP model (image and text towers) as the hub's google/siglip-*,
  google/siglip2-*, openai/clip-* hold it."""
  text = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
  vision = {
      **{k: v for k, v in _TINY.items() if k != 'image_size'},
      'intermediate_size': 64,
      **vision,
  }
  return cls(config_cls(vision_config=vision, text_config={**text, 'vocab_size': 50000}))


_WHOLE = {
    'siglip': (
        lambda: _whole(transformers.SiglipModel, transformers.SiglipConfig, image_size=IMAGE_SIZE),
        lambda model, x: torch_outputs(model.vision_model, x).pooler_output,
    ),
    'siglip2': (
        lambda: _whole(
            transformers.Siglip2Model,
            transformers.Siglip2Config,
            num_patches=(IMAGE_SIZE // _TINY['patch_size']) ** 2,
        ),
        lambda model, x: torch_outputs(_Siglip2OnImages(model.vision_model), x).pooler_output,
    ),
    'clip': (
        lambda: _whole(transformers.CLIPModel, transformers.CLIPConfig, image_size=IMAGE_SIZE),
        lambda model, x: torch_outputs(model.vision_model, x).pooler_output,
    ),
    # MetaCLIP 2 (the hub's facebook/metaclip-2-*): CLIP's names and image tower.
    'metaclip_2': (
        lambda: _whole(
            transformers.MetaClip2Model, transformers.MetaClip2Config, image_size=IMAGE_SIZE
        ),
        lambda model, x: torch_outputs(model.vision_model, x).pooler_output,
    ),
    # The hub's apple/aimv2-*-lit: its image tower pools with its attention head.
    'aimv2': (
        lambda: _whole(transformers.Aimv2Model, transformers.Aimv2Config, image_size=IMAGE_SIZE),
        lambda model, x: torch_outputs(model.vision_model, x).pooler_output,
    ),
}


@pytest.mark.parametrize('kind', list(_WHOLE))
def test_the_image_tower_of_a_whole_siglip_or_clip_model_loads(tmp_path, kind):
  """Its text tower, projections and logit scale dropped; its fields from the vision_config."""
  make, features = _WHOLE[kind]
  reference = randomize(make()).eval()
  reference.save_pretrained(tmp_path / kind)
  unset = {f'model.{name}': None for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')}
  config = helpers.load_config(
      'demo',
      {
          **unset,
          'variant': 'checkpoint',
          'init_from': str(tmp_path / kind),
          'image_size': IMAGE_SIZE,
      },
  )
  warm_start.fill_from_checkpoint(config)
  model_config = helpers.model_config(config)
  vision = reference.config.vision_config
  assert model_config['num_heads'] == vision.num_attention_heads == 2
  epsilon = vision.rms_norm_eps if kind == 'aimv2' else vision.layer_norm_eps
  assert model_config['layernorm_epsilon'] == epsilon
  assert model_config['mlp_activation'] == torch_names.activation(vision.hidden_act, 'x')
  model = classification.make_model(config, model_config, None)
  ours = model.apply({'params': warm_start.load_init_params(config, model)}, images())
  expected = features(reference, images()).numpy()
  np.testing.assert_allclose(ours, expected, atol=1e-4 * np.abs(expected).max())


def test_a_dinov3_state_dict_under_transformers_5_module_names_loads_too(tmp_path):
  """transformers 5 names DINOv3's blocks `model.layer.{i}.` in memory (its files, as the hub's,
  `layer.{i}.`): torch.save of a state dict beside its config.json gives the same features."""
  reference, path = _saved('dinov3', tmp_path / 'dinov3')
  tensors = reference.state_dict()
  assert any(name.startswith('model.layer.0.') for name in tensors)
  (tmp_path / 'dinov3' / 'model.safetensors').unlink()
  safetensors.torch.save_file(
      {k: v.contiguous() for k, v in tensors.items()}, tmp_path / 'dinov3' / 'model.safetensors'
  )
  _, output, fields = _FAMILIES['dinov3']
  expected = output(torch_outputs(reference, images())).numpy()
  np.testing.assert_allclose(
      ours(path, **_overrides(fields)), expected, atol=1e-4 * np.abs(expected).max()
  )
  assert state_dicts.architecture(path) == {**_SIZES, **fields}


def test_a_transformers_distilled_deit_gives_its_logits(tmp_path):
  """DeiTForImageClassificationWithTeacher (the hub's facebook/deit-*-distilled-*): the class and
  distillation tokens, each with its head, the logits their mean, as ours (model.distilled)."""
  reference = randomize(
      transformers.DeiTForImageClassificationWithTeacher(
          transformers.DeiTConfig(**_TINY, intermediate_size=64, num_labels=NUM_CLASSES)
      )
  ).eval()
  reference.save_pretrained(tmp_path / 'deit')
  fields = state_dicts.architecture(str(tmp_path / 'deit'))
  assert fields == {
      **_SIZES,
      'classifier': 'token',
      'class_token': True,
      'distilled': True,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
      'mlp_activation': 'gelu',
      'layernorm_epsilon': 1e-12,
  }
  expected = torch_outputs(reference, images()).logits.numpy()
  logits = ours(str(tmp_path / 'deit'), NUM_CLASSES, **_overrides(fields))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())


@pytest.mark.parametrize(
    'cls,config_cls,registers',
    [
        (transformers.Dinov2ForImageClassification, transformers.Dinov2Config, {}),
        (
            transformers.Dinov2WithRegistersForImageClassification,
            transformers.Dinov2WithRegistersConfig,
            {'num_register_tokens': 2},
        ),
    ],
    ids=['dinov2', 'dinov2_registers'],
)
def test_a_transformers_dinov2_classifier_gives_its_logits(tmp_path, cls, config_cls, registers):
  """Dinov2ForImageClassification (the hub's facebook/dinov2-*-imagenet1k-1-layer): its linear head
  reads the class token and the patches' mean (not the registers') side by side, our
  classifier='token_gap'."""
  reference = randomize(
      cls(config_cls(**_TINY, mlp_ratio=2, num_labels=NUM_CLASSES, **registers))
  ).eval()
  reference.save_pretrained(tmp_path / 'dinov2')
  path = str(tmp_path / 'dinov2')
  fields = state_dicts.architecture(path)
  assert fields['classifier'] == 'token_gap' and fields['class_token']
  assert fields['num_registers'] == registers.get('num_register_tokens', 0)
  expected = torch_outputs(reference, images()).logits.numpy()
  logits = ours(path, NUM_CLASSES, **_overrides(fields))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())


def test_a_transformers_beit_classifier_gives_its_logits_from_an_older_file(tmp_path):
  """BeitForImageClassification (the hub's microsoft/beit-*): its classifier reads the pooled
  patches' mean; the hub's older files also hold each block's relative_position_index, a buffer
  computed from the grid (transformers ignores it on load), which is left out here too."""
  reference = randomize(
      transformers.BeitForImageClassification(
          transformers.BeitConfig(
              **_TINY,
              intermediate_size=64,
              num_labels=NUM_CLASSES,
              use_relative_position_bias=True,
          )
      )
  ).eval()
  reference.save_pretrained(tmp_path / 'beit')
  weights = tmp_path / 'beit' / 'model.safetensors'
  tensors = safetensors.torch.load_file(weights)
  for i in range(2):
    bias = f'beit.encoder.layer.{i}.attention.attention.relative_position_bias.'
    tensors[bias + 'relative_position_index'] = torch.zeros((50, 50), dtype=torch.int64)
  safetensors.torch.save_file(tensors, weights, metadata={'format': 'pt'})
  fields = state_dicts.architecture(str(tmp_path / 'beit'))
  assert fields == {**_SIZES, **_BEIT_FIELDS, 'classifier': 'gap', 'fc_norm': True}
  expected = torch_outputs(reference, images()).logits.numpy()
  logits = ours(str(tmp_path / 'beit'), NUM_CLASSES, **_overrides(fields))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())


def test_a_transformers_siglip_classifier_gives_its_logits(tmp_path):
  """SiglipForImageClassification (over a whole SigLIP, as the hub's google/siglip-* load): its
  classifier reads the tokens' mean, its tower's attention-pooling head unread (our classifier='gap');
  peft's adapters over a whole SigLIP hold it beside the text tower's names."""
  config = transformers.SiglipConfig(
      vision_config=dict(_TINY, intermediate_size=64),
      text_config=dict(_TINY, intermediate_size=64, vocab_size=64),
      num_labels=NUM_CLASSES,
  )
  reference = randomize(transformers.SiglipForImageClassification(config)).eval()
  reference.save_pretrained(tmp_path / 'siglip')
  path = str(tmp_path / 'siglip')
  tensors = safetensors.torch.load_file(tmp_path / 'siglip' / 'model.safetensors')
  assert 'vision_model.head.probe' in tensors  # Unread by the classifier.
  fields = state_dicts.architecture(path)
  assert fields['classifier'] == 'gap'
  expected = torch_outputs(reference, images()).logits.numpy()
  logits = ours(path, NUM_CLASSES, **_overrides(fields))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())
  # Beside a text tower (peft's classifier over a whole SigLIP): the same model.
  text = transformers.SiglipModel(config).state_dict()
  tensors.update({k: v for k, v in text.items() if k.startswith('text_model.')})
  safetensors.torch.save_file(tensors, tmp_path / 'siglip' / 'model.safetensors')
  logits = ours(path, NUM_CLASSES, **_overrides(fields))
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())
