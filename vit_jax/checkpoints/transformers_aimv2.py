"""Hugging Face transformers' AIMv2 image encoder: `Aimv2VisionModel` (model_type
'aimv2_vision_model': the hub's apple/aimv2-* in their HF-compatible files), alone or as the
`vision_model` of a whole `Aimv2Model` (the LiT ones, with a text tower).

- RMSNorms (a scale, no bias: model.norm_layer 'rmsnorm' of its rms_norm_eps) before each block's
  attention and MLP, of the patch embeddings (`embeddings.rms_norm`: model.embed_norm) and after the
  blocks; a SwiGLU MLP (`ffn.gate_proj` SiLU'd times `ffn.up_proj`, then `ffn.down_proj`:
  model.mlp_gated); no biases in the blocks unless qkv_bias / mlp_bias (zeros where absent: the same
  function; no key bias then: model.key_bias=False); learned position embeddings of the patches
  alone; no class token: our GAP of the normed tokens.
- Its attention-pooling `head` (use_head: the LiT models') attends from a learned query `cls_token`,
  unprojected, over the tokens' key and value projections, then `output_proj`: our MAP head with the
  identity as its query projection and an MLP of zeros, since AIMv2's head has none to add.
- Its native-resolution models (is_native: fixed sin-cos embeddings of each image's grid, with no
  tensor in the file) are model.posemb='sincos2d_mae': MAE's frequencies and layout, columns first.
"""

from typing import Any, Mapping

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models.pooling import MAP_HEAD

_PATCHES = 'embeddings.patch_embed'
_POSITIONS = 'embeddings.position_embedding.weight'
_BLOCKS = parts.Blocks(
    'encoder.layers.',
    ('attention.q_proj', 'attention.k_proj', 'attention.v_proj', 'attention.out_proj'),
    ('rms_norm1', 'rms_norm2'),
    ('ffn.gate_proj', 'ffn.up_proj', 'ffn.down_proj'),
    biases_optional=True,
)


def _head(r: torch_names.Reader, num_heads: int, mlp_dim: int) -> dict[str, np.ndarray]:
  """Our `MAPHead_0` of AIMv2's head: its `cls_token` the probe, the identity its query projection,
  and an MLP of zeros (its output added to the attention's is the attention's)."""
  h = 'head.'
  out = r.take(h + 'output_proj.weight')
  d = out.shape[0]
  weights = {
      'q.weight': np.eye(d, dtype=np.float32),
      'q.bias': np.zeros(d, np.float32),
      'out.weight': out,
      'out.bias': r.take(h + 'output_proj.bias'),
  }
  for name in 'kv':
    weights[f'{name}.weight'] = r.take(f'{h}{name}_proj.weight')
    weights[f'{name}.bias'] = r.bias(f'{h}{name}_proj.bias', d)
  mlp = f'{MAP_HEAD}/MlpBlock_0/'
  return {
      f'{MAP_HEAD}/probe': r.take(h + 'cls_token'),
      **torch_names.attention_in(f'{MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      f'{MAP_HEAD}/LayerNorm_0/scale': np.ones(d, np.float32),
      f'{mlp}Dense_0/kernel': np.zeros((d, mlp_dim), np.float32),
      f'{mlp}Dense_0/bias': np.zeros(mlp_dim, np.float32),
      f'{mlp}Dense_1/kernel': np.zeros((mlp_dim, d), np.float32),
      f'{mlp}Dense_1/bias': np.zeros(d, np.float32),
  }


def _tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **parts.patches(r, _PATCHES),
      **r.norm('embeddings.rms_norm', 'embedding_norm'),
      **_BLOCKS.tree(r, state_dict, num_heads),
      **r.norm('rms_norm', torch_names.ENCODER_NORM),
  }
  if r.has(_POSITIONS):  # Else of native resolution: fixed ones.
    tree[parts.POSEMB] = r.take(_POSITIONS)[None]
  if r.has('head.cls_token'):
    tree.update(_head(r, num_heads, _BLOCKS.mlp_dim(state_dict)))
  return tree


def _fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  native = {} if _POSITIONS in state_dict else {'posemb': 'sincos2d_mae'}
  return {
      **native,
      **parts.sizes(state_dict, _PATCHES, _BLOCKS),
      'classifier': 'map' if 'head.cls_token' in state_dict else 'gap',
      'class_token': False,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
      'norm_layer': 'rmsnorm',
      'embed_norm': True,
      'key_bias': f'{_BLOCKS.layers}0.attention.k_proj.bias' in state_dict,
  }


AIMV2 = parts.Family(
    lambda names: 'embeddings.rms_norm.weight' in names,
    _tree,
    _fields,
    hidden_act='silu',
    layer_norm_eps=1e-5,
    epsilon_key='rms_norm_eps',
    num_attention_heads=8,
)
