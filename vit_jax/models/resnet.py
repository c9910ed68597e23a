"""The ResNet-v2 stem of the R50+ViT hybrid: weight-standardised convolutions and GroupNorm.

Names and structure follow the original hybrid code and checkpoints (`conv_root`, `gn_root`,
`block{n}/unit{m}/{conv1,gn1,conv2,gn2,conv3,gn3,conv_proj,gn_proj}`), so they load unchanged. The
weight-standardised convolution is BiT's too (bit.py), with BiT's epsilon.
"""

from typing import Optional, Sequence

import flax.linen as nn
import jax.numpy as jnp


def weight_standardize(
    w: jnp.ndarray, axis: Sequence[int], eps: float, *, eps_in_sqrt: bool = False
) -> jnp.ndarray:
  """`w` less its mean over `axis`, divided by its standard deviation plus `eps` (the original hybrid
  code), or with `eps_in_sqrt` by sqrt(variance + eps) (BiT's code, timm's StdConv2d). With BiT's eps
  of 1e-8 the two differ by 5e-5 relative for kernels of std 0.01, so each model keeps its own."""
  w = w - jnp.mean(w, axis=axis)
  if eps_in_sqrt:
    return w / jnp.sqrt(jnp.var(w, axis=axis) + eps)
  return w / (jnp.std(w, axis=axis) + eps)


class StdConv(nn.Conv):
  """A convolution whose kernel is standardised (zero mean, unit variance per output channel).

  The defaults are the hybrid's; BiT sets eps=1e-8, eps_in_sqrt=True.
  """

  eps: float = 1e-5
  eps_in_sqrt: bool = False

  def param(self, name, *args, **kwargs):
    param = super().param(name, *args, **kwargs)
    if name == 'kernel':
      param = weight_standardize(param, axis=[0, 1, 2], eps=self.eps, eps_in_sqrt=self.eps_in_sqrt)
    return param


class ResidualUnit(nn.Module):
  """Bottleneck unit: 1x1 -> 3x3 (strided) -> 1x1 with 4x the features, plus a projected shortcut."""

  features: int
  strides: tuple[int, int] = (1, 1)
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    conv = lambda features, kernel, name, strides=(1, 1): StdConv(
        features, kernel, strides=strides, use_bias=False, dtype=self.dtype, name=name
    )
    norm = lambda name, **kwargs: nn.GroupNorm(dtype=self.dtype, name=name, **kwargs)
    residual = x
    if x.shape[-1] != self.features * 4 or self.strides != (1, 1):
      residual = conv(self.features * 4, (1, 1), 'conv_proj', self.strides)(residual)
      residual = norm('gn_proj')(residual)
    y = nn.relu(norm('gn1')(conv(self.features, (1, 1), 'conv1')(x)))
    y = nn.relu(norm('gn2')(conv(self.features, (3, 3), 'conv2', self.strides)(y)))
    # Zero-initialised last norm: each unit starts as the identity on its shortcut.
    y = norm('gn3', scale_init=nn.initializers.zeros)(conv(self.features * 4, (1, 1), 'conv3')(y))
    return nn.relu(residual + y)


class ResNetStage(nn.Module):
  """`block_size` units; the first one changes the width and (after the first stage) the stride."""

  block_size: int
  features: int
  first_stride: tuple[int, int]
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    for i in range(self.block_size):
      x = ResidualUnit(
          self.features,
          strides=self.first_stride if i == 0 else (1, 1),
          dtype=self.dtype,
          name=f'unit{i + 1}',
      )(x)
    return x


# The hybrid R50+ViT's stem: the units of ResNet-50's first three stages.
R50_LAYERS = (3, 4, 9)

# Tensor parallelism in a bottleneck unit (Megatron's pattern, as in the blocks' MLPs): the first 1x1
# convolution's output channels and the 3x3 convolution's input channels are split over the mesh axis
# `tensor`, so the norm and ReLU between them act on each device's channels and one all-reduce follows
# the 3x3. Kernels are HWIO. The names are the hybrid stem's and BiT's (bit.py) units alike.
TENSOR_RULES = (
    (r'(^|/)block\d+/unit\d+/conv1/kernel$', 3),
    (r'(^|/)block\d+/unit\d+/conv2/kernel$', 2),
)


def stem_stride(num_layers: Optional[Sequence[int]]) -> int:
  """Input pixels per feature-map cell of `resnet_stem`: root conv and pool 4, then 2 per later stage
  (1 without a stem)."""
  return 4 * 2 ** (len(num_layers) - 1) if num_layers else 1


GROUPS = 32  # GroupNorm's groups (flax's default): every width must be a multiple of it.


def root_width(width_factor: float) -> int:
  """Channels of the root convolution; stage s has units of `root_width * 2**s` (x4 at their output)."""
  return int(64 * width_factor)


def check_width(width_factor: float) -> None:
  """A one-line ValueError for a `model.resnet_width_factor` whose widths GroupNorm cannot split."""
  if not width_factor > 0 or root_width(width_factor) % GROUPS:
    raise ValueError(
        f'model.resnet_width_factor={width_factor} gives {root_width(width_factor)} root channels, '
        f"not a positive multiple of GroupNorm's {GROUPS} groups: use a multiple of 0.5"
    )


def resnet_stem(
    x: jnp.ndarray, *, num_layers: Sequence[int], width_factor: float, dtype: jnp.dtype
) -> jnp.ndarray:
  """Root conv + max-pool and the stages `block1`, `block2`, ...: total stride `stem_stride`.

  A function, not a module: called inside the ViT's compact `__call__`, its layers live at the top of
  the parameter tree, where the original hybrid checkpoints have them.
  """
  width = root_width(width_factor)
  x = StdConv(width, (7, 7), strides=(2, 2), use_bias=False, dtype=dtype, name='conv_root')(x)
  x = nn.relu(nn.GroupNorm(dtype=dtype, name='gn_root')(x))
  x = nn.max_pool(x, window_shape=(3, 3), strides=(2, 2), padding='SAME')
  for i, block_size in enumerate(num_layers):
    x = ResNetStage(
        block_size,
        width * 2**i,
        first_stride=(2, 2) if i else (1, 1),
        dtype=dtype,
        name=f'block{i + 1}',
    )(x)
  return x
