"""The naming shared by PyTorch's ViTs (timm's, transformers') and ours: weight transposes, the
attention split per head, a reader that reports what it left over. Weights of PyTorch's `Linear` are
(out, in), Flax kernels (in, out); our attention kernels are split per head, (D, heads, D/heads)."""

import math
import re
from typing import Mapping, Sequence

import numpy as np

from vit_jax.checkpoints.torch_files import StateDict

BLOCK = 'Transformer/encoderblock_{}'
ENCODER_NORM = 'Transformer/encoder_norm'  # The final norm of the encoder (not model.fc_norm).
ATTENTION = BLOCK + '/MultiHeadDotProductAttention_1'


def replaced(name: str, parts: Sequence[tuple[str, str]]) -> str:
  """`name` with each (old, new) of `parts` replaced in turn: how timm's checkpoint filters rename
  another naming's tensors to its own (sapiens_layout.py, apple_aimv2_layout.py,
  meta_dinov3_layout.py do it alike)."""
  for old, new in parts:
    name = name.replace(old, new)
  return name


# The MLP activations of timm's `act_layer` and transformers' `hidden_act` that vit_jax's ViT has:
# their `model.mlp_activation` (transformers' gelu_new and gelu_pytorch_tanh are GELU's tanh form,
# gelu_python the exact one, swish SiLU).
ACTIVATIONS = {
    'gelu': 'gelu',
    'gelu_tanh': 'gelu_tanh',
    'gelu_new': 'gelu_tanh',
    'gelu_pytorch_tanh': 'gelu_tanh',
    'gelu_python': 'gelu',
    'quick_gelu': 'quick_gelu',
    'silu': 'silu',
    'swish': 'silu',
}


def activation(
    named: str, path: str, known: Mapping[str, str] = ACTIVATIONS, owner: str = 'the checkpoint'
) -> str:
  """Our model.mlp_activation for a checkpoint's named one (a key of `known`: the names its library
  gives them); a one-line error for one we have not (the MLP's nonlinearity has no parameters:
  loading the weights would compute another function)."""
  if named not in known:
    raise ValueError(
        f"{path}: {owner}'s MLP uses the activation {named!r}, which vit_jax's ViT "
        f"has not (model.mlp_activation: {', '.join(sorted(set(known.values())))})"
    )
  return known[named]


def kernel(weight: np.ndarray) -> np.ndarray:
  return weight.T


def patch_kernel(weight: np.ndarray) -> np.ndarray:
  return weight.transpose(2, 3, 1, 0)  # (D, 3, p, p) -> (p, p, 3, D)


def attention_in(
    prefix: str, weights: dict[str, np.ndarray], num_heads: int
) -> dict[str, np.ndarray]:
  """Our query/key/value/out parameters from (out, in) weights and biases named q, k, v, out; without
  a `k.bias`, a key projection without bias (model.key_bias=False). Keys and values may have fewer
  heads of the queries' width (grouped-query attention: model.num_kv_heads)."""
  d = weights['out.weight'].shape[0]
  head_dim = d // num_heads
  tree = {
      f'{prefix}/out/kernel': weights['out.weight'].T.reshape(num_heads, head_dim, d),
      f'{prefix}/out/bias': weights['out.bias'],
  }
  for name, ours in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    tree[f'{prefix}/{ours}/kernel'] = weights[f'{name}.weight'].T.reshape(d, -1, head_dim)
    if f'{name}.bias' in weights:
      tree[f'{prefix}/{ours}/bias'] = weights[f'{name}.bias'].reshape(-1, head_dim)
  return tree


class Reader:
  """Takes tensors out of a state dict by name, so that what is left over can be reported."""

  def __init__(self, state_dict: StateDict, source: str, layout: str):
    self._left = dict(state_dict)
    self._source, self._layout = source, layout

  def has(self, name: str) -> bool:
    return name in self._left

  def take(self, name: str) -> np.ndarray:
    if name not in self._left:
      raise ValueError(
          f'{self._source}: {self._layout} tensor {name!r} is missing: the file is not a '
          'complete ViT in that naming'
      )
    return np.asarray(self._left.pop(name), np.float32)

  def norm(self, theirs: str, ours: str) -> dict[str, np.ndarray]:
    """Our norm `ours` from `theirs` (without '.weight'): a LayerNorm's scale and bias, or an
    RMSNorm's scale alone (model.norm_layer)."""
    tree = {f'{ours}/scale': self.take(f'{theirs}.weight')}
    if self.has(f'{theirs}.bias'):
      tree[f'{ours}/bias'] = self.take(f'{theirs}.bias')
    return tree

  def drop_matching(self, pattern: str) -> None:
    """Leaves out the tensors whose names match `pattern`: buffers that are computed, not read."""
    for name in [n for n in self._left if re.search(pattern, n)]:
      del self._left[name]

  def bias(self, name: str, width: int) -> np.ndarray:
    """The bias `name`, or zeros of `width` where the layer has none (timm's qkv_bias=False,
    proj_bias=False): zeros compute the same function."""
    return self.take(name) if self.has(name) else np.zeros(width, np.float32)

  def check_all_taken(self) -> None:
    if self._left:
      name = sorted(self._left)[0]
      raise ValueError(
          f'{self._source}: {self._layout} tensor {name!r} {self._left[name].shape} has no '
          f"counterpart in vit_jax's ViT ({len(self._left)} such): the checkpoint is "
          'another architecture'
      )


def num_blocks(state_dict: StateDict, pattern: str) -> int:
  return len({m[1] for name in state_dict if (m := re.match(pattern, name))})


def mlp_in(
    mlp: str, layers: Mapping[str, tuple[np.ndarray, np.ndarray]], packed_gate: bool = False
) -> dict[str, np.ndarray]:
  """Our MLP `mlp` (ending in '/') of PyTorch's (out, in) weights and biases by our layer's name:
  `Dense_0` (the gate, where gated), `Dense_linear`, `Dense_1`. With `packed_gate`, `Dense_0` packs
  the gate's and the linear layer's outputs, the gate's first (timm's GluMlp, transformers' DINOv2
  SwiGLU), and is split into both."""
  layers = dict(layers)
  if packed_gate:
    (gate, linear), (gate_bias, linear_bias) = (np.split(a, 2) for a in layers['Dense_0'])
    layers['Dense_0'], layers['Dense_linear'] = (gate, gate_bias), (linear, linear_bias)
  tree = {}
  for ours, (weight, bias) in layers.items():
    tree[f'{mlp}{ours}/kernel'], tree[f'{mlp}{ours}/bias'] = kernel(weight), bias
  return tree


def square(n: int) -> bool:
  return n >= 0 and math.isqrt(n) ** 2 == n


def attention_out(flat: dict[str, np.ndarray], prefix: str, d: int) -> StateDict:
  """`attention_in` reversed: (out, in) weights and biases named q, k, v, out of our attention
  `prefix`'s parameters, taken out of `flat` (no `k.bias` without a key bias)."""
  weights = {}
  for name, ours in (('q', 'query'), ('k', 'key'), ('v', 'value'), ('out', 'out')):
    kernel = flat.pop(f'{prefix}/{ours}/kernel')  # Keys and values may have fewer heads.
    weights[f'{name}.weight'] = kernel.reshape((d, -1) if name != 'out' else (-1, d)).T
    if f'{prefix}/{ours}/bias' in flat:
      weights[f'{name}.bias'] = flat.pop(f'{prefix}/{ours}/bias').reshape(-1)
  return weights


def relative_biases_in(
    r: Reader, shared: str, per_block: str, num_blocks: int, source: str
) -> dict[str, np.ndarray]:
  """Each block's `relative_posemb` from BEiT's relative position bias tables [(2h - 1)(2w - 1) + 3,
  heads] of a square grid (timm's Beit, transformers' BEiT and data2vec): block i's `per_block`
  (formatted with i), or the `shared` one all blocks use, which each block's copy computes alike;
  none for a block without one. The offsets' biases, then the class token's three, in
  posemb.relative_index's order (BEiT's)."""
  common = r.take(shared) if r.has(shared) else None
  tree = {}
  for i in range(num_blocks):
    name = per_block.format(i)
    if common is None and not r.has(name):
      continue
    table = r.take(name) if common is None else common
    side = math.isqrt(table.shape[0] - 3)
    if side * side != table.shape[0] - 3:
      raise ValueError(
          f'{source}: its relative position biases ({table.shape[0]} rows) are not of a square '
          "grid of patches, which vit_jax's readers take"
      )
    ours = f'{BLOCK.format(i)}/relative_posemb/'
    tree[ours + 'relative_bias'] = table[:-3].reshape(side, side, -1)
    tree[ours + 'prefix_bias'] = table[-3:]
  return tree
