"""Model variants, named like the original checkpoints: `ViT-{size}_{patch}`, e.g. `ViT-B_16`.

Sizes are the paper's Table 1 plus the common small ones (Ti, S) and a tiny one for tests. Any patch size
is accepted; the published ones are 8, 14 (H), 16 and 32. `R50+ViT-{size}_{stride}` is the hybrid: a
ResNet-50 stem (its first three stages, with 3, 4 and 9 units) whose feature map is cut into patches of
stride / 16 pixels, i.e. 1x1 for the published `R50+ViT-B_16`.

`BiT-R{depth}x{width}` is the paper's ResNet baseline (bit.py), e.g. `BiT-R50x1`, `BiT-R152x4`: depth
50, 101 or 152, width 1 to 4. `FAMILIES` says which names are which model; every tool builds its model
and asks what it supports through it.
"""

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn

from vit_jax.models import bit, rope
from vit_jax.models.attention import ATTENTION_FNS
from vit_jax.models.block import MLP_ACTIVATIONS
from vit_jax.models.fp8 import MATMULS
from vit_jax.models.inits import WEIGHT_INITS
from vit_jax.models.pooling import CLASSIFIERS
from vit_jax.models.posemb import POSEMB_WHERE, POSEMBS
from vit_jax.models.resnet import stem_stride
from vit_jax.models.vit import VisionTransformer, has_class_token

# name: (num_layers, hidden_size, mlp_dim, num_heads)
SIZES = {
    'testing': (2, 32, 64, 2),
    'Ti': (12, 192, 768, 3),
    'S': (12, 384, 1536, 6),
    'B': (12, 768, 3072, 12),
    'L': (24, 1024, 4096, 16),
    'H': (32, 1280, 5120, 16),
}
PUBLISHED = (
    'ViT-Ti_16',
    'ViT-S_16',
    'ViT-S_32',
    'ViT-B_8',
    'ViT-B_16',
    'ViT-B_32',
    'ViT-L_16',
    'ViT-L_32',
    'ViT-H_14',
)
PUBLISHED_HYBRIDS = ('R50+ViT-B_16', 'R50+ViT-L_32')
AXIAL = ('Axial-ViT-B_16', 'Axial-ViT-B_32')  # Appendix D.7's.
_NAME = re.compile(
    r'^(?:(?P<hybrid>R50\+)|(?P<axial>Axial-))?ViT-(?P<size>[A-Za-z]+)_(?P<patch>[0-9]+)$'
)
R50_LAYERS = (3, 4, 9)
# The ViT of config.init_from, a timm or transformers checkpoint: setup fills config.model's unset
# fields with what the checkpoint fixes (run_dir.fill_from_checkpoint), so config.model has its sizes.
FROM_CHECKPOINT = 'checkpoint'
_SIZE_FIELDS = ('patch_size', 'hidden_size', 'num_layers', 'mlp_dim', 'num_heads')
# model.classifier, model.posemb and model.posemb_where are the keys of pooling.CLASSIFIERS,
# posemb.POSEMBS and posemb.POSEMB_WHERE.
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


def input_stride(model: Mapping[str, Any]) -> int:
  """Pixels per patch of the input image for a model config: the image size must be a multiple of it.

  The same as the model's `input_stride` property, before the model is built.
  """
  return model['patch_size'] * stem_stride(model['resnet_layers'])


def _vit_model_config(
    variant: str, overrides: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
  """Keyword arguments of `VisionTransformer` (without num_classes/dtype) for a ViT variant name."""
  if variant == FROM_CHECKPOINT:
    missing = [name for name in _SIZE_FIELDS if (overrides or {}).get(name) is None]
    if missing:
      raise ValueError(
          f"config.variant='{FROM_CHECKPOINT}' is the ViT of config.init_from, whose fields the "
          f"run's setup reads from it, but model.{missing[0]} is unset: set --config.init_from "
          'to a timm or Hugging Face ViT (or set every size field of config.model)'
      )
    # A plain ViT's defaults: every size of the B preset is overridden.
    match = _NAME.match(f"ViT-B_{overrides['patch_size']}")
  else:
    match = _NAME.match(variant)
  if not match or match['size'] not in SIZES or int(match['patch']) < 1:
    raise ValueError(
        f'Unknown model variant {variant!r}: use ViT-<size>_<patch> with size in '
        f"{', '.join(SIZES)} (e.g. {', '.join(PUBLISHED)}), a hybrid R50+ViT-<size>_<stride> "
        f"(e.g. {', '.join(PUBLISHED_HYBRIDS)}), Axial-ViT-<size>_<patch> (e.g. {', '.join(AXIAL)}) "
        f"or '{FROM_CHECKPOINT}' (the ViT of config.init_from); set it with "
        '--config.variant=ViT-B_16'
    )
  num_layers, hidden_size, mlp_dim, num_heads = SIZES[match['size']]
  model = dict(
      patch_size=int(match['patch']),
      hidden_size=hidden_size,
      num_layers=num_layers,
      mlp_dim=mlp_dim,
      num_heads=num_heads,
      classifier='gap' if match['axial'] else 'token',
      class_token=None,  # Unset: the classifier's (a class token for 'token' only).
      fc_norm=False,
      posemb='learn',
      posemb_where='input',
      drop_path_rate=0.0,
      representation_size=None,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      head_dropout_rate=0.0,
      attention='xla',
      matmul='default',
      remat=None,
      scan=False,
      mlp_activation='gelu_tanh',
      layer_scale=None,
      qk_norm=False,
      key_bias=True,
      mlp_gated=False,
      mlp_norm=False,
      rope=False,
      rope_grid=None,
      layernorm_epsilon=1e-6,
      num_registers=0,
      distilled=False,
      pre_norm=False,
      weight_init='original',
      block='axial' if match['axial'] else 'standard',
      resnet_layers=R50_LAYERS if match['hybrid'] else None,
      resnet_width_factor=1.0,
  )
  for key, value in (overrides or {}).items():
    if key not in model:
      raise ValueError(f'Unknown model field {key!r}: known fields are {", ".join(model)}')
    if value is not None:
      model[key] = tuple(value) if key in ('resnet_layers', 'rope_grid') else value
  if match['hybrid'] and (overrides or {}).get('patch_size') is None:
    # The name gives the total stride; the patches are cut from the stem's feature map.
    stride = stem_stride(model['resnet_layers'])
    if int(match['patch']) % stride:
      raise ValueError(
          f'{variant}: the stride {match["patch"]} is not a multiple of the ResNet stem\'s '
          f'stride {stride}: use e.g. R50+ViT-{match["size"]}_{stride}'
      )
    model['patch_size'] = int(match['patch']) // stride
  _check_fields(model)
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
  return model


def _check_axial(model: dict[str, Any]) -> None:
  """What an Axial-ViT's row and column blocks cannot take: tokens outside the grid, options that act
  per block or per sequence (a row would be a sample of stochastic depth), the scanned layout."""
  refused = {
      'classifier': (
          model['classifier'] == 'token',
          'gap (or map): a class token is in no row or column',
      ),
      'class_token': (
          has_class_token(model['classifier'], model['class_token']),
          'False: a class token is in no row or column',
      ),
      'posemb_where': (model['posemb_where'] != 'input', 'input'),
      'posemb': (model['posemb'] == 'relative', 'learn (or learn2d, sincos2d, none)'),
      'drop_path_rate': (
          model['drop_path_rate'] > 0,
          '0: stochastic depth would drop rows, not images',
      ),
      'scan': (model['scan'], 'False: the scanned layout holds standard blocks'),
      'num_registers': (model['num_registers'] > 0, '0: register tokens are in no row or column'),
      'rope': (model['rope'], 'False: its positions are those of the whole grid'),
  }
  for field, (bad, fix) in refused.items():
    if bad:
      raise ValueError(
          f'Axial-ViT does not take model.{field}={model[field]!r}: set '
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
  if model['classifier'] not in CLASSIFIERS:
    raise ValueError(
        f"Unknown model.classifier {model['classifier']!r}: use one of " f"{', '.join(CLASSIFIERS)}"
    )
  # LayerNorm acts per token, so after taking the class token it is the encoder norm renamed.
  if model['classifier'] == 'token' and model['class_token'] is False:
    raise ValueError(
        "model.classifier='token' pools the class token, and model.class_token=False has none: "
        'set --config.model.class_token=True, or classifier=gap (or map)'
    )
  if model['fc_norm'] and model['classifier'] == 'token':
    raise ValueError(
        "model.fc_norm=True changes nothing with model.classifier='token' but the "
        'parameter names: set --config.model.classifier=gap (or map), or fc_norm=False'
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
  if model['layer_scale'] is not None and not model['layer_scale'] > 0:
    raise ValueError(
        f"model.layer_scale={model['layer_scale']} must be a positive initial scale, e.g. 1e-5 "
        '(or unset for no layer scale)'
    )
  if not 0 < model['layernorm_epsilon'] < 1:
    raise ValueError(
        f"model.layernorm_epsilon={model['layernorm_epsilon']} must be in (0, 1), e.g. 1e-6 "
        "(the original checkpoints' and timm's) or 1e-12 (Hugging Face's ViT)"
    )
  if model['rope']:
    rope.check_head_dim(model['hidden_size'] // model['num_heads'])
  grid = model['rope_grid']
  if grid is not None and not (
      model['rope'] and len(grid) == 2 and all(isinstance(n, int) and n > 0 for n in grid)
  ):
    raise ValueError(
        f'model.rope_grid={grid} must be the (rows, columns) of patches that rotary embeddings '
        "span (EVA-02's pretraining grid, e.g. (16, 16)), with model.rope=True; or unset"
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
  if model['posemb'] == 'sincos2d' and (model['hidden_size'] % 4 or model['hidden_size'] < 8):
    raise ValueError(
        f"model.hidden_size={model['hidden_size']} must be a multiple of 4 (at least 8) "
        "for model.posemb='sincos2d': change it or set --config.model.posemb=learn"
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
  if layers is not None and (not layers or min(layers) < 1):
    raise ValueError(
        f'model.resnet_layers={layers} must be positive numbers of units per stage, e.g. '
        f'{R50_LAYERS} (or unset for a pure ViT)'
    )
  if not model['resnet_width_factor'] > 0:
    raise ValueError(
        f"model.resnet_width_factor={model['resnet_width_factor']} must be positive, e.g. 1"
    )


# depth: units per stage (BiT's R50, R101, R152).
BIT_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
BIT_WIDTHS = (1, 2, 3, 4)
PUBLISHED_BIT = ('BiT-R50x1', 'BiT-R50x3', 'BiT-R101x1', 'BiT-R101x3', 'BiT-R152x2', 'BiT-R152x4')
_BIT_NAME = re.compile(r'^BiT-R(?P<depth>[0-9]+)x(?P<width>[0-9]+)$')


def _bit_model_config(
    variant: str, overrides: Optional[Mapping[str, Any]] = None
) -> dict[str, Any]:
  """Keyword arguments of `bit.BiT` (without num_classes/dtype) for a BiT variant name; of the model
  fields only resnet_layers and resnet_width_factor apply (tests make tiny BiTs with them)."""
  match = _BIT_NAME.match(variant)
  if not match or int(match['depth']) not in BIT_DEPTHS or int(match['width']) not in BIT_WIDTHS:
    raise ValueError(
        f'Unknown BiT variant {variant!r}: use BiT-R<depth>x<width> with depth in '
        f'{", ".join(map(str, BIT_DEPTHS))} and width in 1..{BIT_WIDTHS[-1]} (e.g. '
        f'{", ".join(PUBLISHED_BIT)}); set it with --config.variant=BiT-R50x1'
    )
  model = dict(
      resnet_layers=BIT_DEPTHS[int(match['depth'])], resnet_width_factor=float(match['width'])
  )
  for key, value in (overrides or {}).items():
    if value is None:
      continue
    if key not in model:
      raise ValueError(
          f'model.{key} does not apply to {variant}, a ResNet (it takes model.'
          f'{" and model.".join(model)}): unset --config.model.{key}'
      )
    model[key] = tuple(value) if key == 'resnet_layers' else value
  layers, width = model['resnet_layers'], model['resnet_width_factor']
  if not layers or not all(isinstance(n, int) and n >= 1 for n in layers):
    raise ValueError(
        f'model.resnet_layers={layers} must be positive numbers of units per stage, e.g. '
        f'{BIT_DEPTHS[50]}'
    )
  if not width > 0 or bit.root_width(width) % bit.GROUPS:
    raise ValueError(
        f'model.resnet_width_factor={width} gives {bit.root_width(width)} root channels, '
        f"not a positive multiple of GroupNorm's {bit.GROUPS} groups: use a multiple of 0.5"
    )
  return model


@dataclasses.dataclass(frozen=True)
class Family:
  """What a family of variants differs in, for the code that builds and handles its models."""

  what: str  # For messages: '{variant} is {what}'.
  names: re.Pattern  # Searched in a variant name; `model_config` rejects the unknown ones.
  examples: tuple[str, ...]
  model_config: Callable[[str, Optional[Mapping[str, Any]]], dict[str, Any]]
  module: Callable[..., nn.Module]  # (num_classes=, dtype=, **model_config) -> the classifier.
  input_stride: Callable[[Mapping[str, Any]], int]  # The image size must be a multiple of it.
  # What tensor parallelism splits ({name: size}, each a multiple of the axis); none: it refuses it.
  tensor_split: Callable[[Mapping[str, Any]], dict[str, int]]
  to_npz: Callable[[Any], Any]  # Parameters -> the tree of the family's published .npz layout.


FAMILIES: dict[str, Family] = {
    'ViT': Family(
        'a Vision Transformer',
        re.compile(f'ViT-|^{FROM_CHECKPOINT}$'),
        PUBLISHED + PUBLISHED_HYBRIDS + AXIAL,
        _vit_model_config,
        VisionTransformer,
        input_stride,
        lambda model: {'num_heads': model['num_heads'], 'mlp_dim': model['mlp_dim']},
        lambda params: params,
    ),
    'BiT': Family(
        'a BiT ResNet',
        re.compile('^BiT-'),
        PUBLISHED_BIT,
        _bit_model_config,
        bit.BiT,
        lambda model: 1,
        # Every unit's width is a multiple of the root's (resnet.TENSOR_RULES).
        lambda model: {'root width': bit.root_width(model['resnet_width_factor'])},
        bit.to_bit_npz,
    ),
}


def family(variant: str) -> str:
  """The key of `FAMILIES` whose names `variant` is (ViT for the hybrids and Axial-ViTs too)."""
  for name, entry in FAMILIES.items():
    if entry.names.search(variant):
      return name
  examples = ', '.join(example for entry in FAMILIES.values() for example in entry.examples[:3])
  raise ValueError(
      f'Unknown model variant {variant!r}: use one of {", ".join(FAMILIES)}, e.g. '
      f"{examples}, or '{FROM_CHECKPOINT}' (the ViT of config.init_from); set it with "
      '--config.variant=ViT-B_16'
  )


def get_model_config(variant: str, overrides: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
  """Keyword arguments of the variant's model (without num_classes/dtype): `VisionTransformer` or
  `bit.BiT`. `overrides` replaces preset fields; entries that are None keep the preset."""
  return FAMILIES[family(variant)].model_config(variant, overrides)


# Model fields a resumed run may change: they change how the parameters are trained (regularisation),
# computed (the attention kernel, rematerialisation, scanning the blocks) or first drawn, not the
# function they define.
RESUMABLE_FIELDS = frozenset(
    {
        'dropout_rate',
        'attention_dropout_rate',
        'head_dropout_rate',
        'drop_path_rate',
        'attention',
        'matmul',
        'remat',
        'scan',
        'weight_init',
    }
)


def function_changes(
    old: tuple[str, Mapping[str, Any]], new: tuple[str, Mapping[str, Any]]
) -> list[tuple[str, Any, Any]]:
  """(field, old value, new value) of the model fields outside RESUMABLE_FIELDS that differ between two
  (variant, model overrides) pairs, as their models resolve them: parameters of the same shapes that
  compute another function (another activation, position embeddings elsewhere)."""
  old_fields, new_fields = get_model_config(*old), get_model_config(*new)
  return [
      (f'model.{name}', old_fields.get(name), new_fields.get(name))
      for name in sorted(set(old_fields) | set(new_fields))
      if name not in RESUMABLE_FIELDS and old_fields.get(name) != new_fields.get(name)
  ]


def build(
    variant: str, model_config: Mapping[str, Any], *, num_classes: Optional[int], dtype: Any
) -> nn.Module:
  """The classifier of a variant from its resolved `get_model_config` (`num_classes=None`: its
  pre-logits features instead of logits)."""
  return FAMILIES[family(variant)].module(num_classes=num_classes, dtype=dtype, **model_config)


def make_model(
    variant: str,
    overrides: Optional[Mapping[str, Any]] = None,
    *,
    num_classes: Optional[int],
    dtype: Any,
) -> nn.Module:
  """The classifier of a variant with `overrides` of its fields, resolved here (see `build`)."""
  return build(variant, get_model_config(variant, overrides), num_classes=num_classes, dtype=dtype)


def require_vit(variant: str, what: str) -> None:
  """A one-line error when `what` (an option or tool that only a ViT has) is asked of another model."""
  name = family(variant)
  if name != 'ViT':
    raise ValueError(f'{what} needs a ViT variant: {variant} is {FAMILIES[name].what}')
