"""The image towers of Hugging Face transformers' image-text models (transformers_families.py lists
every family): `SiglipVisionModel`, `Siglip2VisionModel` and `CLIPVisionModel`, alone or as the
`vision_model` of a whole SigLIP or CLIP model.

- SigLIP's and SigLIP 2's (whose patch embedding is a Linear over flattened patches, our kernel
  reshaped, and whose position embeddings are a square grid it resizes to each image's, as ours are
  resized once to the run's): no class token; its attention-pooling `head` is our MAP head
  (big_vision's); without it (vision_use_head=False) the model is our GAP of the `post_layernorm`'d
  tokens (transformers' SiglipForImageClassification pools so, its `classifier` our head, and leaves
  its tower's head unread; a SiglipVisionModel without the head has no pooler_output).
- CLIP's: a LayerNorm `pre_layrnorm` (sic) before the blocks and no patch bias: our model.pre_norm.
  transformers applies `post_layernorm` to the class token alone: a LayerNorm acts per token, so ours
  over every token, then the class token's, is the same. CLIPVisionModelWithProjection's
  `visual_projection` (into the image-text space) is left out, as a whole CLIP's is.
  transformers' CLIPForImageClassification
  (a whole CLIP's) pools the patches' mean of the blocks' output, never normalised: beside its
  `classifier` (our head; peft's adapters over a whole CLIP save it beside the base), our GAP with
  no final LayerNorm (model.final_norm=False), `post_layernorm` dropped as its tower's unread.
"""

from typing import Any, Mapping

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models.pooling import MAP_HEAD

_TOWER_BLOCKS = parts.Blocks(
    'encoder.layers.',
    ('self_attn.q_proj', 'self_attn.k_proj', 'self_attn.v_proj', 'self_attn.out_proj'),
    ('layer_norm1', 'layer_norm2'),
    ('mlp.fc1', 'mlp.fc2'),
)


def _tower_posemb(r: torch_names.Reader) -> np.ndarray:
  """An nn.Embedding's table (tokens, D) as our (1, tokens, D); its `position_ids` buffer (arange,
  in files older transformers wrote) dropped."""
  if r.has('embeddings.position_ids'):
    r.take('embeddings.position_ids')
  return r.take('embeddings.position_embedding.weight')[None]


def _map_head(r: torch_names.Reader, num_heads: int) -> dict[str, np.ndarray]:
  """Our `MAPHead_0` of SigLIP's `head`: its probe; torch's nn.MultiheadAttention, whose `in_proj`
  stacks the query, key and value projections; its LayerNorm and MLP."""
  h = 'head.'
  weights = {
      'out.weight': r.take(h + 'attention.out_proj.weight'),
      'out.bias': r.take(h + 'attention.out_proj.bias'),
  }
  for kind in ('weight', 'bias'):
    for name, part in zip('qkv', np.split(r.take(f'{h}attention.in_proj_{kind}'), 3)):
      weights[f'{name}.{kind}'] = part
  return {
      f'{MAP_HEAD}/probe': r.take(h + 'probe'),
      **torch_names.attention_in(f'{MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      **r.norm(h + 'layernorm', f'{MAP_HEAD}/LayerNorm_0'),
      **parts.dense(r, h + 'mlp.fc1', f'{MAP_HEAD}/MlpBlock_0/Dense_0'),
      **parts.dense(r, h + 'mlp.fc2', f'{MAP_HEAD}/MlpBlock_0/Dense_1'),
  }


def _reads_map_head(state_dict: StateDict) -> bool:
  return 'head.probe' in state_dict and 'classifier.weight' not in state_dict


def _siglip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **parts.patches(r, 'embeddings.patch_embedding'),
      parts.POSEMB: _tower_posemb(r),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
      **r.norm('post_layernorm', torch_names.ENCODER_NORM),
  }
  if r.has('head.probe'):
    map_head = _map_head(r, num_heads)  # Taken either way: a classifier's tower keeps it, unread.
    if _reads_map_head(state_dict):
      tree.update(map_head)
  if r.has('classifier.weight'):
    tree.update(parts.dense(r, 'classifier', 'head'))
  return tree


def _siglip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **parts.sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'map' if _reads_map_head(state_dict) else 'gap',
      'class_token': False,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
  }


def _clip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **parts.patches(r, 'embeddings.patch_embedding'),
      'cls': r.take('embeddings.class_embedding').reshape(1, 1, -1),
      parts.POSEMB: _tower_posemb(r),
      **r.norm('pre_layrnorm', 'Transformer/pre_norm'),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
  }
  # Taken either way: a CLIPForImageClassification's tower keeps it, unread.
  post_norm = r.norm('post_layernorm', torch_names.ENCODER_NORM)
  if r.has('classifier.weight'):
    tree.update(parts.dense(r, 'classifier', 'head'))
  else:
    tree.update(post_norm)
  return tree


def _clip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  classifies = 'classifier.weight' in state_dict
  return {
      **parts.sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'gap' if classifies else 'token',
      'final_norm': not classifies,
      'class_token': True,
      'pre_norm': True,
      'num_registers': 0,
      'layer_scale': None,
  }


# CLIP's names are SigLIP's but for the class token: CLIP is told apart first.
CLIP = parts.Family(
    lambda names: 'embeddings.class_embedding' in names,
    _clip_tree,
    _clip_fields,
    hidden_act='quick_gelu',
    layer_norm_eps=1e-5,
)
SIGLIP = parts.Family(
    lambda names: 'embeddings.patch_embedding.weight' in names,
    _siglip_tree,
    _siglip_fields,
    hidden_act='gelu_pytorch_tanh',
    layer_norm_eps=1e-6,
)
