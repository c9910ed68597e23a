"""Apple's AIMv2 checkpoints in their own naming (the hub's apple/aimv2-* before their HF-compatible
files, and pinned revisions of them: custom code `AIMv2Model`, model_type 'aimv2'): renamed as timm
renames them as it loads them (vision_transformer.py's _convert_aimv2, `timm_names`), timm_layout.py
reads them as timm's aimv2 architectures (RMSNorms, of the patch embeddings too, SwiGLU MLPs without
biases, GAP); their config.json, Apple's, says its heads and epsilon as that architecture's
model_args (`timm_config`), and the preprocessor_config.json beside them the normalisation.

A native-resolution AIMv2 in this naming (computed sin-cos position embeddings, no
`preprocessor.pos_embed`) is a one-line error: its transformers files (transformers_aimv2.py) load.
"""

from typing import Any, Mapping

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict

# (Apple's, timm's) parts of the names, replaced in this order (timm's): the MLP's fc1 is SwiGLU's
# gate, fc3 its linear layer, fc2 its output.
_RENAMED = (
    ('norm_1', 'norm1'),
    ('norm_2', 'norm2'),
    ('preprocessor.patchifier.', 'patch_embed.'),
    ('preprocessor.pos_embed', 'pos_embed'),
    ('trunk.', ''),
    ('post_trunk_norm.', 'norm.'),
    ('mlp.fc1', 'mlp.fc1_g'),
    ('mlp.fc3', 'mlp.fc1_x'),
)
# The timm architecture of every AIMv2 (their sizes are the tensors'), and the defaults of Apple's
# AIMv2Config for a config.json that leaves its heads or epsilon out.
_ARCHITECTURE = 'aimv2_large_patch14_224'
_HEADS, _EPSILON = 8, 1e-5


def recognises(state_dict: StateDict) -> bool:
  return 'preprocessor.patchifier.proj.weight' in state_dict


def timm_names(state_dict: StateDict, source: str) -> StateDict:
  """The state dict in the names of timm's VisionTransformer."""
  if 'preprocessor.pos_embed' not in state_dict:
    raise ValueError(
        f"{source}: an AIMv2 of native resolution in Apple's own naming, which timm does not "
        "read: load its transformers files (the hub's current revision of the repository)"
    )
  renamed = {}
  for name, tensor in state_dict.items():
    renamed[torch_names.replaced(name, _RENAMED)] = tensor
  return renamed


def timm_config(config: Mapping[str, Any], state_dict: StateDict, path: str) -> dict[str, Any]:
  """timm's config.json of Apple's (none where there is none: its heads then go unsaid)."""
  del state_dict, path  # Every AIMv2 is one architecture.
  if not config:
    return {}
  norm = {'type': 'RmsNorm', 'eps': float(config.get('rms_norm_eps', _EPSILON))}
  return {
      'architecture': _ARCHITECTURE,
      'model_args': {
          'num_heads': config.get('num_attention_heads', _HEADS),
          'norm_layer': norm,
          'embed_norm_layer': norm,
      },
  }
