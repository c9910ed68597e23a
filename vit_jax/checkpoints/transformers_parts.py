"""The parts every Hugging Face transformers ViT family (transformers_families.py) is read with: the
wrappers' prefixes dropped (`unprefixed`), a family's blocks (`Blocks`: the same parts under other
names), what a family is (`Family`), and the readers of its dense layers, LayerNorms and patch
embedding into vit_jax's names."""

import dataclasses
import math
import re
from typing import Any, Callable, Mapping

import numpy as np

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict

POSEMB = 'Transformer/posembed_input/pos_embedding'
# The wrappers' prefixes: ViTForImageClassification's, ViTMAEForPreTraining's, ViTMSN's `vit.`;
# DeiTForImageClassificationWithTeacher's `deit.`; the *ForImageClassification of DINOv2, DINOv2 with
# registers and I-JEPA; SigLIP's and CLIP's vision towers as transformers 4 wrote them, and
# CLIPVisionModelWithProjection's, `vision_model.` (5.x writes SiglipVisionModel's and
# CLIPVisionModel's names bare); BEiT's and data2vec's *ForImageClassification.
_PREFIXES = (
    'vit.',
    'deit.',
    'dinov2.',
    'dinov2_with_registers.',
    'ijepa.',
    'vision_model.',
    'beit.',
    'data2vec_vision.',
)


def unprefixed(state_dict: StateDict) -> StateDict:
  """The image tower's tensors without the wrappers' prefixes. Of a whole SigLIP or CLIP model (an
  image and a text tower, as the hub's google/siglip-*, openai/clip-* hold), the image tower alone:
  the text tower, the projections into the shared space and the logit scale are not of an image
  classifier (but the `classifier` of a SiglipForImageClassification over one, which peft's adapters
  over a whole SigLIP save beside it); nor is CLIPVisionModelWithProjection's `visual_projection`. Of a masked autoencoder's pretraining model (ViTMAEForPreTraining: the hub's
  facebook/vit-mae-*), the encoder alone: its pixel decoder is not of one either (transformers_mae.py
  reads it apart)."""
  if any(name.startswith('text_model.') for name in state_dict):
    state_dict = {
        k: v for k, v in state_dict.items() if k.startswith(('vision_model.', 'classifier.'))
    }
  if (
      'visual_projection.weight' in state_dict
      and 'vision_model.post_layernorm.weight' in state_dict
  ):
    state_dict = {k: v for k, v in state_dict.items() if not k.startswith('visual_projection.')}
  if any(name.startswith('decoder.decoder_') for name in state_dict):
    state_dict = {k: v for k, v in state_dict.items() if k.startswith('vit.')}
  out = {}
  for name, value in state_dict.items():
    for prefix in _PREFIXES:
      name = name.removeprefix(prefix)
    out[name] = value
  return out


@dataclasses.dataclass(frozen=True)
class Blocks:
  """A family's names in its blocks `{layers}{i}.`: the attention's query, key, value and output
  projections (the key's bias may be absent: model.key_bias=False); the LayerNorms before the
  attention and before the MLP; the MLP's layers; the layer scales of the attention's and the MLP's
  outputs (DINOv2's, DINOv3's), if any.

  The MLP's layers are two, or three for a gated MLP (model.mlp_gated): the gate (activated), the
  linear layer it multiplies, the output layer (DINOv3's gate_proj, up_proj, down_proj); or two with
  `packed_gate`, the first packing the gate's and the linear layer's outputs, gate first (DINOv2's
  SwiGLU weights_in, weights_out). With `biases_optional`, a projection's or MLP layer's bias
  the file lacks is zeros (AIMv2's qkv_bias=False, mlp_bias=False; ViT's and DINOv2's qkv_bias=False),
  the key's none.
  """

  layers: str
  attention: tuple[str, str, str, str]
  norms: tuple[str, str]
  mlp: tuple[str, ...]
  scales: tuple[str, ...] = ()
  packed_gate: bool = False
  biases_optional: bool = False

  def count(self, state_dict: StateDict) -> int:
    return torch_names.num_blocks(state_dict, re.escape(self.layers) + r'(\d+)\.')

  def mlp_dim(self, state_dict: StateDict) -> int:
    rows = state_dict[f'{self.layers}0.{self.mlp[0]}.weight'].shape[0]
    return rows // 2 if self.packed_gate else rows

  def gated(self) -> bool:
    return self.packed_gate or len(self.mlp) == 3

  def key_bias(self, state_dict: StateDict) -> bool:
    """Whether the file's key projections have a bias (model.key_bias)."""
    return f'{self.layers}0.{self.attention[1]}.bias' in state_dict

  def tree(
      self, r: torch_names.Reader, state_dict: StateDict, num_heads: int
  ) -> dict[str, np.ndarray]:
    tree = {}
    for i in range(self.count(state_dict)):
      t, ours = f'{self.layers}{i}.', torch_names.BLOCK.format(i)
      weights = {}
      for name, theirs in zip(('q', 'k', 'v', 'out'), self.attention):
        weights[f'{name}.weight'] = r.take(f'{t}{theirs}.weight')
        if name != 'k' or r.has(f'{t}{theirs}.bias'):
          weights[f'{name}.bias'] = self._bias(r, f'{t}{theirs}', weights[f'{name}.weight'])
      tree.update(torch_names.attention_in(torch_names.ATTENTION.format(i), weights, num_heads))
      for theirs, layer_norm in zip(self.norms, ('LayerNorm_0', 'LayerNorm_2')):
        tree.update(r.norm(t + theirs, f'{ours}/{layer_norm}'))
      tree.update(self._mlp(r, t, f'{ours}/MlpBlock_3/'))
      for theirs, scale in zip(self.scales, ('ls1', 'ls2')):
        tree[f'{ours}/{scale}'] = r.take(t + theirs)
    return tree

  def _mlp(self, r: torch_names.Reader, t: str, mlp: str) -> dict[str, np.ndarray]:
    ours = ('Dense_0', 'Dense_linear', 'Dense_1') if len(self.mlp) == 3 else ('Dense_0', 'Dense_1')
    layers = {}
    for theirs, name in zip(self.mlp, ours):
      weight = r.take(f'{t}{theirs}.weight')
      layers[name] = weight, self._bias(r, f'{t}{theirs}', weight)
    return torch_names.mlp_in(mlp, layers, self.packed_gate)

  def _bias(self, r: torch_names.Reader, layer: str, weight: np.ndarray) -> np.ndarray:
    if self.biases_optional:
      return r.bias(f'{layer}.bias', len(weight))
    return r.take(f'{layer}.bias')


# ViT's names (ViTModel's, DeiT's, I-JEPA's, BEiT's), which other families' vary.
VIT_PATCHES = 'embeddings.patch_embeddings.projection'
VIT_BLOCKS = Blocks(
    'encoder.layer.',
    (
        'attention.attention.query',
        'attention.attention.key',
        'attention.attention.value',
        'attention.output.dense',
    ),
    ('layernorm_before', 'layernorm_after'),
    ('intermediate.dense', 'output.dense'),
    biases_optional=True,  # ViTConfig's qkv_bias=False.
)


@dataclasses.dataclass(frozen=True)
class Family:
  is_one: Callable[[StateDict], bool]  # Whether an (unprefixed) state dict is of this family.
  # (reader, state dict, num_heads, source) -> our flat tree, '/'-joined names.
  tree: Callable[[torch_names.Reader, StateDict, int, str], dict[str, np.ndarray]]
  # (state dict, its config.json, path) -> the model fields its tensors fix (their shapes only).
  fields: Callable[[StateDict, Mapping[str, Any], str], dict[str, Any]]
  # The config class's defaults, for a config.json that leaves them out (transformers' save_pretrained
  # writes only the values that differ from them).
  hidden_act: str
  layer_norm_eps: float
  epsilon_key: str = 'layer_norm_eps'  # Its config's name of the norms' epsilon.
  num_attention_heads: int = 12


def dense(r: torch_names.Reader, theirs: str, ours: str) -> dict[str, np.ndarray]:
  return {
      f'{ours}/kernel': torch_names.kernel(r.take(f'{theirs}.weight')),
      f'{ours}/bias': r.take(f'{theirs}.bias'),
  }


def patch_size(weight_shape: tuple[int, ...]) -> int:
  """A patch embedding's patch size: a convolution's (D, 3, p, p), or SigLIP 2's Linear (D, p * p * 3)
  over flattened patches."""
  return weight_shape[-1] if len(weight_shape) == 4 else math.isqrt(weight_shape[1] // 3)


def patches(r: torch_names.Reader, theirs: str) -> dict[str, np.ndarray]:
  weight = r.take(f'{theirs}.weight')
  if weight.ndim == 2:  # SigLIP 2's Linear over patches flattened (row, column, channel).
    p = patch_size(weight.shape)
    weight = weight.reshape(weight.shape[0], p, p, 3).transpose(0, 3, 1, 2)
  tree = {'embedding/kernel': torch_names.patch_kernel(weight)}
  if r.has(f'{theirs}.bias'):  # None in CLIP's, nor in ours with model.pre_norm.
    tree['embedding/bias'] = r.take(f'{theirs}.bias')
  return tree


def sizes(state_dict: StateDict, patches: str, blocks: Blocks) -> dict[str, Any]:
  kernel = state_dict[f'{patches}.weight'].shape
  return {
      'patch_size': patch_size(kernel),
      'hidden_size': kernel[0],
      'num_layers': blocks.count(state_dict),
      'mlp_dim': blocks.mlp_dim(state_dict),
      'mlp_gated': blocks.gated(),
      'fc_norm': False,
  }
