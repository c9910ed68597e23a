"""The BiT family's variants: `BiT-R{depth}x{width}` is the paper's ResNet baseline (bit.py), e.g.
`BiT-R50x1`, `BiT-R152x4`: depth 50, 101 or 152, width 1 to 4.
"""

import re
from typing import Any, Mapping, Optional

from vit_jax.models import resnet

# depth: units per stage (BiT's R50, R101, R152).
BIT_DEPTHS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
BIT_WIDTHS = (1, 2, 3, 4)
PUBLISHED_BIT = ('BiT-R50x1', 'BiT-R50x3', 'BiT-R101x1', 'BiT-R101x3', 'BiT-R152x2', 'BiT-R152x4')
_BIT_NAME = re.compile(r'^BiT-R(?P<depth>[0-9]+)x(?P<width>[0-9]+)$')


def bit_model_config(variant: str, overrides: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
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
  resnet.check_width(width)
  return model
