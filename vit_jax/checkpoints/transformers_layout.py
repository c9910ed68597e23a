"""Hugging Face transformers' ViTs in (`from_state_dict`), told apart by their tensors' names (a
config.json may be absent); transformers_families.py maps each family:

- `ViTModel` / `ViTForImageClassification` (model_type 'vit'), and the encoders of `ViTMAEModel`,
  `ViTMAEForPreTraining` ('vit_mae': its decoder dropped; transformers_mae.py reads it for
  config.task='mae') and `ViTMSNModel` ('vit_msn');
- `DeiTModel`, `DeiTForImageClassificationWithTeacher` ('deit');
- `IJepaModel`, `IJepaForImageClassification` ('ijepa');
- `Dinov2Model` ('dinov2') and `Dinov2WithRegistersModel` ('dinov2_with_registers');
- `DINOv3ViTModel` ('dinov3_vit');
- `SiglipVisionModel` ('siglip_vision_model'), with its attention-pooling head or without, and
  `Siglip2VisionModel` ('siglip2_vision_model');
- `CLIPVisionModel` ('clip_vision_model');
- `Aimv2VisionModel` ('aimv2_vision_model');
- the image tower of a whole `SiglipModel`, `Siglip2Model`, `CLIPModel` (`MetaClip2Model`'s names
  too) or `Aimv2Model` (the hub's google/siglip-*, google/siglip2-*, openai/clip-*,
  facebook/metaclip-2-*, apple/aimv2-*-lit), its config.json's `vision_config`.

What has no tensor (heads, the MLP's activation, the LayerNorm epsilon) is checked against the
config.json `save_pretrained` writes beside the weights, each config class's default where it leaves
a key out.
"""

from typing import Any, Mapping, Optional

from flax import traverse_util
import numpy as np

from vit_jax.checkpoints import torch_files, torch_names
from vit_jax.checkpoints import transformers_families as families
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints.torch_files import StateDict


def from_state_dict(
    state_dict: StateDict,
    num_heads: int,
    source: str = 'state dict',
    map_heads: Optional[int] = None,
) -> dict[str, Any]:
  """The nested tree of a transformers ViT state dict of one of the families above."""
  # Every family's attention pooling (SigLIP's) has num_heads heads: `architecture` fixes
  # map_heads=None, which state_dicts.load checks against the model's.
  del map_heads
  state_dict = parts.unprefixed(state_dict)
  family = _family(state_dict, source)
  r = torch_names.Reader(state_dict, source, 'transformers')
  tree = family.tree(r, state_dict, num_heads, source)
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def recognises(state_dict: StateDict) -> bool:
  return families.find(parts.unprefixed(state_dict)) is not None


def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields of a transformers ViT: the sizes and parts its tensors show (their shapes only),
  and from the config.json beside them the heads, activation and LayerNorm epsilon."""
  state_dict = parts.unprefixed(state_dict)
  family = _family(state_dict, path)
  config = config.get('vision_config', config)  # A whole SigLIP's or CLIP's: its image tower's.
  fields = {
      # What most families are; each family's own fields override them.
      'distilled': False,  # But a DeiT's (the ViT family reads its distillation token).
      'map_heads': None,
      'map_mlp_dim': None,  # SigLIP's head has the blocks' intermediate_size.
      'map_include_prefix': False,
      'posemb': 'learn',
      'posemb_where': 'input',
      'key_bias': True,
      'attn_norm': False,
      'final_norm': True,
      'norm_layer': 'layernorm',
      'embed_norm': False,
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
  if config:
    fields['num_heads'] = config.get('num_attention_heads', family.num_attention_heads)
    fields['mlp_activation'] = torch_names.activation(
        config.get('hidden_act', family.hidden_act), path
    )
    fields['layernorm_epsilon'] = float(config.get(family.epsilon_key, family.layer_norm_eps))
  return {**fields, **family.fields(state_dict, config, path)}


def _family(state_dict: StateDict, source: str) -> parts.Family:
  family = families.find(state_dict)
  if family is None:
    raise ValueError(
        f'{source}: not a transformers ViT (ViTModel, ViTMAEModel, DeiTModel, IJepaModel, '
        'Dinov2Model, Dinov2WithRegistersModel, DINOv3ViTModel, SiglipVisionModel, '
        'Siglip2VisionModel, CLIPVisionModel, Aimv2VisionModel)'
    )
  return family


PROCESSOR = 'preprocessor_config.json'  # The image processor's settings, beside the weights.


def normalization(
    config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  """The image_mean and image_std of the image processor's preprocessor_config.json beside the
  weights (a hub snapshot has one; `save_pretrained` of a model alone writes none), if it normalises.
  """
  del config
  processor = torch_files.beside(path, PROCESSOR)
  if processor.get('do_normalize', True) and 'image_mean' in processor and 'image_std' in processor:
    # One value is every channel's, as transformers' processors broadcast it.
    mean, std = (np.broadcast_to(processor[k], 3).tolist() for k in ('image_mean', 'image_std'))
    return mean, std
  return None
