"""The model_args of an export as timm's `Beit` (`beit_args`: BEiT's class, of relative position
biases in every block), and the one-line ValueError for what that class cannot hold; timm_export.py
writes them into the config.json beside the tensors."""

from typing import Any, Mapping

from vit_jax.checkpoints import timm_export_args
from vit_jax.models import vit

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
    ('norm_layer', ('layernorm',), 'norm_layer=layernorm'),
    ('embed_norm', (False,), 'embed_norm=False'),
    ('classifier', ('gap', 'token'), 'classifier=gap (or token)'),
    ('key_bias', (False,), 'key_bias=False (its q_bias and v_bias)'),
    ('final_norm', (True,), 'final_norm=True'),
    ('num_registers', (0,), 'num_registers=0'),
    ('layer_scale_mlp', (True,), 'layer_scale_mlp=True'),
    *((field, (False, None), f'{field}=False') for field in _BEIT_LACKS),
)


def beit_args(model: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
  """timm's `Beit` (BEiT's class, of relative position biases in every block) for the model, with
  its model_args; its class token is always there, and pooled as 'avg' normalises after the
  pooling (fc_norm), as 'token' before it."""
  fixed = _BEIT_FIXED + (
      ('mlp_activation', ('silu',) if model['mlp_gated'] else ('gelu',), ''),
      (
          'num_kv_heads',
          (model['num_kv_heads'],) if timm_export_args.kv_heads(model) is None else (),
          'num_kv_heads unset',
      ),
      # Unset, a class token where the classifier pools one (vit.has_class_token): gap's has none.
      (
          'class_token',
          (model['class_token'],)
          if vit.has_class_token(model['classifier'], model['class_token'])
          else (),
          'class_token=True',
      ),
      ('fc_norm', (model['classifier'] == 'gap',), 'fc_norm with gap only'),
  )
  for field, values, fix in fixed:
    if model[field] not in values:
      raise ValueError(
          f"timm's Beit (the class of relative position biases) has no "
          f'model.{field}={model[field]!r}: it needs ' + (fix or f'{field}={values[0]!r}')
      )
  model_args = {
      **{
          arg: value for arg, value in timm_export_args.sizes(model).items() if arg != 'class_token'
      },  # Always one.
      'qkv_bias': True,
      'swiglu_mlp': bool(model['mlp_gated']),
      'scale_mlp': bool(model['mlp_norm']),
      'use_abs_pos_emb': False,
      'use_rel_pos_bias': True,
      'init_values': model['layer_scale'],
  }
  return 'beit_base_patch16_224', model_args
