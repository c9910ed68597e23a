"""The timm class an export builds for a model (`timm_class`), and for timm's VisionTransformer and
Eva (`vision_transformer_args`, `eva_args`; Beit's: timm_export_beit.py) the architecture it
registers whose defaults hold what model_args cannot say (its norm layer, its blocks), with the
model_args of our fields; what the class cannot hold is a one-line ValueError. timm_export.py writes
them into the config.json beside the tensors.
"""

from typing import Any, Mapping, Optional

from vit_jax.checkpoints import timm_arguments, timm_fields
from vit_jax.models import vit
from vit_jax.models.encoder import blocks_kv_heads
from vit_jax.models.norms import NORM_LAYERS

# The registered VisionTransformer timm builds an export as, by its norms (model.norm_layer,
# layernorm_epsilon) and its kind (`_kind`): model_args replace its sizes and options, but its class,
# its blocks (block_fn), its MLP (mlp_layer) and its norm layer stay (a config.json names a norm
# only as a string, of timm's default epsilon: `_architecture`): LayerNorms of 1e-6, or of torch's
# default 1e-5 (CLIP's); DeiT's VisionTransformerDistilled for the distillation token;
# ResPostBlocks; ParallelScalingBlocks, without or with differential attention; AIMv2's SwiGLU MLPs
# with RMSNorms of 1e-5, one of the patch embeddings too (`_EMBED_NORMED`).
_TIMM_ARCHITECTURES = {
    ('layernorm', 1e-6, 'VisionTransformer'): 'vit_base_patch16_224',
    ('layernorm', 1e-5, 'VisionTransformer'): 'vit_base_patch16_clip_224',
    ('layernorm', 1e-6, 'distilled DeiT'): 'deit_base_distilled_patch16_224',
    ('layernorm', 1e-6, 'ResPostBlock ViT'): 'vit_base_patch16_rpn_224',
    ('layernorm', 1e-6, 'ParallelScalingBlock ViT'): 'vit_pwee_patch16_reg1_gap_256',
    ('layernorm', 1e-6, 'DiffParallelScalingBlock ViT'): 'vit_dpwee_patch16_reg1_gap_256',
    ('rmsnorm', 1e-5, 'SwiGLU ViT'): 'aimv2_large_patch14_224',
}
_EMBED_NORMED = ('aimv2_large_patch14_224',)
# timm's global_pool of each model.classifier it computes.
GLOBAL_POOLS = {'token': 'token', 'gap': 'avg', 'map': 'map'}


def _mlp_ratio(hidden_size: int, mlp_dim: int) -> float:
  """timm's `mlp_ratio` for an MLP of `mlp_dim` units: timm makes int(hidden_size * mlp_ratio) of
  them, and mlp_dim / hidden_size times hidden_size can round below mlp_dim (56 * (488 / 56) is
  487.99...); half a unit more floors to mlp_dim."""
  ratio = mlp_dim / hidden_size
  return ratio if int(hidden_size * ratio) == mlp_dim else (mlp_dim + 0.5) / hidden_size


def kv_heads(model: Mapping[str, Any]) -> Optional[list[int]]:
  """Each block's key and value heads where some block has fewer than its query heads (grouped-query
  attention, model.num_kv_heads); None where none has."""
  each = [
      n or model['num_heads'] for n in blocks_kv_heads(model['num_kv_heads'], model['num_layers'])
  ]
  return None if all(n == model['num_heads'] for n in each) else each


def timm_class(model: Mapping[str, Any]) -> str:
  """The timm class an export builds: 'beit' for relative position biases, 'eva' for what its
  VisionTransformer does not compute (rotary embeddings, grouped-query attention, layer scale of the
  attention alone, gated MLPs but AIMv2's), else 'vision_transformer'."""
  if model['posemb'] == 'relative':
    return 'beit'
  gated = model['mlp_gated'] and _norms(model) + ('SwiGLU ViT',) not in _TIMM_ARCHITECTURES
  eva = model['rope'] or gated or kv_heads(model) or not model['layer_scale_mlp']
  return 'eva' if eva else 'vision_transformer'


def _norms(model: Mapping[str, Any]) -> tuple[str, float]:
  return model['norm_layer'], model['layernorm_epsilon']


def sizes(model: Mapping[str, Any]) -> dict[str, Any]:
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
  kinds = {
      'ParallelScalingBlock ViT': model['parallel_block'] and not model['diff_attention'],
      'DiffParallelScalingBlock ViT': model['parallel_block'] and model['diff_attention'],
      'ResPostBlock ViT': model['res_post_norm'],
      'SwiGLU ViT': model['mlp_gated'],
      'distilled DeiT': model['distilled'],
  }
  chosen = [kind for kind, chosen in kinds.items() if chosen]
  if len(chosen) > 1:
    raise ValueError(
        f'timm has no {chosen[0]} that is a {chosen[1]} too (model.parallel_block, res_post_norm, '
        'mlp_gated, distilled: one at most)'
    )
  return chosen[0] if chosen else 'VisionTransformer'


def _norms_error(what: str, norms: set[tuple[str, float]], model: Mapping[str, Any]) -> ValueError:
  """The one-line error of a model whose norms are not of `norms` (kind, epsilon), `what`'s."""
  return ValueError(
      f"{what} normalises with {', '.join(f'{n} of epsilon {e:g}' for n, e in sorted(norms))}, "
      f"not model.norm_layer={model['norm_layer']} of "
      f"model.layernorm_epsilon={model['layernorm_epsilon']:g}"
  )


def _architecture(model: Mapping[str, Any], kind: str) -> tuple[str, dict[str, Any]]:
  """The architecture timm's `VisionTransformer` registers for the model's kind and norms, and the
  model_args that name its norms where they are not the architecture's own (timm's norm strings,
  of epsilon timm_fields.NAMED_NORM_EPSILON)."""
  norm, epsilon = _norms(model)
  named_epsilon = timm_fields.NAMED_NORM_EPSILON
  # An architecture of LayerNorms at that epsilon takes the norm the config.json names instead.
  named = _TIMM_ARCHITECTURES.get(('layernorm', named_epsilon, kind))
  architecture, args = _TIMM_ARCHITECTURES.get((norm, epsilon, kind)), {}
  if architecture is None and named and epsilon == named_epsilon:
    architecture, args = named, {'norm_layer': norm}
  if architecture is None:
    norms = {(n, e) for n, e, k in _TIMM_ARCHITECTURES if k == kind}
    norms |= {(n, named_epsilon) for n in NORM_LAYERS} if named else set()
    raise _norms_error(f"timm's {kind}", norms, model)
  if model['embed_norm'] != (architecture in _EMBED_NORMED):
    if model['embed_norm'] and epsilon != named_epsilon:
      raise ValueError(
          f"timm's config.json names a norm of the patch embeddings (model.embed_norm) of epsilon "
          f'{named_epsilon:g} only, not model.layernorm_epsilon={epsilon:g}'
      )
    args['embed_norm_layer'] = norm if model['embed_norm'] else None
  return architecture, args


def vision_transformer_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """The architecture timm's `VisionTransformer` registers for the model, and its model_args."""
  architecture, norm_args = _architecture(model, _kind(model))
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
      **sizes(model),
      # Our attention's biases (zeros where a checkpoint had none: AIMv2's).
      'qkv_bias': True,
      'proj_bias': True,
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
      **norm_args,
  }
  if model['diff_attention'] and not model['parallel_block']:
    model_args['attn_layer'] = 'diff'
  return architecture, model_args


# The registered Eva timm builds an export as, by its norms (model.norm_layer, layernorm_epsilon):
# model_args replace every size and option, but not its norm_layer (Eva reads no norm string):
# LayerNorms of Eva's default 1e-6 (EVA-02 S's) or DINOv3's 1e-5, RMSNorms of Sapiens 2's 1e-6.
_EVA_ARCHITECTURES = {
    ('layernorm', 1e-6): 'eva02_small_patch14_224',
    ('layernorm', 1e-5): 'vit_base_patch16_dinov3',
    ('rmsnorm', 1e-6): 'vit_base_patch16_sapiens2',
}
# Eva's fixed choices, which its model_args do not name: (model field, the value Eva has, the fix).
_EVA_FIXED = (
    ('distilled', False, 'distilled=False'),
    ('parallel_block', False, 'parallel_block=False'),
    ('diff_attention', False, 'diff_attention=False'),
    ('embed_norm', False, 'embed_norm=False'),
    ('classifier', ('token', 'gap', 'map'), 'classifier=gap (or token, map)'),
    ('posemb', ('learn', 'none'), 'posemb=learn (or none)'),
)


def eva_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """timm's `Eva` (EVA-02's and DINOv3's class) for the model, with its model_args: every size and
  option set, so that the registered architecture's own (EVA-02 S's or DINOv3 B's) do not count."""
  fixed = _EVA_FIXED + (
      # Eva's MLP: SwiGLU's SiLU when gated, else torch's exact GELU (no act_layer argument).
      ('mlp_activation', 'silu' if model['mlp_gated'] else 'gelu', ''),
  )
  grouped = kv_heads(model)
  if model['res_post_norm']:  # EvaBlockPostNorm has none of them.
    fixed += (
        ('layer_scale', None, 'layer_scale unset with res_post_norm'),
        ('qk_norm', False, 'qk_norm=False with res_post_norm'),
        ('num_kv_heads', model['num_kv_heads'] if grouped is None else None, ''),
    )
  if grouped is not None:  # Only its AttentionRope, of a key bias, groups the heads.
    fixed += (('key_bias', True, 'key_bias=True with num_kv_heads'),)
  for field, value, fix in fixed:
    if model[field] != value and not (isinstance(value, tuple) and model[field] in value):
      raise ValueError(
          f"timm's Eva (the class of rotary embeddings and gated MLPs) has no "
          f'model.{field}={model[field]!r}: it needs '
          + (fix or f'{field}={value!r}' + (' with mlp_gated' if model['mlp_gated'] else ''))
      )
  if _norms(model) not in _EVA_ARCHITECTURES:
    raise _norms_error(
        "timm's Eva (the class of rotary embeddings and gated MLPs)", set(_EVA_ARCHITECTURES), model
    )
  model_args = {
      **sizes(model),
      # EvaAttention has no key bias (q_bias, v_bias); AttentionRope, the same function otherwise,
      # has a fused qkv bias.
      'attn_type': 'rope' if model['key_bias'] else 'eva',
      'qkv_bias': True,
      # Grouped key and value heads have projections of their own.
      'qkv_fused': grouped is None,
      'num_kv_heads': grouped,
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
      # Explicit: DINOv3's architecture has layer scale, and resamples embeddings to any input size;
      # Sapiens 2's rescales the rotary embeddings' coordinates in training.
      'init_values': model['layer_scale'],
      'dynamic_img_size': False,
      'rope_rescale_coords': None,
  }
  if model['classifier'] == 'map':
    _check_eva_map_head(model)
    model_args['attn_pool_num_heads'] = model['map_heads'] or model['num_heads']
    model_args['attn_pool_mlp_ratio'] = _mlp_ratio(
        model['hidden_size'], model['map_mlp_dim'] or model['mlp_dim']
    )
  return _EVA_ARCHITECTURES[_norms(model)], model_args


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
