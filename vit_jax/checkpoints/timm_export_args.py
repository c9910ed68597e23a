"""The timm class an export builds for a model (`timm_class`), and for each class (`ARGUMENTS`) the
architecture it registers whose defaults hold what model_args cannot say (its norm layer, its
blocks), with the model_args of our fields; what the class cannot hold is a one-line ValueError.
timm_export.py writes them into the config.json beside the tensors.
"""

from typing import Any, Mapping, Optional

from vit_jax.checkpoints import timm_arguments
from vit_jax.models import vit
from vit_jax.models.encoder import blocks_kv_heads

# The registered VisionTransformer timm builds an export as, by (LayerNorm epsilon, its kind:
# `_kind`): model_args replace its sizes and options, but its LayerNorm (timm's norm_layer, not in
# its config.json), its class and its blocks (block_fn) stay: 1e-6, or torch's default 1e-5
# (CLIP's); DeiT's VisionTransformerDistilled for the distillation token; ResPostBlocks;
# ParallelScalingBlocks, without or with differential attention.
_TIMM_ARCHITECTURES = {
    (1e-6, 'VisionTransformer'): 'vit_base_patch16_224',
    (1e-5, 'VisionTransformer'): 'vit_base_patch16_clip_224',
    (1e-6, 'distilled DeiT'): 'deit_base_distilled_patch16_224',
    (1e-6, 'ResPostBlock ViT'): 'vit_base_patch16_rpn_224',
    (1e-6, 'ParallelScalingBlock ViT'): 'vit_pwee_patch16_reg1_gap_256',
    (1e-6, 'DiffParallelScalingBlock ViT'): 'vit_dpwee_patch16_reg1_gap_256',
}
# timm's global_pool of each model.classifier it computes.
GLOBAL_POOLS = {'token': 'token', 'gap': 'avg', 'map': 'map'}


def _mlp_ratio(hidden_size: int, mlp_dim: int) -> float:
  """timm's `mlp_ratio` for an MLP of `mlp_dim` units: timm makes int(hidden_size * mlp_ratio) of
  them, and mlp_dim / hidden_size times hidden_size can round below mlp_dim (56 * (488 / 56) is
  487.99...); half a unit more floors to mlp_dim."""
  ratio = mlp_dim / hidden_size
  return ratio if int(hidden_size * ratio) == mlp_dim else (mlp_dim + 0.5) / hidden_size


def _kv_heads(model: Mapping[str, Any]) -> Optional[list[int]]:
  """Each block's key and value heads where some block has fewer than its query heads (grouped-query
  attention, model.num_kv_heads); None where none has."""
  each = [
      n or model['num_heads'] for n in blocks_kv_heads(model['num_kv_heads'], model['num_layers'])
  ]
  return None if all(n == model['num_heads'] for n in each) else each


def timm_class(model: Mapping[str, Any]) -> str:
  """The timm class an export builds: 'beit' for relative position biases, 'eva' for what its
  VisionTransformer does not compute (rotary embeddings, gated MLPs, grouped-query attention, layer
  scale of the attention alone), else 'vision_transformer'."""
  if model['posemb'] == 'relative':
    return 'beit'
  eva = model['rope'] or model['mlp_gated'] or _kv_heads(model) or not model['layer_scale_mlp']
  return 'eva' if eva else 'vision_transformer'


def _sizes(model: Mapping[str, Any]) -> dict[str, Any]:
  return {
      'patch_size': model['patch_size'],
      'embed_dim': model['hidden_size'],
      'depth': model['num_layers'],
      'num_heads': model['num_heads'],
      'mlp_ratio': _mlp_ratio(model['hidden_size'], model['mlp_dim']),
      'class_token': vit.has_class_token(model['classifier'], model['class_token']),
      'global_pool': GLOBAL_POOLS[model['classifier']],
  }


def _kind(model: Mapping[str, Any]) -> str:
  """The kind of timm VisionTransformer of the model (a key of `_TIMM_ARCHITECTURES`)."""
  blocks = {
      'ParallelScalingBlock ViT': model['parallel_block'] and not model['diff_attention'],
      'DiffParallelScalingBlock ViT': model['parallel_block'] and model['diff_attention'],
      'ResPostBlock ViT': model['res_post_norm'],
  }
  kinds = [kind for kind, chosen in blocks.items() if chosen]
  if kinds and model['distilled']:
    raise ValueError(
        f"timm's distilled DeiT has no {kinds[0]}'s blocks (model.distilled with "
        'res_post_norm or parallel_block)'
    )
  return kinds[0] if kinds else 'distilled DeiT' if model['distilled'] else 'VisionTransformer'


def _vision_transformer_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """The architecture timm's `VisionTransformer` registers for the model, and its model_args."""
  kind = _kind(model)
  architecture = _TIMM_ARCHITECTURES.get((model['layernorm_epsilon'], kind))
  if architecture is None:
    epsilons = [e for e, k in _TIMM_ARCHITECTURES if k == kind]
    raise ValueError(
        f"timm's {kind}'s LayerNorms have epsilon {' or '.join(f'{e:g}' for e in epsilons)} "
        f"(model.layernorm_epsilon={model['layernorm_epsilon']:g})"
    )
  if model['parallel_block'] and (model['attn_norm'] or model['mlp_norm']):
    raise ValueError(
        "timm's ParallelScalingBlock has no norms in its attention or MLP (model.attn_norm, "
        'mlp_norm with model.parallel_block)'
    )
  if model['res_post_norm'] and model['layer_scale'] is not None:
    raise ValueError(
        "timm's ResPostBlock has no layer scale (model.layer_scale with model.res_post_norm)"
    )
  if model['map_heads'] not in (None, model['num_heads']):
    raise ValueError(
        f"timm's VisionTransformer pools with num_heads={model['num_heads']} heads, not "
        f"model.map_heads={model['map_heads']}: unset model.map_heads"
    )
  if model['map_mlp_dim'] not in (None, model['mlp_dim']):
    raise ValueError(
        f"timm's VisionTransformer pools with an MLP of the blocks' {model['mlp_dim']} units, not "
        f"model.map_mlp_dim={model['map_mlp_dim']}: unset model.map_mlp_dim"
    )
  model_args = {
      **_sizes(model),
      'qkv_bias': True,
      'fc_norm': bool(model['fc_norm']),
      'final_norm': bool(model['final_norm']),
      'act_layer': model['mlp_activation'],
      'pool_include_prefix': bool(model['map_include_prefix']),
      'scale_attn_norm': bool(model['attn_norm']),
      'scale_mlp_norm': bool(model['mlp_norm']),
      # Explicit where an architecture's own differ: CLIP's pre_norm, the parallel one's (SBB's
      # 'pwee') layer scale, register and position embeddings without one for it.
      'pre_norm': model['pre_norm'],
      'init_values': model['layer_scale'],
      'reg_tokens': model['num_registers'],
      'no_embed_class': False,
      'qk_norm': bool(model['qk_norm']),
  }
  if model['diff_attention'] and not model['parallel_block']:
    model_args['attn_layer'] = 'diff'
  return architecture, model_args


# The registered Eva timm builds an export as, by LayerNorm epsilon: model_args replace every size
# and option, but not its norm_layer (not in its config.json): Eva's default 1e-6 (EVA-02 S's), or
# DINOv3's 1e-5.
_EVA_ARCHITECTURES = {1e-6: 'eva02_small_patch14_224', 1e-5: 'vit_base_patch16_dinov3'}
# Eva's fixed choices, which its model_args do not name: (model field, the value Eva has, the fix).
_EVA_FIXED = (
    ('distilled', False, 'distilled=False'),
    ('parallel_block', False, 'parallel_block=False'),
    ('diff_attention', False, 'diff_attention=False'),
    ('layernorm_epsilon', tuple(_EVA_ARCHITECTURES), 'layernorm_epsilon=1e-6 (or 1e-5)'),
    ('classifier', ('token', 'gap', 'map'), 'classifier=gap (or token, map)'),
    ('posemb', ('learn', 'none'), 'posemb=learn (or none)'),
)


def _eva_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """timm's `Eva` (EVA-02's and DINOv3's class) for the model, with its model_args: every size and
  option set, so that the registered architecture's own (EVA-02 S's or DINOv3 B's) do not count."""
  fixed = _EVA_FIXED + (
      # Eva's MLP: SwiGLU's SiLU when gated, else torch's exact GELU (no act_layer argument).
      ('mlp_activation', 'silu' if model['mlp_gated'] else 'gelu', ''),
  )
  kv_heads = _kv_heads(model)
  if model['res_post_norm']:  # EvaBlockPostNorm has none of them.
    fixed += (
        ('layer_scale', None, 'layer_scale unset with res_post_norm'),
        ('qk_norm', False, 'qk_norm=False with res_post_norm'),
        ('num_kv_heads', model['num_kv_heads'] if kv_heads is None else None, ''),
    )
  if kv_heads is not None:  # Only its AttentionRope, of a key bias, groups the heads.
    fixed += (('key_bias', True, 'key_bias=True with num_kv_heads'),)
  for field, value, fix in fixed:
    if model[field] != value and not (isinstance(value, tuple) and model[field] in value):
      raise ValueError(
          f"timm's Eva (the class of rotary embeddings and gated MLPs) has no "
          f'model.{field}={model[field]!r}: it needs '
          + (fix or f'{field}={value!r}' + (' with mlp_gated' if model['mlp_gated'] else ''))
      )
  model_args = {
      **_sizes(model),
      # EvaAttention has no key bias (q_bias, v_bias); AttentionRope, the same function otherwise,
      # has a fused qkv bias.
      'attn_type': 'rope' if model['key_bias'] else 'eva',
      'qkv_bias': True,
      # Grouped key and value heads have projections of their own.
      'qkv_fused': kv_heads is None,
      'num_kv_heads': kv_heads,
      'attn_only_layer_scale': not model['layer_scale_mlp'],
      'scale_attn_inner': bool(model['attn_norm']),
      'swiglu_mlp': bool(model['mlp_gated']),
      'scale_mlp': bool(model['mlp_norm']),
      'use_rot_pos_emb': bool(model['rope']),
      'ref_feat_shape': None if model['rope_grid'] is None else list(model['rope_grid']),
      **dict(zip(timm_arguments.ROPE_ARGS, timm_arguments.ROPE_STYLES[model['rope_style']])),
      'use_abs_pos_emb': model['posemb'] == 'learn',
      'num_reg_tokens': model['num_registers'],
      'use_fc_norm': bool(model['fc_norm']),
      'use_post_transformer_norm': bool(model['final_norm'] and not model['fc_norm']),
      'qk_norm': bool(model['qk_norm']),
      'use_pre_transformer_norm': bool(model['pre_norm']),
      'use_post_norm': bool(model['res_post_norm']),
      # Explicit: DINOv3's architecture has layer scale, and resamples embeddings to any input size.
      'init_values': model['layer_scale'],
      'dynamic_img_size': False,
  }
  if model['classifier'] == 'map':
    _check_eva_map_head(model)
    model_args['attn_pool_num_heads'] = model['map_heads'] or model['num_heads']
    model_args['attn_pool_mlp_ratio'] = _mlp_ratio(
        model['hidden_size'], model['map_mlp_dim'] or model['mlp_dim']
    )
  return _EVA_ARCHITECTURES[model['layernorm_epsilon']], model_args


def _check_eva_map_head(model: Mapping[str, Any]) -> None:
  """A one-line ValueError for a MAP head timm's Eva's attn_pool is not: it attends to every token
  (the class token and registers too) with a GELU MLP."""
  prefix = vit.has_class_token(model['classifier'], model['class_token']) + model['num_registers']
  if prefix and not model['map_include_prefix']:
    raise ValueError(
        "timm's Eva pools with attention over every token, the class token and registers too: "
        'train with model.map_include_prefix=True to export it'
    )
  if model['mlp_activation'] != 'gelu':
    raise ValueError(
        "timm's Eva pools with a GELU MLP, not the blocks' "
        f"model.mlp_activation={model['mlp_activation']!r}"
    )


# The options Beit does not have.
_BEIT_LACKS = (
    'distilled',
    'rope',
    'pre_norm',
    'qk_norm',
    'attn_norm',
    'res_post_norm',
    'parallel_block',
    'diff_attention',
)
# Beit's fixed choices: (model field, the values Beit has, the fix).
_BEIT_FIXED = (
    ('layernorm_epsilon', (1e-6,), 'layernorm_epsilon=1e-6'),
    ('classifier', ('gap', 'token'), 'classifier=gap (or token)'),
    ('key_bias', (False,), 'key_bias=False (its q_bias and v_bias)'),
    ('final_norm', (True,), 'final_norm=True'),
    ('num_registers', (0,), 'num_registers=0'),
    ('layer_scale_mlp', (True,), 'layer_scale_mlp=True'),
    *((field, (False, None), f'{field}=False') for field in _BEIT_LACKS),
)


def _beit_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """timm's `Beit` (BEiT's class, of relative position biases in every block) for the model, with
  its model_args; its class token is always there, and pooled as 'avg' normalises after the
  pooling (fc_norm), as 'token' before it."""
  fixed = _BEIT_FIXED + (
      ('mlp_activation', ('silu',) if model['mlp_gated'] else ('gelu',), ''),
      (
          'num_kv_heads',
          (model['num_kv_heads'],) if _kv_heads(model) is None else (),
          'num_kv_heads unset',
      ),
      ('class_token', (True, None), 'class_token=True'),
      ('fc_norm', (model['classifier'] == 'gap',), 'fc_norm with gap only'),
  )
  for field, values, fix in fixed:
    if model[field] not in values:
      raise ValueError(
          f"timm's Beit (the class of relative position biases) has no "
          f'model.{field}={model[field]!r}: it needs ' + (fix or f'{field}={values[0]!r}')
      )
  model_args = {
      **{arg: value for arg, value in _sizes(model).items() if arg != 'class_token'},  # Always one.
      'qkv_bias': True,
      'swiglu_mlp': bool(model['mlp_gated']),
      'scale_mlp': bool(model['mlp_norm']),
      'use_abs_pos_emb': False,
      'use_rel_pos_bias': True,
      'init_values': model['layer_scale'],
  }
  return 'beit_base_patch16_224', model_args


ARGUMENTS = {'vision_transformer': _vision_transformer_args, 'eva': _eva_args, 'beit': _beit_args}
