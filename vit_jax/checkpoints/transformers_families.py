"""The families of Hugging Face transformers ViTs that transformers_layout.py reads: how each one's
tensors map onto vit_jax's ViT (`Family.tree`) and the model fields they fix (`Family.fields`).

Their blocks differ in names only (`Blocks`): a LayerNorm before the attention and one before the
MLP; transformers' separate query / key / value projections are ours; DINOv2's layer scale
(`layer_scale1/2.lambda1`) is our `ls1` / `ls2`.

- `ViTModel` / `ViTForImageClassification`: its `pooler` is our pre-logits layer (Dense + tanh), its
  `classifier` our head.
- `Dinov2Model`, `Dinov2WithRegistersModel`: the registers (`register_tokens`) follow the class
  token, with no position embedding of their own in transformers: ours adds them zeros.
- `SiglipVisionModel`, `Siglip2VisionModel` (whose patch embedding is a Linear over flattened
  patches, our kernel reshaped, and whose position embeddings are a square grid it resizes to each
  image's, as ours are resized once to the run's): no class token; its attention-pooling `head` is our MAP head (big_vision's);
  without it (vision_use_head=False) the model is our GAP of the `post_layernorm`'d tokens (transformers'
  SiglipForImageClassification pools so; its SiglipVisionModel has no pooler_output then).
- `CLIPVisionModel`: a LayerNorm `pre_layrnorm` (sic) before the blocks and no patch bias: our
  model.pre_norm. transformers applies `post_layernorm` to the class token alone: a LayerNorm acts
  per token, so ours over every token, then the class token's, is the same.

What ours has not is a one-line error naming its tensor: DINOv2's SwiGLU MLP (use_swiglu_ffn, its
giant model's) here, the rest (CLIPVisionModelWithProjection's `visual_projection`, the classifiers of
other families) as torch_names.Reader's leftovers.
"""

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict

_POSEMB = 'Transformer/posembed_input/pos_embedding'
_ENCODER_NORM = 'Transformer/encoder_norm'
_MAP_HEAD = 'MAPHead_0'
# The wrappers' prefixes: ViTForImageClassification's `vit.`; SigLIP's and CLIP's vision towers as
# transformers 4 wrote them, and CLIPVisionModelWithProjection's, `vision_model.` (5.x writes
# SiglipVisionModel's and CLIPVisionModel's names bare).
_PREFIXES = ('vit.', 'vision_model.')


def unprefixed(state_dict: StateDict) -> StateDict:
  """The image tower's tensors without the wrappers' prefixes. Of a whole SigLIP or CLIP model (an
  image and a text tower, as the hub's google/siglip-*, openai/clip-* hold), the image tower alone:
  the text tower, the projections into the shared space and the logit scale are not of an image
  classifier."""
  if any(name.startswith('text_model.') for name in state_dict):
    state_dict = {k: v for k, v in state_dict.items() if k.startswith('vision_model.')}
  out = {}
  for name, value in state_dict.items():
    for prefix in _PREFIXES:
      name = name.removeprefix(prefix)
    out[name] = value
  return out


@dataclasses.dataclass(frozen=True)
class Blocks:
  """A family's names in its blocks `{layers}{i}.`: the attention's query, key, value and output
  projections; the LayerNorms before the attention and before the MLP; the MLP's two layers; the
  layer scales of the attention's and the MLP's outputs (DINOv2's), if any."""

  layers: str
  attention: tuple[str, str, str, str]
  norms: tuple[str, str]
  mlp: tuple[str, str]
  scales: tuple[str, ...] = ()

  def count(self, state_dict: StateDict) -> int:
    return torch_names.num_blocks(state_dict, re.escape(self.layers) + r'(\d+)\.')

  def mlp_dim(self, state_dict: StateDict) -> int:
    return state_dict[f'{self.layers}0.{self.mlp[0]}.weight'].shape[0]

  def tree(
      self, r: torch_names.Reader, state_dict: StateDict, num_heads: int
  ) -> dict[str, np.ndarray]:
    tree = {}
    for i in range(self.count(state_dict)):
      t, ours = f'{self.layers}{i}.', torch_names.BLOCK.format(i)
      weights = {}
      for name, theirs in zip(('q', 'k', 'v', 'out'), self.attention):
        weights[f'{name}.weight'] = r.take(f'{t}{theirs}.weight')
        weights[f'{name}.bias'] = r.take(f'{t}{theirs}.bias')
      tree.update(torch_names.attention_in(torch_names.ATTENTION.format(i), weights, num_heads))
      tree.update(torch_names.norms_and_mlp(r, t, ours, self.norms, self.mlp))
      for theirs, scale in zip(self.scales, ('ls1', 'ls2')):
        tree[f'{ours}/{scale}'] = r.take(t + theirs)
    return tree


@dataclasses.dataclass(frozen=True)
class Family:
  is_one: Callable[[StateDict], bool]  # Whether an (unprefixed) state dict is of this family.
  # (reader, state dict, num_heads, source) -> our flat tree, '/'-joined names.
  tree: Callable[[torch_names.Reader, StateDict, int, str], dict[str, np.ndarray]]
  # (state dict, its config.json, path) -> the model fields its tensors fix (their shapes only).
  fields: Callable[[StateDict, Mapping[str, Any], str], dict[str, Any]]
  # The config class's defaults, for a config.json that leaves them out.
  hidden_act: str
  layer_norm_eps: float


def _dense(r: torch_names.Reader, theirs: str, ours: str) -> dict[str, np.ndarray]:
  return {
      f'{ours}/kernel': torch_names.kernel(r.take(f'{theirs}.weight')),
      f'{ours}/bias': r.take(f'{theirs}.bias'),
  }


def _norm(r: torch_names.Reader, theirs: str, ours: str) -> dict[str, np.ndarray]:
  return {f'{ours}/scale': r.take(f'{theirs}.weight'), f'{ours}/bias': r.take(f'{theirs}.bias')}


def _patch_size(weight_shape: tuple[int, ...]) -> int:
  """A patch embedding's patch size: a convolution's (D, 3, p, p), or SigLIP 2's Linear (D, p * p * 3)
  over flattened patches."""
  return weight_shape[-1] if len(weight_shape) == 4 else math.isqrt(weight_shape[1] // 3)


def _patches(r: torch_names.Reader, theirs: str) -> dict[str, np.ndarray]:
  weight = r.take(f'{theirs}.weight')
  if weight.ndim == 2:  # SigLIP 2's Linear over patches flattened (row, column, channel).
    p = _patch_size(weight.shape)
    weight = weight.reshape(weight.shape[0], p, p, 3).transpose(0, 3, 1, 2)
  tree = {'embedding/kernel': torch_names.patch_kernel(weight)}
  if r.has(f'{theirs}.bias'):  # None in CLIP's, nor in ours with model.pre_norm.
    tree['embedding/bias'] = r.take(f'{theirs}.bias')
  return tree


def _sizes(state_dict: StateDict, patches: str, blocks: Blocks) -> dict[str, Any]:
  kernel = state_dict[f'{patches}.weight'].shape
  return {
      'patch_size': _patch_size(kernel),
      'hidden_size': kernel[0],
      'num_layers': blocks.count(state_dict),
      'mlp_dim': blocks.mlp_dim(state_dict),
      'fc_norm': False,
  }


# ViTModel, ViTForImageClassification.

_VIT_PATCHES = 'embeddings.patch_embeddings.projection'
_VIT_BLOCKS = Blocks(
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


def _vit_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **_patches(r, _VIT_PATCHES),
      'cls': r.take('embeddings.cls_token'),
      _POSEMB: r.take('embeddings.position_embeddings'),
      **_VIT_BLOCKS.tree(r, state_dict, num_heads),
      **_norm(r, 'layernorm', _ENCODER_NORM),
  }
  for theirs, ours in (('pooler.dense', 'pre_logits'), ('classifier', 'head')):
    if r.has(f'{theirs}.weight'):
      tree.update(_dense(r, theirs, ours))
  return tree


def _vit_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **_sizes(state_dict, _VIT_PATCHES, _VIT_BLOCKS),
      'classifier': 'token',
      'class_token': True,
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
  tree = {**_patches(r, _VIT_PATCHES), 'cls': r.take(e + 'cls_token')}
  posemb = r.take(e + 'position_embeddings')  # The class token's, then the patches'.
  if r.has(e + 'register_tokens'):
    # transformers adds the position embeddings, then puts the registers after the class token:
    # ours adds one to every token (class token, registers, patches), zeros to the registers.
    tree['reg'] = r.take(e + 'register_tokens')
    zeros = np.zeros((1, tree['reg'].shape[1], posemb.shape[2]), posemb.dtype)
    posemb = np.concatenate([posemb[:, :1], zeros, posemb[:, 1:]], axis=1)
  tree[_POSEMB] = posemb
  tree.update(_DINOV2_BLOCKS.tree(r, state_dict, num_heads))
  tree.update(_norm(r, 'layernorm', _ENCODER_NORM))
  return tree


def _dinov2_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  _refuse_swiglu(state_dict, path)
  registers = state_dict.get('embeddings.register_tokens')
  return {
      **_sizes(state_dict, _VIT_PATCHES, _DINOV2_BLOCKS),
      'classifier': 'token',
      'class_token': True,
      'pre_norm': False,
      'num_registers': 0 if registers is None else registers.shape[1],
      'layer_scale': float(config.get('layerscale_value', 1.0)),
  }


# SiglipVisionModel, Siglip2VisionModel, CLIPVisionModel.

_TOWER_BLOCKS = Blocks(
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
      f'{_MAP_HEAD}/probe': r.take(h + 'probe'),
      **torch_names.attention_in(f'{_MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      **_norm(r, h + 'layernorm', f'{_MAP_HEAD}/LayerNorm_0'),
      **_dense(r, h + 'mlp.fc1', f'{_MAP_HEAD}/MlpBlock_0/Dense_0'),
      **_dense(r, h + 'mlp.fc2', f'{_MAP_HEAD}/MlpBlock_0/Dense_1'),
  }


def _siglip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  tree = {
      **_patches(r, 'embeddings.patch_embedding'),
      _POSEMB: _tower_posemb(r),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
      **_norm(r, 'post_layernorm', _ENCODER_NORM),
  }
  if r.has('head.probe'):
    tree.update(_map_head(r, num_heads))
  return tree


def _siglip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **_sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'map' if 'head.probe' in state_dict else 'gap',
      'class_token': False,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
  }


def _clip_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  return {
      **_patches(r, 'embeddings.patch_embedding'),
      'cls': r.take('embeddings.class_embedding').reshape(1, 1, -1),
      _POSEMB: _tower_posemb(r),
      **_norm(r, 'pre_layrnorm', 'Transformer/pre_norm'),
      **_TOWER_BLOCKS.tree(r, state_dict, num_heads),
      **_norm(r, 'post_layernorm', _ENCODER_NORM),
  }


def _clip_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config, path
  return {
      **_sizes(state_dict, 'embeddings.patch_embedding', _TOWER_BLOCKS),
      'classifier': 'token',
      'class_token': True,
      'pre_norm': True,
      'num_registers': 0,
      'layer_scale': None,
  }


# In the order they are told apart: DINOv2's names are ViT's but for its blocks', CLIP's SigLIP's
# but for the class token.
FAMILIES = (
    Family(
        lambda names: 'encoder.layer.0.layer_scale1.lambda1' in names,
        _dinov2_tree,
        _dinov2_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-6,
    ),
    Family(
        lambda names: f'{_VIT_PATCHES}.weight' in names,
        _vit_tree,
        _vit_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-12,
    ),
    Family(
        lambda names: 'embeddings.class_embedding' in names,
        _clip_tree,
        _clip_fields,
        hidden_act='quick_gelu',
        layer_norm_eps=1e-5,
    ),
    Family(
        lambda names: 'embeddings.patch_embedding.weight' in names,
        _siglip_tree,
        _siglip_fields,
        hidden_act='gelu_pytorch_tanh',
        layer_norm_eps=1e-6,
    ),
)


def find(state_dict: StateDict) -> Optional[Family]:
  """The family of an unprefixed state dict, None for another model."""
  return next((family for family in FAMILIES if family.is_one(state_dict)), None)
