"""Hugging Face transformers' BEiT (`BeitModel`, `Data2VecVisionModel` and their
*ForImageClassification: the hub's microsoft/beit-*, facebook/data2vec-vision-*), one of the
families transformers_families.py lists: ViT's names with BEiT's relative position biases (its
table's layout ours, model.posemb 'relative'), layer scale `lambda_1` / `lambda_2`, no key bias; the
pooler LayerNorms the patches' mean (our gap with fc_norm) or takes the class token.
"""

import dataclasses
from typing import Any, Mapping

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints.torch_files import StateDict

# BeitModel, Data2VecVisionModel and their *ForImageClassification: ViT's names, with layer scale
# (`lambda_1`, `lambda_2`), no key bias, relative position biases in each block's attention (or one
# all share) instead of position embeddings, and the patches' mean LayerNormed (`pooler.layernorm`:
# use_mean_pooling) or the class token's output.

_BEIT_RELATIVE = 'attention.attention.relative_position_bias.relative_position_bias_table'
_BEIT_SHARED_RELATIVE = 'encoder.relative_position_bias.relative_position_bias_table'


def _relative(names: Mapping[str, Any]) -> bool:
  return f'encoder.layer.0.{_BEIT_RELATIVE}' in names or _BEIT_SHARED_RELATIVE in names


def _is_beit(names: Mapping[str, Any]) -> bool:
  return (
      _relative(names) or 'encoder.layer.0.lambda_1' in names or 'pooler.layernorm.weight' in names
  )


def _beit_blocks(state_dict: StateDict) -> parts.Blocks:
  scaled = 'encoder.layer.0.lambda_1' in state_dict  # layer_scale_init_value > 0.
  return dataclasses.replace(parts.VIT_BLOCKS, scales=('lambda_1', 'lambda_2') if scaled else ())


def _beit_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  r.drop_matching(r'relative_position_index$')  # Older files' index buffers: computed, not read.
  if r.has('embeddings.mask_token'):  # Masked image modelling's only: dropped.
    r.take('embeddings.mask_token')
  tree = {**parts.patches(r, parts.VIT_PATCHES), 'cls': r.take('embeddings.cls_token')}
  if r.has('embeddings.position_embeddings'):
    tree[parts.POSEMB] = r.take('embeddings.position_embeddings')
  blocks = _beit_blocks(state_dict)
  tree.update(blocks.tree(r, state_dict, num_heads))
  tree.update(
      torch_names.relative_biases_in(
          r,
          _BEIT_SHARED_RELATIVE,
          'encoder.layer.{}.' + _BEIT_RELATIVE,
          blocks.count(state_dict),
          source,
      )
  )
  for theirs, ours in (('layernorm', torch_names.ENCODER_NORM), ('pooler.layernorm', 'fc_norm')):
    if r.has(f'{theirs}.weight'):
      tree.update(r.norm(theirs, ours))
  if r.has('classifier.weight'):
    tree.update(parts.dense(r, 'classifier', 'head'))
  return tree


def _beit_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  relative = _relative(state_dict)
  learned = 'embeddings.position_embeddings' in state_dict
  if relative and learned:
    raise ValueError(
        f'{path}: the transformers BEiT adds learned position embeddings and relative position '
        "biases (use_absolute_position_embeddings with a relative bias), and vit_jax's ViT has one "
        'kind (model.posemb)'
    )
  blocks = _beit_blocks(state_dict)
  mean_pooling = 'pooler.layernorm.weight' in state_dict
  return {
      **parts.sizes(state_dict, parts.VIT_PATCHES, blocks),
      'classifier': 'gap' if mean_pooling else 'token',
      'class_token': True,
      'fc_norm': mean_pooling,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': float(config.get('layer_scale_init_value', 0.1)) if blocks.scales else None,
      'posemb': 'relative' if relative else 'learn' if learned else 'none',
      'key_bias': False,
  }


BEIT = parts.Family(_is_beit, _beit_tree, _beit_fields, hidden_act='gelu', layer_norm_eps=1e-12)
