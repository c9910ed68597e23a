"""The families of Hugging Face transformers ViTs that transformers_layout.py reads: how each one's
tensors map onto vit_jax's ViT (`Family.tree`) and the model fields they fix (`Family.fields`).

Their blocks differ in names only (`Blocks`): a LayerNorm before the attention and one before the
MLP; transformers' separate query / key / value projections are ours; DINOv2's layer scale
(`layer_scale1/2.lambda1`) is our `ls1` / `ls2`.

- `ViTModel` / `ViTForImageClassification`: its `pooler` is our pre-logits layer (Dense + tanh), its
  `classifier` our head. `DeiTModel`, `DeiTForImageClassificationWithTeacher` (the hub's
  facebook/deit-*-distilled-*) are ViT's names with a distillation token after the class token
  (model.distilled): its `cls_classifier` is our head, `distillation_classifier` our `head_dist`,
  and as ours its logits are their mean.
- `Dinov2Model`, `Dinov2WithRegistersModel`: the registers (`register_tokens`) follow the class
  token, with no position embedding of their own in transformers: ours adds them zeros.
- `SiglipVisionModel`, `Siglip2VisionModel` (whose patch embedding is a Linear over flattened
  patches, our kernel reshaped, and whose position embeddings are a square grid it resizes to each
  image's, as ours are resized once to the run's): no class token; its attention-pooling `head` is
  our MAP head (big_vision's); without it (vision_use_head=False) the model is our GAP of the `post_layernorm`'d tokens (transformers'
  SiglipForImageClassification pools so; its SiglipVisionModel has no pooler_output then).
- `CLIPVisionModel`: a LayerNorm `pre_layrnorm` (sic) before the blocks and no patch bias: our
  model.pre_norm. transformers applies `post_layernorm` to the class token alone: a LayerNorm acts
  per token, so ours over every token, then the class token's, is the same.

What ours has not is a one-line error naming its tensor: DINOv2's SwiGLU MLP (use_swiglu_ffn, its
giant model's) here, the rest (CLIPVisionModelWithProjection's `visual_projection`, the classifiers of
other families) as torch_names.Reader's leftovers.
"""

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints.torch_files import StateDict

# ViTModel, ViTForImageClassification; DeiTModel, DeiTForImageClassificationWithTeacher.

_VIT_PATCHES = 'embeddings.patch_embeddings.projection'
_VIT_BLOCKS = parts.Blocks(
    'encoder.layer.',
    (
        'attention.attention.query',
        'attention.attention.key',
        'attention.attention.value',
        'attention.output.dense',
    ),
    ('layernorm_before', 'layernorm_after'),
    ('intermediate.dense', 'output.dense'),
)


_DISTILLATION_TOKEN = 'embeddings.distillation_token'
# ViT's pooler and classifier; DeiT's class token and distillation token classifiers.
_VIT_HEADS = (
    ('pooler.dense', 'pre_logits'),
    ('classifier', 'head'),
    ('cls_classifier', 'head'),
    ('distillation_classifier', 'head_dist'),
)


def _vit_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {**parts.patches(r, _VIT_PATCHES), 'cls': r.take('embeddings.cls_token')}
  if r.has(_DISTILLATION_TOKEN):
    tree['dist'] = r.take(_DISTILLATION_TOKEN)
  tree.update(
      {
          # The class token's, DeiT's distillation token's, then the patches': timm's and ours.
          parts.POSEMB: r.take('embeddings.position_embeddings'),
          **_VIT_BLOCKS.tree(r, state_dict, num_heads),
          **parts.norm(r, 'layernorm', parts.ENCODER_NORM),
      }
  )
  for theirs, ours in _VIT_HEADS:
    if r.has(f'{theirs}.weight'):
      tree.update(parts.dense(r, theirs, ours))
  return tree


def _vit_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **parts.sizes(state_dict, _VIT_PATCHES, _VIT_BLOCKS),
      'classifier': 'token',
      'class_token': True,
      'distilled': _DISTILLATION_TOKEN in state_dict,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
  }


# Dinov2Model, Dinov2WithRegistersModel.

_DINOV2_BLOCKS = dataclasses.replace(
    _VIT_BLOCKS,
    norms=('norm1', 'norm2'),
    mlp=('mlp.fc1', 'mlp.fc2'),
    scales=('layer_scale1.lambda1', 'layer_scale2.lambda1'),
)


def _refuse_swiglu(state_dict: StateDict, source: str) -> None:
  swiglu = sorted(name for name in state_dict if '.mlp.weights_in.' in name)
  if swiglu:
    raise ValueError(
        f'{source}: transformers tensor {swiglu[0]!r} {tuple(state_dict[swiglu[0]].shape)} is '
        "DINOv2's SwiGLU MLP (use_swiglu_ffn, its giant model's), which vit_jax's ViT has not"
    )


def _dinov2_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  _refuse_swiglu(state_dict, source)
  e = 'embeddings.'
  if r.has(e + 'mask_token'):
    # Replaces the masked patches of masked pretraining (transformers' bool_masked_pos) only: no part
    # of the ViT that classifies or extracts features. Dropped.
    r.take(e + 'mask_token')
  tree = {**parts.patches(r, _VIT_PATCHES), 'cls': r.take(e + 'cls_token')}
  posemb = r.take(e + 'position_embeddings')  # The class token's, then the patches'.
  if r.has(e + 'register_tokens'):
    # transformers adds the position embeddings, then puts the registers after the class token:
    # ours adds one to every token (class token, registers, patches), zeros to the registers.
    tree['reg'] = r.take(e + 'register_tokens')
    zeros = np.zeros((1, tree['reg'].shape[1], posemb.shape[2]), posemb.dtype)
    posemb = np.concatenate([posemb[:, :1], zeros, posemb[:, 1:]], axis=1)
  tree[parts.POSEMB] = posemb
  tree.update(_DINOV2_BLOCKS.tree(r, state_dict, num_heads))
  tree.update(parts.norm(r, 'layernorm', parts.ENCODER_NORM))
  return tree


def _dinov2_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  _refuse_swiglu(state_dict, path)
  registers = state_dict.get('embeddings.register_tokens')
  return {
      **parts.sizes(state_dict, _VIT_PATCHES, _DINOV2_BLOCKS),
      'classifier': 'token',
      'class_token': True,
      'pre_norm': False,
      'num_registers': 0 if registers is None else registers.shape[1],
      'layer_scale': float(config.get('layerscale_value', 1.0)),
  }


# SiglipVisionModel, Siglip2VisionModel, CLIPVisionModel.

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
      f'{parts.MAP_HEAD}/probe': r.take(h + 'probe'),
      **torch_names.attention_in(
          f'{parts.MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads
      ),
      **parts.norm(r, h + 'layernorm', f'{parts.MAP_HEAD}/LayerNorm_0'),
      **parts.dense(r, h + 'mlp.fc1', f'{parts.MAP_HEAD}/MlpBlock_0/Dense_0'),
      **parts.dense(r, h + 'mlp.fc2', f'{parts.MAP_HEAD}/MlpBlock_0/Dense_1'),
  }


def _siglip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **parts.patches(r, 'embeddings.patch_embedding'),
      parts.POSEMB: _tower_posemb(r),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
      **parts.norm(r, 'post_layernorm', parts.ENCODER_NORM),
  }
  if r.has('head.probe'):
    tree.update(_map_head(r, num_heads))
  return tree


def _siglip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **parts.sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'map' if 'head.probe' in state_dict else 'gap',
      'class_token': False,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
  }


def _clip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  return {
      **parts.patches(r, 'embeddings.patch_embedding'),
      'cls': r.take('embeddings.class_embedding').reshape(1, 1, -1),
      parts.POSEMB: _tower_posemb(r),
      **parts.norm(r, 'pre_layrnorm', 'Transformer/pre_norm'),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
      **parts.norm(r, 'post_layernorm', parts.ENCODER_NORM),
  }


def _clip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **parts.sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'token',
      'class_token': True,
      'pre_norm': True,
      'num_registers': 0,
      'layer_scale': None,
  }


# In the order they are told apart: DINOv2's names are ViT's but for its blocks', CLIP's SigLIP's
# but for the class token.
FAMILIES = (
    parts.Family(
        lambda names: 'encoder.layer.0.layer_scale1.lambda1' in names,
        _dinov2_tree,
        _dinov2_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-6,
    ),
    parts.Family(
        lambda names: f'{_VIT_PATCHES}.weight' in names,
        _vit_tree,
        _vit_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-12,
    ),
    parts.Family(
        lambda names: 'embeddings.class_embedding' in names,
        _clip_tree,
        _clip_fields,
        hidden_act='quick_gelu',
        layer_norm_eps=1e-5,
    ),
    parts.Family(
        lambda names: 'embeddings.patch_embedding.weight' in names,
        _siglip_tree,
        _siglip_fields,
        hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=1e-6,
    ),
)


def find(state_dict: StateDict) -> Optional[parts.Family]:
  """The family of an unprefixed state dict, None for another model."""
  return next((family for family in FAMILIES if family.is_one(state_dict)), None)
