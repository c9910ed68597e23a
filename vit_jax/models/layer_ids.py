"""Which depth of the ViT each parameter belongs to, for layer-wise learning-rate decay (BEiT, timm).

Paths are '/'-joined parameter paths of the checkpoint layout (`Transformer/encoderblock_3/...`). A
scanned model trains on its blocks stacked (`Transformer/encoderblock/...`, layer axis first):
`per_block_paths` names the checkpoint-layout parameter behind each slice of such an array.
"""

import re

from vit_jax.models.scan_layout import BLOCK

# The stem, layer id 0: the patch embedding and its norm, the class, distillation, register and mask
# tokens, the position embeddings, the norm before the first block and the hybrid's ResNet stem
# (conv_root, gn_root, block1..blockN at the top of the tree), as timm's group_matcher's stem
# (cls_token, dist_token, reg_token, pos_embed, patch_embed, norm_pre).
_STEM = re.compile(
    r'^(embedding|embedding_norm|cls|dist|reg|mask_token|conv_root|gn_root|block\d+'
    r'|Transformer/posembed_input|Transformer/pre_norm)(/|$)'
)
_BLOCK = re.compile(rf'^Transformer/{BLOCK}_(\d+)/')
# The encoder's final norm goes with its last block, as timm groups it (MATCH_PREV_GROUP).
_FINAL_NORM = re.compile(r'^Transformer/encoder_norm/')
_STACKED = re.compile(rf'^Transformer/{BLOCK}/')


def per_block_paths(path: str, shape: tuple[int, ...]) -> list[str]:
  """The checkpoint-layout paths of the array at `path`: one per layer for stacked blocks (their
  leading axis), else `path` itself."""
  if not _STACKED.match(path):
    return [path]
  return [_STACKED.sub(f'Transformer/{BLOCK}_{i}/', path) for i in range(shape[0])]


def layer_id(path: str, num_layers: int) -> int:
  """0 for the stem, i + 1 for the block i and num_layers for the encoder's final norm, num_layers + 1
  for the rest: the heads (MAP pooling, fc_norm, pre-logits, classifier), as timm's
  `param_groups_layer_decay` groups a ViT."""
  if _STEM.match(path):
    return 0
  block = _BLOCK.match(path)
  if block:
    return int(block[1]) + 1
  return num_layers if _FINAL_NORM.match(path) else num_layers + 1
