"""The normalisation layers a ViT's blocks, heads and embeddings use (`model.norm_layer`, the keys of
NORM_LAYERS): LayerNorm (the paper's and most checkpoints'), or RMSNorm (AIMv2's: no centring, no
bias; timm's RmsNorm). Both take the model's `layernorm_epsilon`; their scale is `scale`, as in the
checkpoints, and a LayerNorm's bias `bias`.
"""

from typing import Any

import flax.linen as nn

NORM_LAYERS = {'layernorm': nn.LayerNorm, 'rmsnorm': nn.RMSNorm}


def norm(kind: str, epsilon: float, dtype: Any, name: str) -> nn.Module:
  """The normalisation layer `kind` (a key of NORM_LAYERS) named `name`, over the last axis."""
  return NORM_LAYERS[kind](epsilon=epsilon, dtype=dtype, name=name)
