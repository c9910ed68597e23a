"""Meta's Sapiens 2 checkpoints in (`timm_names`): the hub's `timm/vit_*_patch16_sapiens2.fb` files
hold Meta's own naming, which timm renames as it loads them (eva.py's checkpoint_filter_fn); renamed
alike, timm_layout.py reads them as the Eva they are (grouped-query attention, layer scale of the
attention alone, RMSNorms, DINOv3's rotary embeddings, 8 registers: timm_architecture.py). Their
config.json is timm's."""

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict

# (Meta's, timm's) parts of the names, replaced in this order (timm's); the final norm is `ln1` at
# the top level, the blocks' `ln1`, `ln2` their first and second norms.
_RENAMED = (
    ('storage_tokens', 'reg_token'),
    ('patch_embed.projection.', 'patch_embed.proj.'),
    ('attn.wq.', 'attn.q_proj.'),
    ('attn.wk.', 'attn.k_proj.'),
    ('attn.wv.', 'attn.v_proj.'),
    ('attn.gamma.weight', 'gamma_1'),
    ('.ffn.w12.', '.mlp.fc1.'),  # SwiGLU's gate and linear layers packed, the gate's first.
    ('.ffn.w3.', '.mlp.fc2.'),
    ('.ln1.', '.norm1.'),
    ('.ln2.', '.norm2.'),
)


def recognises(state_dict: StateDict) -> bool:
  return 'blocks.0.attn.wq.weight' in state_dict and 'blocks.0.ffn.w12.weight' in state_dict


def timm_names(state_dict: StateDict, source: str) -> StateDict:
  """The state dict in timm's Eva's names, without what Eva computes or never reads: the rotary
  embeddings' periods (DINOv3's fixed ones, rope.py) and the masked-image pretraining's token."""
  del source
  renamed = {}
  for name, tensor in state_dict.items():
    if name == 'mask_token' or name.startswith('rope.'):
      continue
    name = torch_names.replaced(name, _RENAMED)
    renamed['norm.' + name[len('ln1.') :] if name.startswith('ln1.') else name] = tensor
  return renamed
