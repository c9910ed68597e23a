"""The families of Hugging Face transformers ViTs that transformers_layout.py reads: how each one's
tensors map onto vit_jax's ViT (`Family.tree`) and the model fields they fix (`Family.fields`); the
image towers of SigLIP and CLIP are in transformers_towers.py, BEiT's in transformers_beit.py,
AIMv2's in transformers_aimv2.py.

Their blocks differ in names only (`Blocks`): a LayerNorm before the attention and one before the
MLP; transformers' separate query / key / value projections are ours; DINOv2's and DINOv3's layer
scale (`layer_scale1/2.lambda1`) is our `ls1` / `ls2`.

- `ViTModel` / `ViTForImageClassification` (ViTMAE's and ViT-MSN's encoders share its names): its
  `pooler` is our pre-logits layer (Dense + tanh), its `classifier` our head, which reads the class
  token alone (a pooler beside it is the ViTModel's that peft's classifier was trained over). `DeiTModel`,
  `DeiTForImageClassificationWithTeacher` (the hub's facebook/deit-*-distilled-*) are ViT's names with
  a distillation token after the class token (model.distilled): its `cls_classifier` is our head,
  `distillation_classifier` our `head_dist`, and as ours its logits are their mean. `IJepaModel` is
  ViT's names without a class token: our GAP (IJepaForImageClassification pools the tokens' mean).
- `Dinov2Model`, `Dinov2WithRegistersModel`: the registers (`register_tokens`) follow the class
  token, with no position embedding of their own in transformers: ours adds them zeros. The head of
  their *ForImageClassification (the hub's facebook/dinov2-*-imagenet1k-1-layer) reads the class
  token and the patches' mean side by side: our classifier 'token_gap'.
- `DINOv3ViTModel` (the hub's facebook/dinov3-vit*): no position embeddings but DINOv3's rotary ones
  (model.rope_style 'dinov3', at transformers' rope_theta 100), no key bias unless the file has one,
  registers after the class token, the gated MLP (use_gated_mlp: `gate_proj`, `up_proj`) of its H+
  and 7B models our model.mlp_gated. Its coordinate augmentations (pos_embed_shift, _jitter,
  _rescale) act in pretraining only, as timm's: not part of the function loaded.

DINOv2's giant model's SwiGLU MLP (use_swiglu_ffn: `weights_in` packing the gate and its linear
half) is our model.mlp_gated. What ours has not (the classifiers of other families) is a one-line
error naming its tensor, as torch_names.Reader's leftovers.
"""

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints import transformers_aimv2 as aimv2
from vit_jax.checkpoints import transformers_beit as beit
from vit_jax.checkpoints import transformers_parts as parts
from vit_jax.checkpoints import transformers_towers as towers
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import rope

# ViTModel, ViTForImageClassification; DeiTModel, DeiTForImageClassificationWithTeacher.

_DISTILLATION_TOKEN = 'embeddings.distillation_token'
# ViT's pooler and classifier; DeiT's class token and distillation token classifiers.
_VIT_HEADS = (
    ('pooler.dense', 'pre_logits'),
    ('classifier', 'head'),
    ('cls_classifier', 'head'),
    ('distillation_classifier', 'head_dist'),
)

_CLASSIFIERS = ('classifier', 'cls_classifier')


def _check_hub_names(state_dict: StateDict, source: str) -> None:
  """A one-line ValueError for a state dict of transformers 5's modules' own names (`layers.0.
  attention.q_proj`: a `model.state_dict()` saved by torch.save), which save_pretrained renames."""
  hub_names = any(name.startswith(parts.VIT_BLOCKS.layers) for name in state_dict)
  if 'layers.0.attention.q_proj.weight' in state_dict and not hub_names:
    raise ValueError(
        f"{source}: its tensors have transformers 5's in-memory names (layers.0.attention.q_proj), "
        "not the hub's that vit_jax reads: save the model with save_pretrained(DIR) and pass DIR"
    )


def _vit_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  tree = parts.patches(r, parts.VIT_PATCHES)
  if r.has('embeddings.cls_token'):  # IJepa's has none.
    tree['cls'] = r.take('embeddings.cls_token')
  elif r.has('pooler.dense.weight'):
    raise ValueError(
        f'{source}: the transformers ViT has a pooler (a Dense + tanh of its first token) but no '
        "class token: its first token is a patch's, which vit_jax's ViT does not pool"
    )
  if r.has(_DISTILLATION_TOKEN):
    tree['dist'] = r.take(_DISTILLATION_TOKEN)
  tree.update(
      {
          # The class token's, DeiT's distillation token's, then the patches': timm's and ours.
          parts.POSEMB: r.take('embeddings.position_embeddings'),
          **parts.VIT_BLOCKS.tree(r, state_dict, num_heads),
          **r.norm('layernorm', torch_names.ENCODER_NORM),
      }
  )
  if r.has('pooler.dense.weight') and any(r.has(f'{h}.weight') for h in _CLASSIFIERS):
    # ViTForImageClassification and DeiTForImageClassificationWithTeacher have no pooler: beside
    # their classifiers, one is their base model's (peft's adapters over a ViTModel or DeiTModel
    # save the classifiers alone), which the classifiers never read.
    for kind in ('weight', 'bias'):
      r.take(f'pooler.dense.{kind}')
  for theirs, ours in _VIT_HEADS:
    if r.has(f'{theirs}.weight'):
      tree.update(parts.dense(r, theirs, ours))
  return tree


def _vit_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del config
  _check_hub_names(state_dict, path)  # Every reader asks for the fields before the tree.
  class_token = 'embeddings.cls_token' in state_dict
  # A ViTModel's pooler is its pre-logits layer; beside a classifier, one the classifier never read.
  pooler = 'pooler.dense.weight' in state_dict and not any(
      f'{head}.weight' in state_dict for head in _CLASSIFIERS
  )
  return {
      **({'representation_size': np.shape(state_dict['pooler.dense.weight'])[0]} if pooler else {}),
      **parts.sizes(state_dict, parts.VIT_PATCHES, parts.VIT_BLOCKS),
      'classifier': 'token' if class_token else 'gap',
      'class_token': class_token,
      'distilled': _DISTILLATION_TOKEN in state_dict,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
      'key_bias': parts.VIT_BLOCKS.key_bias(state_dict),
  }


# Dinov2Model, Dinov2WithRegistersModel.

_DINOV2_BLOCKS = dataclasses.replace(
    parts.VIT_BLOCKS,
    norms=('norm1', 'norm2'),
    mlp=('mlp.fc1', 'mlp.fc2'),
    scales=('layer_scale1.lambda1', 'layer_scale2.lambda1'),
)


def _dinov2_blocks(state_dict: StateDict) -> parts.Blocks:
  """DINOv2's blocks, with its giant model's SwiGLU MLP (use_swiglu_ffn) where the file has one: its
  `weights_in` packs the gate's outputs (SiLU'd) and the linear half's, `weights_out` our Dense_1.
  """
  if 'encoder.layer.0.mlp.weights_in.weight' in state_dict:
    return dataclasses.replace(
        _DINOV2_BLOCKS, mlp=('mlp.weights_in', 'mlp.weights_out'), packed_gate=True
    )
  return _DINOV2_BLOCKS


def _dinov2_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  e = 'embeddings.'
  if r.has(e + 'mask_token'):
    # Replaces the masked patches of masked pretraining (transformers' bool_masked_pos) only: no part
    # of the ViT that classifies or extracts features. Dropped.
    r.take(e + 'mask_token')
  tree = {**parts.patches(r, parts.VIT_PATCHES), 'cls': r.take(e + 'cls_token')}
  posemb = r.take(e + 'position_embeddings')  # The class token's, then the patches'.
  if r.has(e + 'register_tokens'):
    # transformers adds the position embeddings, then puts the registers after the class token:
    # ours adds one to every token (class token, registers, patches), zeros to the registers.
    tree['reg'] = r.take(e + 'register_tokens')
    zeros = np.zeros((1, tree['reg'].shape[1], posemb.shape[2]), posemb.dtype)
    posemb = np.concatenate([posemb[:, :1], zeros, posemb[:, 1:]], axis=1)
  tree[parts.POSEMB] = posemb
  tree.update(_dinov2_blocks(state_dict).tree(r, state_dict, num_heads))
  tree.update(r.norm('layernorm', torch_names.ENCODER_NORM))
  if r.has('classifier.weight'):
    tree.update(parts.dense(r, 'classifier', 'head'))
  return tree


def _dinov2_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  del path
  registers = state_dict.get('embeddings.register_tokens')
  blocks = _dinov2_blocks(state_dict)
  fields = {
      **parts.sizes(state_dict, parts.VIT_PATCHES, blocks),
      # Dinov2ForImageClassification's head reads the class token and the patches' mean.
      'classifier': 'token_gap' if 'classifier.weight' in state_dict else 'token',
      'class_token': True,
      'pre_norm': False,
      'num_registers': 0 if registers is None else registers.shape[1],
      'layer_scale': float(config.get('layerscale_value', 1.0)),
      'key_bias': blocks.key_bias(state_dict),
  }
  if blocks.packed_gate:  # transformers' Dinov2SwiGLUFFN applies SiLU whatever its hidden_act.
    fields['mlp_activation'] = 'silu'
  return fields


# DINOv3ViTModel.

_DINOV3_BLOCKS = parts.Blocks(
    'layer.',
    ('attention.q_proj', 'attention.k_proj', 'attention.v_proj', 'attention.o_proj'),
    ('norm1', 'norm2'),
    ('mlp.up_proj', 'mlp.down_proj'),
    scales=('layer_scale1.lambda1', 'layer_scale2.lambda1'),
)


def _dinov3_blocks(state_dict: StateDict) -> parts.Blocks:
  """DINOv3's blocks under the names of its files (`layer.{i}.`: the hub's, and what transformers
  writes) or of its modules in transformers 5 (`model.layer.{i}.`: torch.save of a state dict), with
  the gated MLP where the file has one."""
  layers = 'layer.' if 'layer.0.norm1.weight' in state_dict else 'model.layer.'
  mlp = _DINOV3_BLOCKS.mlp
  if f'{layers}0.mlp.gate_proj.weight' in state_dict:
    mlp = ('mlp.gate_proj',) + mlp
  return dataclasses.replace(_DINOV3_BLOCKS, layers=layers, mlp=mlp)


def _dinov3_tree(r: torch_names.Reader, state_dict: StateDict, num_heads: int, source: str):
  del source
  e = 'embeddings.'
  if r.has(e + 'mask_token'):  # Masked pretraining's only, as DINOv2's: dropped.
    r.take(e + 'mask_token')
  tree = {**parts.patches(r, e + 'patch_embeddings'), 'cls': r.take(e + 'cls_token')}
  registers = r.take(e + 'register_tokens')  # (1, 0, D) without registers.
  if registers.shape[1]:
    tree['reg'] = registers
  tree.update(_dinov3_blocks(state_dict).tree(r, state_dict, num_heads))
  tree.update(r.norm('norm', torch_names.ENCODER_NORM))
  return tree


def _dinov3_fields(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  theta = float(config.get('rope_theta', rope.DINOV3_TEMPERATURE))
  if theta != rope.DINOV3_TEMPERATURE:
    raise ValueError(
        f"{path}: its rotary embeddings' rope_theta is {theta:g}; vit_jax's rope_style 'dinov3' "
        f"computes DINOv3's, {rope.DINOV3_TEMPERATURE:g}"
    )
  blocks = _dinov3_blocks(state_dict)
  return {
      **parts.sizes(state_dict, 'embeddings.patch_embeddings', blocks),
      'classifier': 'token',  # transformers' pooler_output: the class token, LayerNormed.
      'class_token': True,
      'pre_norm': False,
      'num_registers': state_dict['embeddings.register_tokens'].shape[1],
      'layer_scale': float(config.get('layerscale_value', 1.0)),
      'posemb': 'none',
      'key_bias': blocks.key_bias(state_dict),
      'rope': True,
      'rope_grid': None,
      'rope_style': 'dinov3',
  }


# In the order they are told apart: BEiT's names are ViT's and more, DINOv2's ViT's but for its
# blocks'; the towers'.
FAMILIES = (
    beit.BEIT,
    aimv2.AIMV2,
    parts.Family(
        # Registers without position embeddings (DINOv2's have them).
        lambda names: 'embeddings.register_tokens' in names
        and 'embeddings.position_embeddings' not in names,
        _dinov3_tree,
        _dinov3_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-5,
        num_attention_heads=6,  # DINOv3ViTConfig's: ViT-S's, whose hub config.json leaves it out.
    ),
    parts.Family(
        lambda names: 'encoder.layer.0.layer_scale1.lambda1' in names,
        _dinov2_tree,
        _dinov2_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-6,
    ),
    parts.Family(
        lambda names: f'{parts.VIT_PATCHES}.weight' in names,
        _vit_tree,
        _vit_fields,
        hidden_act='gelu',
        layer_norm_eps=1e-12,
    ),
    towers.CLIP,
    towers.SIGLIP,
)


def find(state_dict: StateDict) -> Optional[parts.Family]:
  """The family of an unprefixed state dict, None for another model."""
  return next((family for family in FAMILIES if family.is_one(state_dict)), None)
