"""The ViT family's variants, named like the original checkpoints: `ViT-{size}_{patch}`, e.g.
`ViT-B_16`, and the fields of `VisionTransformer` they resolve to, with their checks.

Sizes are the paper's Table 1 plus the common small ones (Ti, S) and a tiny one for tests. Any patch
size is accepted; the published ones are 8, 14 (H), 16 and 32. `R50+ViT-{size}_{stride}` is the
hybrid: a ResNet-50 stem (its first three stages, with 3, 4 and 9 units) whose feature map is cut
into patches of stride / 16 pixels, i.e. 1x1 for the published `R50+ViT-B_16`.
`Axial-ViT-{size}_{patch}` is Appendix D.7's Axial-ViT; `checkpoint` is the ViT of config.init_from.
`vit_model_config` resolves a name and overrides of its fields, refusing in one line the values the
modules would take and fail on later.
"""

import re
from typing import Any, Mapping, Optional

from vit_jax.models import lora, vit_checks
from vit_jax.models import resnet
from vit_jax.models.resnet import stem_stride

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
# The model of config.init_from: setup fills config.model's unset fields with what a timm or
# transformers checkpoint fixes, or sets the variant and fields of a vit_jax run
# (warm_start.fill_from_checkpoint), so config.model has its sizes.
FROM_CHECKPOINT = 'checkpoint'
_SIZE_FIELDS = ('patch_size', 'hidden_size', 'num_layers', 'mlp_dim', 'num_heads')


# model.classifier, model.posemb and model.posemb_where are the keys of pooling.CLASSIFIERS,
# posemb.POSEMBS and posemb.POSEMB_WHERE.
def input_stride(model: Mapping[str, Any]) -> int:
  """Pixels per patch of the input image for a model config: the image size must be a multiple of it.

  The same as the model's `input_stride` property, before the model is built.
  """
  return model['patch_size'] * stem_stride(model['resnet_layers'])


def vit_model_config(variant: str, overrides: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
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
      map_heads=None,  # Unset: num_heads.
      map_mlp_dim=None,  # Unset: mlp_dim.
      map_include_prefix=False,
      fc_norm=False,
      final_norm=True,
      posemb='learn',
      posemb_where='input',
      drop_path_rate=0.0,
      representation_size=None,
      dropout_rate=0.0,
      attention_dropout_rate=0.0,
      head_dropout_rate=0.0,
      head_bias_init=0.0,
      patch_dropout=0.0,
      attention='xla',
      matmul='default',
      remat=None,
      scan=False,
      mlp_activation='gelu_tanh',
      layer_scale=None,
      layer_scale_mlp=True,
      num_kv_heads=None,  # Unset: num_heads.
      qk_norm=False,
      key_bias=True,
      attn_norm=False,
      mlp_gated=False,
      mlp_norm=False,
      res_post_norm=False,
      parallel_block=False,
      diff_attention=False,
      rope=False,
      rope_grid=None,
      rope_style='eva02',
      layernorm_epsilon=1e-6,
      norm_layer='layernorm',
      embed_norm=False,
      num_registers=0,
      distilled=False,
      pre_norm=False,
      weight_init='original',
      block='axial' if match['axial'] else 'standard',
      lora_rank=None,  # Unset: no low-rank adapters.
      lora_alpha=None,  # Unset: lora_rank.
      lora_targets=lora.DEFAULT_TARGETS,
      lora_dropout=0.0,
      resnet_layers=resnet.R50_LAYERS if match['hybrid'] else None,
      resnet_width_factor=1.0,
  )
  for key, value in (overrides or {}).items():
    if key not in model:
      raise ValueError(f'Unknown model field {key!r}: known fields are {", ".join(model)}')
    if value is not None:
      listed = key in ('resnet_layers', 'rope_grid') or isinstance(value, list)
      model[key] = tuple(value) if listed else value
  if match['hybrid'] and (overrides or {}).get('patch_size') is None:
    # The name gives the total stride; the patches are cut from the stem's feature map.
    stride = stem_stride(model['resnet_layers'])
    if int(match['patch']) % stride:
      raise ValueError(
          f'{variant}: the stride {match["patch"]} is not a multiple of the ResNet stem\'s '
          f'stride {stride}: use e.g. R50+ViT-{match["size"]}_{stride}'
      )
    model['patch_size'] = int(match['patch']) // stride
  vit_checks.check(model)
  return model
