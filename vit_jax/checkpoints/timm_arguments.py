"""What a timm ViT's config.json says of the function its weights compute: the arguments timm creates
the model with (`Arguments`), and whether vit_jax computes that function (`check`); the model fields
they fix that no tensor shows are timm_fields.py's.

A hub checkpoint's config.json names its `architecture` (a function timm registers) and rarely its
`model_args`; what the architecture passes to timm's `VisionTransformer`, `Eva` or `Beit` (heads,
activation, LayerNorm epsilon, rotary embeddings, block types, ...) is in timm's code. timm_architectures.json
holds it for every architecture of the pinned timm (tests/timm_registry.py writes it from timm's
registry), so vit_jax reads timm checkpoints without timm. The arguments are merged as
`timm.create_model(architecture, **model_args)` merges them. Every argument either maps to a
`model.*` field, is one the tensors show (checked against the model's shapes), does not change the
function (dropout, initialisation, the image size a model was made for), or must have the value
vit_jax computes: anything else is a one-line error, since such weights load and compute another
function. An architecture the table does not have (a newer timm's) is read from its model_args alone.
"""

import functools
import json
import os
from typing import Any, Mapping, Optional

from vit_jax.models import rope

_TABLE = os.path.join(os.path.dirname(__file__), 'timm_architectures.json')

# Arguments that do not change the function computed at a fixed resolution, or that the tensors show
# (their shapes are the model's, or a tensor vit_jax has no place for is an error): both classes',
# then each one's own.
_COMMON = (
    'img_size',
    'patch_size',
    'in_chans',
    'num_classes',
    'embed_dim',
    'depth',
    'mlp_ratio',
    'qkv_bias',
    'qk_norm',
    'init_values',
    'class_token',
    'no_embed_class',
    'dynamic_img_size',
    'dynamic_img_pad',
    'drop_rate',
    'pos_drop_rate',
    'patch_drop_rate',
    'proj_drop_rate',
    'attn_drop_rate',
    'drop_path_rate',
)
_SHOWN_OR_INERT = {
    'vision_transformer': _COMMON
    + (
        'reg_tokens',
        'pre_norm',
        'fc_norm',
        'weight_init',
        'fix_init',
        'distilled',
        'scale_attn_norm',
        'scale_mlp_norm',
        'final_norm',
        'proj_bias',
    ),
    'eva': _COMMON
    + (
        'qkv_fused',
        'scale_attn_inner',
        'swiglu_align_to',
        'scale_mlp',
        'num_reg_tokens',
        'use_abs_pos_emb',
        'use_pre_transformer_norm',
        'use_post_transformer_norm',
        'use_fc_norm',
        'attn_pool_mlp_ratio',
        'head_init_scale',
        # Grouped-query attention (model.num_kv_heads): the key and value projections' rows.
        'num_kv_heads',
        'attn_only_layer_scale',  # No gamma_2 (model.layer_scale_mlp=False).
        # DINOv3's augmentations of the rotary embeddings' coordinates while pretraining (Sapiens
        # 2's rescale): like the drop rates, training's, of no effect on the function computed.
        'rope_shift_coords',
        'rope_jitter_coords',
        'rope_rescale_coords',
    ),
    'beit': _COMMON
    + (
        'scale_mlp',
        'use_abs_pos_emb',
        'use_rel_pos_bias',
        'use_shared_rel_pos_bias',
        'use_fc_norm',
        'head_init_scale',
    ),
}
# Arguments that map to model fields (`fields`).
_MAPPED = {
    'vision_transformer': (
        'num_heads',
        'act_layer',
        'norm_layer',
        'global_pool',
        'mlp_layer',
        'pool_include_prefix',
        'embed_norm_layer',
    ),
    'eva': (
        'num_heads',
        'norm_layer',
        'global_pool',
        'swiglu_mlp',
        'use_rot_pos_emb',
        'ref_feat_shape',
        'rope_type',
        'rope_rotate_half',
        'rope_temperature',
        'rope_grid_indexing',
        'rope_grid_offset',
        'attn_pool_num_heads',
        'use_post_norm',
    ),
    'beit': ('num_heads', 'norm_layer', 'global_pool', 'swiglu_mlp'),
}
# timm's (rope_type, rope_rotate_half, rope_temperature, rope_grid_indexing, rope_grid_offset) of
# each model.rope_style (rope.py), read here and written by timm_export.py; any other combination is
# refused.
ROPE_ARGS = (
    'rope_type',
    'rope_rotate_half',
    'rope_temperature',
    'rope_grid_indexing',
    'rope_grid_offset',
)
ROPE_STYLES = {
    'eva02': ('cat', False, rope.TEMPERATURE, 'ij', 0.0),
    'rope_vit': ('cat', False, rope.DINOV3_TEMPERATURE, 'xy', 0.0),
    'pe': ('cat', False, rope.TEMPERATURE, 'xy', 1.0),
    'eva02_xy': ('cat', False, rope.TEMPERATURE, 'xy', 0.0),
    # Its frequencies are learned: the temperature set their start, the grid offset is unread.
    'rope_mixed': ('mixed', False, rope.MIXED_TEMPERATURE, 'xy', 0.0),
    'dinov3': ('dinov3', True, rope.DINOV3_TEMPERATURE, 'ij', 0.0),
}
# The values vit_jax computes of the other arguments of each class. timm's AttentionRope
# (attn_type='rope') computes EvaAttention's function, its fused qkv with a key bias. timm's
# ResPostBlock is model.res_post_norm (timm_fields.res_post_norm); its ParallelScalingBlock
# model.parallel_block, its DiffAttention (attn_layer 'diff') model.diff_attention, its
# DiffParallelScalingBlock both (the tensors show them).
_COMPUTED = {
    'vision_transformer': {
        'block_fn': ('Block', 'ResPostBlock', 'ParallelScalingBlock', 'DiffParallelScalingBlock'),
        'attn_layer': ('Attention', 'attn', '', 'diff'),
        'embed_layer': ('PatchEmbed',),
        'pos_embed': ('learn', 'none'),
    },
    'eva': {
        'attn_type': ('eva', 'rope'),
        'rope_mrope_section': (None,),
    },
    'beit': {},
}
# timm's MLP layers vit_jax's MLP is (model.mlp_gated shows which, from the tensors).
_MLP_LAYERS = ('Mlp', 'SwiGLU')


@functools.cache
def _table() -> dict[str, Any]:
  with open(_TABLE, encoding='utf-8') as f:
    return json.load(f)


def architectures() -> Mapping[str, Any]:
  """The table's architectures: {name: its class and arguments}."""
  return _table()['architectures']


def timm_version() -> str:
  """The timm whose architectures the table holds."""
  return _table()['timm']


class Arguments:
  """The arguments timm creates a checkpoint's model with: `known` when its architecture is in the
  table (every argument then has its value), else only those its model_args give."""

  def __init__(self, config: Mapping[str, Any], tensor_class: str):
    self.name = config.get('architecture')
    # A name may carry its pretrained tag, as timm.create_model takes it: 'vit_base_patch16_224.augreg'.
    entry = architectures().get((self.name or '').partition('.')[0])
    self.known = entry is not None
    # An architecture the table lacks is of the class its tensors show.
    self.cls = entry['class'] if self.known else tensor_class
    self.defaults = _table()['defaults'][self.cls]
    self.args = {**(entry['args'] if self.known else {}), **(config.get('model_args') or {})}

  def has(self, arg: str) -> bool:
    return self.known or arg in self.args

  def get(self, arg: str) -> Any:
    return self.args.get(arg, self.defaults.get(arg))

  def describe(self) -> str:
    return f"timm's {self.name}" if self.name else 'the timm model'


def _same(value: Any, accepted: Any) -> bool:
  """Equal values, numbers by value (JSON's 0 is 0.0), but a bool never equal to a number."""
  if isinstance(value, bool) or isinstance(accepted, bool):
    return isinstance(value, bool) and isinstance(accepted, bool) and value == accepted
  return value == accepted


def rope_style(args: Arguments) -> Optional[str]:
  """The model.rope_style of an Eva's rope arguments, None for a combination vit_jax does not
  compute."""
  given = tuple(args.get(arg) for arg in ROPE_ARGS)
  for style, accepted in ROPE_STYLES.items():
    if all(_same(value, a) for value, a in zip(given, accepted)):
      return style
  return None


def _rope_args(values: tuple[Any, ...]) -> str:
  return ', '.join(f'{arg}={value!r}' for arg, value in zip(ROPE_ARGS, values))


def check(args: Arguments, path: str) -> None:
  """A one-line ValueError for an argument that changes the function to one vit_jax does not
  compute: a value `_COMPUTED` does not list, rotary embeddings of no `ROPE_STYLES` style, or an
  argument this module does not know that is not at its default (a newer timm's)."""
  known = set(_SHOWN_OR_INERT[args.cls]) | set(_MAPPED[args.cls]) | set(_COMPUTED[args.cls])
  for arg, value in sorted(args.args.items()):
    accepted = _COMPUTED[args.cls].get(arg)
    if accepted is not None and not any(_same(value, a) for a in accepted):
      raise ValueError(
          f"{path}: {args.describe()} is created with {arg}={value!r}, which vit_jax's ViT does not "
          f"compute (it computes {arg}={' or '.join(repr(a) for a in accepted)}); fine-tune it in "
          'timm, or pick another checkpoint'
      )
    if arg not in known and not (arg in args.defaults and _same(value, args.defaults[arg])):
      raise ValueError(
          f'{path}: {args.describe()} is created with {arg}={value!r}, an argument vit_jax does not '
          f'read (its table is of timm {timm_version()}): fine-tune it in timm, or pick another '
          'checkpoint'
      )
  _check_mlp_layer(args, path)
  if args.cls == 'eva' and rope_style(args) is None:
    computed = ' or '.join(f'{_rope_args(a)} ({s})' for s, a in ROPE_STYLES.items())
    raise ValueError(
        f'{path}: {args.describe()} is created with '
        f"{_rope_args(tuple(args.get(arg) for arg in ROPE_ARGS))}, which vit_jax's ViT does not "
        f'compute (its model.rope_style computes {computed}); fine-tune it in timm, or pick '
        'another checkpoint'
    )


def _check_mlp_layer(args: Arguments, path: str) -> None:
  """A one-line ValueError for a timm MLP layer vit_jax's MLP is not."""
  layer = args.get('mlp_layer')
  if args.cls != 'vision_transformer' or layer is None:
    return
  # timm's SwiGLUPacked is a partial of GluMlp, with the gate in fc1's first half (gate_last=False).
  packed = isinstance(layer, dict) and layer.get('partial') == 'GluMlp' and not layer['gate_last']
  if not (packed or layer in _MLP_LAYERS):
    raise ValueError(
        f"{path}: {args.describe()}'s MLP is timm's {layer}, which vit_jax's ViT does not compute "
        f"(it computes {', '.join(_MLP_LAYERS)} and SwiGLUPacked)"
    )
