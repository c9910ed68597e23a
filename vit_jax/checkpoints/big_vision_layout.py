"""big_vision's ViT checkpoints (`.npz`: SigLIP's and SigLIP 2's image towers, its ViTs and
DeiT III conversions, gs://big_vision/...) in the original ViT layout vit_jax's model has (`original`),
and the model fields an `.npz` of either layout fixes (`architecture`: config.variant='checkpoint').

big_vision's models/vit.py names its modules as the original code did, but for:
- a block's attention, second LayerNorm and MLP: `MultiHeadDotProductAttention_0`, `LayerNorm_1`,
  `MlpBlock_0` (the original's `_1`, `_2`, `_3`);
- blocks trained with `scan=True` stacked in one `Transformer/encoderblock`, layer axis first;
- the position embeddings `pos_embedding` at the top, of the patches alone: it adds them before
  the class token joins (`pool_type='tok'`), so the class token's row is zeros here (the same
  function; fine-tuning then learns one);
- a two-tower model's (SigLIP's) image tower under `img/`, beside `txt/` and the logit scale and
  bias `t`, `b`, which are left out.
Every Dense, LayerNorm and GELU is flax's default: `mlp_activation=gelu_tanh` (nn.gelu's tanh form),
`layernorm_epsilon=1e-6`, as the original code's.

A NaFlex tower (naflex_vit.py: SigLIP 2's `*_naflex.npz`) is read as the fixed-resolution ViT it
computes on a square image whose tokens are all patches (no padding): its Dense over flattened
(row, column, channel) patches is a P x P convolution, its [n, n, D] position embeddings are the
n x n grid's (resized to a run's grid as it resizes them per image with
`posemb_interpolation=bilinear_antialiased`), its `patchln_post` the LayerNorm after the embedding
(`embed_norm`). A `patchln_pre` (a LayerNorm of the raw patches) is a one-line error.
"""

import math
from typing import Any, Mapping, Optional

import numpy as np

# big_vision's names of a block's modules, and the original ViT's.
_BLOCK_RENAMED = {
    'MultiHeadDotProductAttention_0': 'MultiHeadDotProductAttention_1',
    'LayerNorm_1': 'LayerNorm_2',
    'MlpBlock_0': 'MlpBlock_3',
}
_IMAGE_TOWER = 'img/'
_SCANNED = 'Transformer/encoderblock/'
_POSEMB = 'Transformer/posembed_input/pos_embedding'
_NAFLEX_PATCH_NORM = 'patchln_post/'


def recognises(flat: Mapping[str, Any]) -> bool:
  """Whether flat '/'-joined keys (their `params/` prefix dropped) are big_vision's."""
  return any(
      key.startswith(_IMAGE_TOWER)
      or key in ('pos_embedding', 'Transformer/pos_embedding')
      or '/MlpBlock_0/' in key.partition('encoderblock')[2]
      for key in flat
  )


def original(flat: Mapping[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
  """A big_vision checkpoint's flat tree in the original ViT layout (the image tower's)."""
  if any(key.startswith(_IMAGE_TOWER) for key in flat):
    flat = {k[len(_IMAGE_TOWER) :]: v for k, v in flat.items() if k.startswith(_IMAGE_TOWER)}
  if 'embedding/kernel' in flat and np.ndim(flat['embedding/kernel']) == 2:
    flat = _naflex_as_fixed(flat, path)
  converted = {}
  for key, value in flat.items():
    if key.startswith(_SCANNED):
      module, _, rest = key[len(_SCANNED) :].partition('/')
      for i, layer in enumerate(value):
        converted[f'Transformer/encoderblock_{i}/{_BLOCK_RENAMED.get(module, module)}/{rest}'] = (
            layer
        )
    elif key.startswith('Transformer/encoderblock_'):
      block, module, rest = key[len('Transformer/') :].split('/', 2)
      converted[f'Transformer/{block}/{_BLOCK_RENAMED.get(module, module)}/{rest}'] = value
    elif key in ('pos_embedding', 'Transformer/pos_embedding'):
      converted[_POSEMB] = _with_class_row(value, 'cls' in flat)
    else:
      converted[key] = value
  return converted


def _naflex_as_fixed(flat: Mapping[str, np.ndarray], path: str) -> dict[str, np.ndarray]:
  """A NaFlex tower's flat tree as big_vision's fixed-resolution ViT's (see the module's docstring)."""
  if any(key.startswith('patchln_pre/') for key in flat):
    raise ValueError(
        f'{path}: a big_vision NaFlex tower with patchln_pre (a LayerNorm of the raw patches), '
        "which vit_jax's ViT does not compute; pick a checkpoint without it"
    )
  rows, width = flat['embedding/kernel'].shape
  patch = math.isqrt(rows // 3)
  if patch * patch * 3 != rows:
    raise ValueError(
        f'{path}: a big_vision NaFlex patch embedding of {rows} inputs, which are not the pixels '
        'of a square RGB patch (P x P x 3)'
    )
  fixed = {}
  for key, value in flat.items():
    if key == 'embedding/kernel':
      value = value.reshape(patch, patch, 3, width)
    elif key == 'pos_embedding':
      value = value.reshape(1, -1, width)
    elif key.startswith(_NAFLEX_PATCH_NORM):
      key = 'embedding_norm/' + key[len(_NAFLEX_PATCH_NORM) :]
    fixed[key] = value
  return fixed


def _with_class_row(posemb: np.ndarray, class_token: bool) -> np.ndarray:
  """[1, patches, D] position embeddings with a zero row for the class token, where there is one;
  older big_vision files hold it already (the grid's rows plus one), as the original code's."""
  rows = posemb.shape[1]
  if not class_token or int(np.sqrt(rows)) ** 2 != rows:
    return posemb
  return np.concatenate([np.zeros_like(posemb[:, :1]), posemb], axis=1)


def architecture(tree: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields an `.npz` ViT in the original layout fixes: its sizes, heads (the attention
  kernels' [D, heads, head dim]), pooling and pre-logits from its tensors, flax's activation and
  epsilon. A one-line ValueError for a tree that is no plain ViT's (a hybrid's, a BiT's)."""
  encoder = tree.get('Transformer', {})
  blocks = sorted(k for k in encoder if k.startswith('encoderblock_'))
  kernel = np.shape(tree.get('embedding', {}).get('kernel', ()))
  if not blocks or len(kernel) != 4 or kernel[0] != kernel[1] or 'conv_root' in tree:
    raise ValueError(
        f"{path}: config.variant='checkpoint' reads the fields of a plain ViT's .npz (original "
        "or big_vision layout), and this is another model's: name its variant, e.g. "
        '--config.variant=R50+ViT-B_16'
    )
  block = encoder['encoderblock_0']
  map_head = tree.get('MAPHead_0')
  fields = {
      'patch_size': kernel[0],
      'hidden_size': kernel[3],
      'num_layers': len(blocks),
      'num_heads': np.shape(block['MultiHeadDotProductAttention_1']['query']['kernel'])[1],
      'mlp_dim': np.shape(block['MlpBlock_3']['Dense_0']['kernel'])[1],
      'mlp_activation': 'gelu_tanh',
      'layernorm_epsilon': 1e-6,
      'class_token': 'cls' in tree,
      'classifier': 'map' if map_head else 'token' if 'cls' in tree else 'gap',
      'posemb': 'learn' if 'posembed_input' in encoder else 'sincos2d',
      'representation_size': _units(tree.get('pre_logits')),
      'embed_norm': 'embedding_norm' in tree,
      'rope': False,
  }
  if map_head:
    heads = np.shape(map_head['MultiHeadDotProductAttention_0']['query']['kernel'])[1]
    units = _units(map_head['MlpBlock_0']['Dense_0'])
    fields['map_heads'] = None if heads == fields['num_heads'] else heads
    fields['map_mlp_dim'] = None if units == fields['mlp_dim'] else units
  return fields


def _units(dense: Optional[Mapping[str, Any]]) -> Optional[int]:
  return None if dense is None else np.shape(dense['kernel'])[1]
