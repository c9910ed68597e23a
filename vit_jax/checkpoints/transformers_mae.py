"""The pixel decoder of transformers' `ViTMAEForPreTraining` (the hub's facebook/vit-mae-*: MAE's
published weights), read into models/mae.py's `decoder` tree so that a config.task='mae' run continues
their pretraining (config.init_from); its encoder is the 'vit' family's (transformers_families.py).

Its blocks are ViTLayers: read by the transformers reader under a ViTModel's names, the decoder's
width, position embeddings and norm standing in for a ViTModel's (transformers_layout.py)."""

import re
from typing import Any, Mapping

import numpy as np

from vit_jax.checkpoints import torch_names, transformers_layout
from vit_jax.checkpoints.torch_files import StateDict

# The hub's files name the blocks decoder.decoder_layers.{i}; transformers 5's save_pretrained writes
# decoder.decoder_encoder.layer.{i}.
_BLOCK = re.compile(r'decoder\.decoder_(?:layers|encoder\.layer)\.(.*)')
# transformers' ViTMAEConfig's default decoder heads, where a config.json leaves them out.
_DEFAULT_HEADS = 16


def has_decoder(state_dict: StateDict) -> bool:
  return 'decoder.decoder_pred.weight' in state_dict


def _fields(state_dict: StateDict, config: Mapping[str, Any]) -> dict[str, Any]:
  """The checkpoint's decoder as the model's fields (models/mae.py's `MaskedAutoencoder`)."""
  blocks = {m[1].split('.')[0] for name in state_dict if (m := _BLOCK.match(name))}
  intermediate = [
      v
      for k, v in state_dict.items()
      if _BLOCK.match(k) and k.endswith('intermediate.dense.weight')
  ]
  return {
      'decoder_hidden_size': state_dict['decoder.decoder_embed.weight'].shape[0],
      'decoder_num_layers': len(blocks),
      'decoder_num_heads': config.get('decoder_num_attention_heads', _DEFAULT_HEADS),
      'decoder_mlp_dim': intermediate[0].shape[0] if intermediate else None,
      'decoder_posemb': 'learn',  # A tensor of the file (MAE's fixed sin-cos values).
  }


def decoder(
    state_dict: StateDict, config: Mapping[str, Any], model: Mapping[str, Any], path: str
) -> dict[str, Any]:
  """The decoder's tree for a model of the fields `model`; a one-line ValueError naming the
  config.mae field that differs from the checkpoint's."""
  for field, value in _fields(state_dict, config).items():
    if model[field] != value:
      raise ValueError(
          f"{path}: the checkpoint's MAE decoder has {field}={value!r}, the model "
          f'{model[field]!r}: set --config.mae.{field}={value}'
      )
  width = model['decoder_hidden_size']
  patch = state_dict['vit.embeddings.patch_embeddings.projection.weight'].shape[-1]
  # A ViTModel of the decoder's blocks: a stand-in patch embedding and class token complete it.
  as_vit = {
      'embeddings.patch_embeddings.projection.weight': np.zeros(
          (width, 3, patch, patch), np.float32
      ),
      'embeddings.patch_embeddings.projection.bias': np.zeros((width,), np.float32),
      'embeddings.cls_token': np.zeros((1, 1, width), np.float32),
      'embeddings.position_embeddings': state_dict['decoder.decoder_pos_embed'],
      'layernorm.weight': state_dict['decoder.decoder_norm.weight'],
      'layernorm.bias': state_dict['decoder.decoder_norm.bias'],
  }
  for name, value in state_dict.items():
    if block := _BLOCK.match(name):
      as_vit['encoder.layer.' + block[1]] = value
  blocks = transformers_layout.from_state_dict(as_vit, model['decoder_num_heads'], path)
  return {
      'Transformer': blocks['Transformer'],
      'embed': _dense(state_dict, 'decoder.decoder_embed'),
      'pred': _dense(state_dict, 'decoder.decoder_pred'),
      'mask_token': np.asarray(state_dict['decoder.mask_token']),
  }


def _dense(state_dict: StateDict, name: str) -> dict[str, np.ndarray]:
  return {
      'kernel': torch_names.kernel(np.asarray(state_dict[f'{name}.weight'])),
      'bias': np.asarray(state_dict[f'{name}.bias']),
  }
