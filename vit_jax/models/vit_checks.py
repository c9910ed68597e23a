"""The checks of a resolved ViT model config (`check`, which vit_variants.vit_model_config runs): each
field's value refused in one line, naming the fix, before any module is built with it; and the remat
policies `model.remat` takes."""

import math
from typing import Any

from vit_jax.models import lora, patch_dropout, resnet, rope
from vit_jax.models.attention import ATTENTION_FNS
from vit_jax.models.block import MLP_ACTIVATIONS
from vit_jax.models.fp8 import MATMULS
from vit_jax.models.inits import WEIGHT_INITS
from vit_jax.models.norms import NORM_LAYERS
from vit_jax.models.pooling import CLASS_TOKEN_POOLINGS, CLASSIFIERS
from vit_jax.models.posemb import POSEMB_WHERE, POSEMBS, SINCOS
from vit_jax.models.vit import has_class_token

# Fast paths (encoder.py; the attention kernels are the keys of attention.ATTENTION_FNS). The remat
# policies are the `jax.checkpoint_policies` that take no arguments, from saving nothing (recompute the
# whole block) to saving everything (no recomputation).
REMAT_POLICIES = (
    'nothing_saveable',
    'dots_saveable',
    'dots_with_no_batch_dims_saveable',
    'checkpoint_dots',
    'checkpoint_dots_with_no_batch_dims',
    'everything_saveable',
)


def check(model: dict[str, Any]) -> None:
  """One-line ValueErrors for the values of a resolved ViT model config that the modules would take
  and fail on (or silently misuse) later."""
  _check_fields(model)
  lora.check(model)
  patch_dropout.check(model)
  rope.check(model)
  if model['block'] == 'axial':
    _check_axial(model)
  if model['hidden_size'] % model['num_heads']:
    raise ValueError(
        f"hidden_size={model['hidden_size']} is not divisible by num_heads={model['num_heads']}: "
        'change --config.model.num_heads or --config.model.hidden_size'
    )
  if model['attention'] not in ATTENTION_FNS:
    raise ValueError(
        f"Unknown model.attention {model['attention']!r}: use one of " f"{', '.join(ATTENTION_FNS)}"
    )
  if model['matmul'] not in MATMULS:
    raise ValueError(f"Unknown model.matmul {model['matmul']!r}: use one of {', '.join(MATMULS)}")
  if model['attention'] == 'dot_product_attention' and model['attention_dropout_rate']:
    raise ValueError(
        "model.attention='dot_product_attention' has no dropout on the attention weights: "
        'set --config.model.attention_dropout_rate=0 or --config.model.attention=xla'
    )
  if model['remat'] is not None and model['remat'] not in REMAT_POLICIES:
    raise ValueError(
        f"Unknown model.remat policy {model['remat']!r}: use one of "
        f"{', '.join(REMAT_POLICIES)} (or leave it unset for no rematerialisation)"
    )


def _check_axial(model: dict[str, Any]) -> None:
  """What an Axial-ViT's row and column blocks cannot take: tokens outside the grid, options that act
  per block or per sequence (a row would be a sample of stochastic depth), the scanned layout."""
  refused = {
      'classifier': (
          model['classifier'] in CLASS_TOKEN_POOLINGS,
          'gap (or map): a class token is in no row or column',
      ),
      'class_token': (
          has_class_token(model['classifier'], model['class_token']),
          'False: a class token is in no row or column',
      ),
      'posemb_where': (model['posemb_where'] != 'input', 'input'),
      'posemb': (model['posemb'] == 'relative', 'learn (or learn2d, sincos2d, sincos2d_mae, none)'),
      'drop_path_rate': (
          model['drop_path_rate'] > 0,
          '0: stochastic depth would drop rows, not images',
      ),
      'scan': (model['scan'], 'False: the scanned layout holds standard blocks'),
      'num_registers': (model['num_registers'] > 0, '0: register tokens are in no row or column'),
      'rope': (model['rope'], 'False: its positions are those of the whole grid'),
  }
  _refuse('Axial-ViT', refused, model)


def _refuse(owner: str, refused: dict[str, tuple[bool, str]], model: dict[str, Any]) -> None:
  """A one-line ValueError for the first of the `refused` fields {field: (whether its value is
  refused, the fix)} that `owner` does not take."""
  for field, (bad, fix) in refused.items():
    if bad:
      raise ValueError(
          f'{owner} does not take model.{field}={model[field]!r}: set '
          f'--config.model.{field}={fix}'
      )


def _check_fields(model: dict[str, Any]) -> None:
  """One-line errors for values the modules would take and fail on (or silently misuse) later."""
  for name in ('patch_size', 'hidden_size', 'num_layers', 'mlp_dim', 'num_heads'):
    if not isinstance(model[name], int) or model[name] < 1:
      raise ValueError(
          f'model.{name}={model[name]} must be a positive integer: fix --config.model.{name}'
      )
  if not isinstance(model['num_registers'], int) or model['num_registers'] < 0:
    raise ValueError(
        f"model.num_registers={model['num_registers']} must be a whole number of tokens, e.g. 4 "
        '(0: none)'
    )
  if model['representation_size'] is not None and model['representation_size'] < 1:
    raise ValueError(
        f"model.representation_size={model['representation_size']} must be a positive "
        'width (or unset for no pre-logits layer)'
    )
  for name in ('dropout_rate', 'attention_dropout_rate', 'head_dropout_rate', 'drop_path_rate'):
    if not 0.0 <= model[name] < 1.0:
      raise ValueError(f'model.{name}={model[name]} must be in [0, 1), e.g. 0.1')
  if not math.isfinite(model['head_bias_init']):
    raise ValueError(
        f"model.head_bias_init={model['head_bias_init']} must be a finite number, e.g. -10.0"
    )
  if model['classifier'] not in CLASSIFIERS:
    raise ValueError(
        f"Unknown model.classifier {model['classifier']!r}: use one of " f"{', '.join(CLASSIFIERS)}"
    )
  heads = model['map_heads']
  if heads is not None and not (
      isinstance(heads, int) and heads > 0 and model['hidden_size'] % heads == 0
  ):
    raise ValueError(
        f'model.map_heads={heads} must be a positive number of heads that divides '
        f"model.hidden_size={model['hidden_size']} (or unset: num_heads)"
    )
  width = model['map_mlp_dim']
  if width is not None and not (isinstance(width, int) and width > 0):
    raise ValueError(
        f'model.map_mlp_dim={width} must be a positive width (or unset: model.mlp_dim)'
    )
  for name, unset in (('map_heads', None), ('map_mlp_dim', None), ('map_include_prefix', False)):
    if model[name] != unset and model['classifier'] != 'map':
      raise ValueError(
          f'model.{name}={model[name]!r} shapes the MAP head, and '
          f"model.classifier={model['classifier']!r} has none: set --config.model.classifier=map, "
          f'or unset model.{name}'
      )
  # LayerNorm acts per token, so after taking the class token it is the encoder norm renamed.
  if model['classifier'] in CLASS_TOKEN_POOLINGS and model['class_token'] is False:
    raise ValueError(
        f"model.classifier={model['classifier']!r} pools the class token, and "
        'model.class_token=False has none: set --config.model.class_token=True, or classifier=gap '
        '(or map)'
    )
  if model['fc_norm'] and model['classifier'] == 'token':
    raise ValueError(
        "model.fc_norm=True changes nothing with model.classifier='token' but the "
        'parameter names: set --config.model.classifier=gap (or map), or fc_norm=False'
    )
  if model['fc_norm'] and not model['final_norm']:
    raise ValueError(
        'model.fc_norm=True puts the final LayerNorm after the pooling, and '
        'model.final_norm=False has none: set --config.model.final_norm=True, or fc_norm=False'
    )
  if model['mlp_activation'] not in MLP_ACTIVATIONS:
    raise ValueError(
        f"Unknown model.mlp_activation {model['mlp_activation']!r}: use one of "
        f"{', '.join(MLP_ACTIVATIONS)} (gelu: timm's and Hugging Face's exact GELU)"
    )
  if model['distilled'] and (
      model['classifier'] != 'token' or model['fc_norm'] or model['representation_size']
  ):
    raise ValueError(
        "model.distilled=True (DeiT's distillation token and head) takes the class token's "
        'classifier without fc_norm or a pre-logits layer: set --config.model.classifier=token, '
        'fc_norm=False and representation_size=None, or distilled=False'
    )
  if model['layer_scale'] is not None and not 0 < model['layer_scale'] < math.inf:
    raise ValueError(
        f"model.layer_scale={model['layer_scale']} must be a positive finite initial scale, e.g. 1e-5 "
        '(or unset for no layer scale)'
    )
  if not model['layer_scale_mlp'] and model['layer_scale'] is None:
    raise ValueError(
        'model.layer_scale_mlp=False leaves the MLP unscaled, and without model.layer_scale no '
        'branch is: set --config.model.layer_scale (e.g. 1.0), or unset layer_scale_mlp'
    )
  _check_kv_heads(model)
  _check_differential(model)
  if model['parallel_block'] and (model['res_post_norm'] or not model['layer_scale_mlp']):
    field = 'res_post_norm=True' if model['res_post_norm'] else 'layer_scale_mlp=False'
    raise ValueError(
        f'model.parallel_block=True sums the attention and the MLP of one norm, which '
        f'model.{field} splits: unset one of them'
    )
  if model['norm_layer'] not in NORM_LAYERS:
    raise ValueError(
        f"Unknown model.norm_layer {model['norm_layer']!r}: use one of {', '.join(NORM_LAYERS)}"
    )
  if not 0 < model['layernorm_epsilon'] < 1:
    raise ValueError(
        f"model.layernorm_epsilon={model['layernorm_epsilon']} must be in (0, 1), e.g. 1e-6 "
        "(the original checkpoints' and timm's) or 1e-12 (Hugging Face's ViT)"
    )
  if model['weight_init'] not in WEIGHT_INITS:
    raise ValueError(
        f"Unknown model.weight_init {model['weight_init']!r}: use one of "
        f"{', '.join(WEIGHT_INITS)} (timm: timm's VisionTransformer initialisation)"
    )
  if model['weight_init'] != 'original' and model['resnet_layers'] is not None:
    raise ValueError(
        f"model.weight_init='{model['weight_init']}' re-draws a pure ViT; a hybrid's "
        'ResNet stem has no such scheme: set --config.model.weight_init=original'
    )
  if model['posemb'] not in POSEMBS:
    raise ValueError(f"Unknown model.posemb {model['posemb']!r}: use one of {', '.join(POSEMBS)}")
  if model['posemb'] in SINCOS and (model['hidden_size'] % 4 or model['hidden_size'] < 8):
    raise ValueError(
        f"model.hidden_size={model['hidden_size']} must be a multiple of 4 (at least 8) "
        f"for model.posemb='{model['posemb']}': change it or set --config.model.posemb=learn"
    )
  if model['posemb'] == 'learn2d' and model['hidden_size'] % 2:
    raise ValueError(
        f"model.hidden_size={model['hidden_size']} must be even for model.posemb='learn2d' "
        '(X and Y halves): change it or set --config.model.posemb=learn'
    )
  if model['posemb_where'] not in POSEMB_WHERE:
    raise ValueError(
        f"Unknown model.posemb_where {model['posemb_where']!r}: use one of "
        f"{', '.join(POSEMB_WHERE)}"
    )
  kinds = POSEMB_WHERE[model['posemb_where']]
  if model['posemb'] not in kinds:
    raise ValueError(
        f"model.posemb='{model['posemb']}' does not enter at model.posemb_where="
        f"'{model['posemb_where']}' (only {', '.join(kinds)} do; relative ones enter every "
        "block's attention): set --config.model.posemb_where=input"
    )
  if model['posemb'] == 'relative' and model['attention'] != 'xla':
    raise ValueError(
        "model.posemb='relative' adds a learned bias to the attention logits, which "
        f"model.attention='{model['attention']}' does not train: "
        'set --config.model.attention=xla'
    )
  layers = model['resnet_layers']
  if layers is not None and (
      not layers
      or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in layers)
  ):
    raise ValueError(
        f'model.resnet_layers={layers} must be positive numbers of units per stage, e.g. '
        f'{resnet.R50_LAYERS} (or unset for a pure ViT)'
    )
  if layers is not None:
    resnet.check_width(model['resnet_width_factor'])
  elif not model['resnet_width_factor'] > 0:
    raise ValueError(
        f"model.resnet_width_factor={model['resnet_width_factor']} must be positive, e.g. 1"
    )
  if layers is None and model['resnet_width_factor'] != 1:  # No ResNet stem to widen.
    raise ValueError(
        f"model.resnet_width_factor={model['resnet_width_factor']} widens a hybrid's ResNet stem, "
        'which a pure ViT has not: set --config.model.resnet_layers (e.g. (3, 4, 9) for R50), or '
        'leave resnet_width_factor unset'
    )


def _check_kv_heads(model: dict[str, Any]) -> None:
  """model.num_kv_heads: numbers of heads that divide num_heads, one or one per block, and alike in
  the scanned layout."""
  given, heads = model['num_kv_heads'], model['num_heads']
  if given is None:
    return
  each = tuple(given) if isinstance(given, (tuple, list)) else (given,) * model['num_layers']
  if len(each) != model['num_layers'] or not all(
      isinstance(n, int) and not isinstance(n, bool) and n > 0 and heads % n == 0 for n in each
  ):
    raise ValueError(
        f'model.num_kv_heads={given} must be a number of key/value heads that divides '
        f"num_heads={heads}, or a tuple of one per block ({model['num_layers']}); or unset"
    )
  if model['scan'] and len(set(each)) > 1:
    raise ValueError(
        f'model.num_kv_heads={given} differs between blocks, which model.scan=True runs as one: '
        'set --config.model.scan=False'
    )


def _check_differential(model: dict[str, Any]) -> None:
  """model.diff_attention: heads of an even width, and no rotary embeddings of the queries and keys,
  which differential.py splits in halves."""
  if not model['diff_attention']:
    return
  head_dim = model['hidden_size'] // model['num_heads']
  if head_dim % 2:
    raise ValueError(
        f'model.diff_attention=True splits each head in halves: its width hidden_size / num_heads '
        f'= {head_dim} must be even; change model.num_heads or hidden_size'
    )
  refused = {'rope': (model['rope'], 'False (no model to match turns the halves)')}
  _refuse('model.diff_attention=True', refused, model)
