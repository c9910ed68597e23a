"""Model variants and the registry that dispatches them: `FAMILIES` says which names are which
model; every tool builds its model and asks what it supports through it.

Each family's names, and the model fields they resolve to, are in its own module: vit_variants.py
(`ViT-B_16`, the hybrid `R50+ViT-B_16`, `Axial-ViT-B_16`, `checkpoint`) and bit_variants.py
(`BiT-R50x1`).
"""

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional

import flax.linen as nn

from vit_jax.models import bit, resnet
from vit_jax.models.bit_variants import PUBLISHED_BIT, bit_model_config
from vit_jax.models.vit import VisionTransformer
from vit_jax.models.vit_variants import (
    AXIAL,
    FROM_CHECKPOINT,
    PUBLISHED,
    PUBLISHED_HYBRIDS,
    input_stride,
    vit_model_config,
)


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


def _vit_tensor_split(model: Mapping[str, Any]) -> dict[str, Any]:
  """What tensor parallelism splits in a ViT (encoder.TENSOR_RULES): the heads and MLP units of its
  blocks, their key/value heads, and its MAP head's."""
  split = {'num_heads': model['num_heads'], 'mlp_dim': model['mlp_dim']}
  if model.get('num_kv_heads') is not None:
    split['num_kv_heads'] = model['num_kv_heads']
  if model.get('classifier') == 'map':
    split['map_heads'] = model.get('map_heads') or model['num_heads']
    split['map_mlp_dim'] = model.get('map_mlp_dim') or model['mlp_dim']
  return split


FAMILIES: dict[str, Family] = {
    'ViT': Family(
        'a Vision Transformer',
        re.compile(f'ViT-|^{FROM_CHECKPOINT}$'),
        PUBLISHED + PUBLISHED_HYBRIDS + AXIAL,
        vit_model_config,
        VisionTransformer,
        input_stride,
        _vit_tensor_split,
        lambda params: params,
    ),
    'BiT': Family(
        'a BiT ResNet',
        re.compile('^BiT-'),
        PUBLISHED_BIT,
        bit_model_config,
        bit.BiT,
        lambda model: 1,
        # Every unit's width is a multiple of the root's (resnet.TENSOR_RULES).
        lambda model: {'root width': resnet.root_width(model['resnet_width_factor'])},
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


def stride_of(variant: str, model_config: Mapping[str, Any]) -> int:
  """The pixels a token of `variant` with the resolved fields `model_config` spans: its images' side
  must be a multiple of it."""
  return FAMILIES[family(variant)].input_stride(model_config)


# The most tokens (patches, or a ResNet's feature-map cells) an image may have: a 16384 px image of
# 16 px patches. More (image_size=100000 for 10000) allocated and compiled for hours, silently.
MAX_TOKENS = 2**20


def check_tokens(image_size: int, stride: int, flag: str) -> None:
  """A one-line ValueError for images of `image_size` px (given as `flag`) with more than MAX_TOKENS
  tokens of `stride` px."""
  tokens = (image_size // stride) ** 2
  if tokens > MAX_TOKENS:
    raise ValueError(
        f'{flag}={image_size} cuts each image into {tokens:,} tokens of {stride} px, more than '
        f'{MAX_TOKENS:,} (a {int(MAX_TOKENS**0.5) * stride} px image): use a smaller image size '
        'or larger patches'
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
        'head_bias_init',
        'patch_dropout',
        'drop_path_rate',
        'attention',
        'matmul',
        'remat',
        'scan',
        'weight_init',
        'lora_dropout',
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
