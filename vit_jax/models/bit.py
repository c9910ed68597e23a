"""BiT: the pre-activation ResNet-v2 of "Big Transfer" (Kolesnikov et al., 2020), the baseline of the
ViT paper's Table 2 and Figure 5.

Each bottleneck unit is GroupNorm + ReLU before each weight-standardised convolution (1x1, 3x3 with the
stride, 1x1 to 4x the width); the first unit of each stage projects its shortcut from the pre-activated
input. The root is a 7x7/2 convolution and a 3x3/2 max-pool; the head a GroupNorm + ReLU, global
average pooling and a zero-initialised linear layer. Numerics are timm's `resnetv2_*_bit` (those of
BiT's own code): weight standardisation with eps 1e-8 under the square root, GroupNorm(32) with eps
1e-5, the root convolution padded by 3 and its output by 1 with zeros before the pool.

The parameter tree is big_vision's BiT: `conv_root`, `block{s}/unit{u}/{gn1,conv1,gn2,conv2,gn3,conv3,
conv_proj}`, `norm-pre-head`, `head`. `from_bit_npz` and `to_bit_npz` convert it from and to the
published BiT `.npz` layout (`resnet/root_block/standardized_conv2d/kernel`,
`resnet/block1/unit01/a/group_norm/gamma`, ...), which timm's resnetv2 `load_pretrained` reads.
"""

import functools
import re
from typing import Any, Mapping, Optional

import chex
import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from vit_jax.models.resnet import GROUPS, StdConv, root_width

Dtype = Any


def _conv(*args, **kwargs) -> StdConv:
  return StdConv(*args, use_bias=False, eps=1e-8, eps_in_sqrt=True, **kwargs)


def _norm(**kwargs) -> nn.GroupNorm:
  return nn.GroupNorm(num_groups=GROUPS, epsilon=1e-5, **kwargs)


class PreActUnit(nn.Module):
  """Bottleneck unit of `features` (output 4x that), the stride in its 3x3 convolution."""

  features: int
  strides: int = 1
  projection: bool = False  # The first unit of a stage: its shortcut is a 1x1 convolution.
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    conv = functools.partial(_conv, dtype=self.dtype)
    norm = functools.partial(_norm, dtype=self.dtype)
    s = (self.strides, self.strides)
    x_pre = nn.relu(norm(name='gn1')(x))
    shortcut = x
    if self.projection:
      shortcut = conv(self.features * 4, (1, 1), strides=s, padding='VALID', name='conv_proj')(
          x_pre
      )
    y = conv(self.features, (1, 1), padding='VALID', name='conv1')(x_pre)
    y = nn.relu(norm(name='gn2')(y))
    y = conv(self.features, (3, 3), strides=s, padding=((1, 1), (1, 1)), name='conv2')(y)
    y = nn.relu(norm(name='gn3')(y))
    y = conv(self.features * 4, (1, 1), padding='VALID', name='conv3')(y)
    return y + shortcut


class Stage(nn.Module):
  """`units` units of `features`; the first one projects the shortcut and strides."""

  units: int
  features: int
  strides: int
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
    for u in range(self.units):
      x = PreActUnit(
          self.features,
          strides=self.strides if u == 0 else 1,
          projection=u == 0,
          dtype=self.dtype,
          name=f'unit{u + 1}',
      )(x)
    return x


class BiT(nn.Module):
  """BiT ResNet-v2 classifier; `num_classes=None` returns the pooled (pre-head) features. Any image
  size: the network is convolutional up to the global average pooling. Logits are float32."""

  num_classes: Optional[int]
  resnet_layers: tuple[int, ...]  # Units per stage, e.g. (3, 4, 6, 3) for R50.
  resnet_width_factor: float = 1.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, images: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    del train  # No dropout and no batch statistics: training computes what evaluation does.
    chex.assert_shape(
        images,
        (None, None, None, 3),
        custom_message='the model takes a batch of RGB images [batch, height, width, 3]',
    )
    width = root_width(self.resnet_width_factor)
    x = _conv(
        width, (7, 7), strides=(2, 2), padding=((3, 3), (3, 3)), dtype=self.dtype, name='conv_root'
    )(images.astype(self.dtype))
    # Zeros, not the -inf of a padded max-pool: BiT's (and timm's 'fixed' stem's) padding, which
    # matters here because the pre-activation root has negative outputs.
    x = jnp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding='VALID')
    for s, units in enumerate(self.resnet_layers):
      x = Stage(
          units, width * 2**s, strides=2 if s else 1, dtype=self.dtype, name=f'block{s + 1}'
      )(x)
    x = nn.relu(_norm(dtype=self.dtype, name='norm-pre-head')(x))
    x = jnp.mean(x, axis=(1, 2))
    chex.assert_shape(x, (images.shape[0], width * 2 ** (len(self.resnet_layers) - 1) * 4))
    if self.num_classes is None:
      return x.astype(jnp.float32)
    x = nn.Dense(
        self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros, name='head'
    )(x)
    return x.astype(jnp.float32)


# Our names -> the published layout's: at the top, and inside each unit (its layers a, b, c are our
# 1, 2, 3; the projection is under a).
_TOP = {
    'conv_root/kernel': 'resnet/root_block/standardized_conv2d/kernel',
    'norm-pre-head/scale': 'resnet/group_norm/gamma',
    'norm-pre-head/bias': 'resnet/group_norm/beta',
    'head/kernel': 'resnet/head/conv2d/kernel',
    'head/bias': 'resnet/head/conv2d/bias',
}
_IN_UNIT = {
    'conv_proj/kernel': 'a/proj/standardized_conv2d/kernel',
    **{
        f'{ours}{i}/{param}': f'{layer}/{theirs}'
        for i, layer in enumerate('abc', 1)
        for ours, param, theirs in (
            ('conv', 'kernel', 'standardized_conv2d/kernel'),
            ('gn', 'scale', 'group_norm/gamma'),
            ('gn', 'bias', 'group_norm/beta'),
        )
    },
}
_OUR_UNIT = re.compile(r'^block(?P<s>\d+)/unit(?P<u>\d+)/(?P<name>.+)$')
_THEIR_UNIT = re.compile(r'^resnet/block(?P<s>\d+)/unit(?P<u>\d+)/(?P<name>.+)$')


def is_bit_npz(flat: Mapping[str, Any]) -> bool:
  """Whether flat '/'-joined keys are the published BiT layout."""
  return any(key.startswith('resnet/') for key in flat)


def _ours(key: str) -> str:
  """Our name of a BiT `.npz` key; an unknown key stays as it is, for the shape check to name."""
  top = {theirs: ours for ours, theirs in _TOP.items()}
  in_unit = {theirs: ours for ours, theirs in _IN_UNIT.items()}
  unit = _THEIR_UNIT.match(key)
  if unit and unit['name'] in in_unit:
    return f'block{int(unit["s"])}/unit{int(unit["u"])}/{in_unit[unit["name"]]}'
  return top.get(key, key)


def from_bit_npz(flat: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """Our parameter tree of a BiT `.npz`'s flat arrays (the mapping of timm's resnetv2 `_load_weights`;
  the head's 1x1 convolution kernel becomes a dense one)."""
  tree = {_ours(key): np.asarray(value) for key, value in flat.items()}
  if 'head/kernel' in tree:
    tree['head/kernel'] = tree['head/kernel'].reshape(tree['head/kernel'].shape[-2:])
  return traverse_util.unflatten_dict(tree, sep='/')


def to_bit_npz(params: Any) -> dict[str, np.ndarray]:
  """Our parameter tree as flat float32 arrays in the published BiT `.npz` layout."""
  out = {}
  for key, value in traverse_util.flatten_dict(params, sep='/').items():
    value = np.asarray(value, np.float32)
    unit = _OUR_UNIT.match(key)
    if key in _TOP:
      out[_TOP[key]] = value.reshape((1, 1) + value.shape) if key == 'head/kernel' else value
    elif unit and unit['name'] in _IN_UNIT:
      out[f'resnet/block{unit["s"]}/unit{int(unit["u"]):02d}/{_IN_UNIT[unit["name"]]}'] = value
    else:
      raise ValueError(f"the BiT .npz layout has no counterpart of {key!r}: is this a BiT's tree?")
  return out
