"""Meta's DINOv3 checkpoints in their own naming (the .pth files facebookresearch/dinov3's torch.hub
loads, `dinov3_vit*16_pretrain_*.pth`; the hub's facebook/dinov3-* hold transformers' names):
renamed as timm renames them as it loads them (eva.py's checkpoint_filter_fn, `timm_names`),
timm_layout.py reads them as timm's DINOv3 Eva.

- `storage_tokens` are the registers, `ls1.gamma` / `ls2.gamma` the layer scales, the SwiGLU's `w1`,
  `w2`, `w3` (its S+, H+ and 7B models) the gate, its linear layer and the output;
- the fused qkv bias counts through its `bias_mask` (DINOv3's keys have none): its query and value
  parts, masked, are Eva's q_bias and v_bias;
- left out: the masked-image token, the 7B's local-crop class norm, EUPE's distillation projectors,
  and the rotary embeddings' periods, which must be rope.py's 'dinov3' ones (a one-line error);
  theirs are bfloat16, ours (and timm's) float32: outputs differ by that rounding, as timm's do.

Their files carry no config.json: the fields no tensor shows (heads, epsilon, activation) are those
of timm's DINOv3 of the file's width and MLP, pooling the class token as Meta's and transformers'
do (`timm_config`); another width's say none. Their images were normalised with ImageNet's mean and
std, the satellite models' (SAT-493M, which Meta's file names say) with their own (`normalization`),
unless a config.json beside them says otherwise as timm's pretrained_cfg.
"""

import os
from typing import Any, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import timm_layout, torch_names
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import rope

# (Meta's, timm's) parts of the names, replaced in this order (timm's: `w12` before `w1`).
_RENAMED = (
    ('ls1.gamma', 'gamma_1'),
    ('ls2.gamma', 'gamma_2'),
    ('storage_tokens', 'reg_token'),
    ('mlp.w12', 'mlp.fc1'),
    ('mlp.w1', 'mlp.fc1_g'),
    ('mlp.w2', 'mlp.fc1_x'),
    ('mlp.w3', 'mlp.fc2'),
)
_LEFT_OUT = ('mask_token', 'local_cls_norm', 'projectors.')
_PERIODS = 'rope_embed.periods'
# timm's DINOv3 of each (width, gated MLP).
_ARCHITECTURES = {
    (384, False): 'vit_small_patch16_dinov3',
    (384, True): 'vit_small_plus_patch16_dinov3',
    (768, False): 'vit_base_patch16_dinov3',
    (1024, False): 'vit_large_patch16_dinov3',
    (1280, True): 'vit_huge_plus_patch16_dinov3',
    (4096, True): 'vit_7b_patch16_dinov3',
}


def recognises(state_dict: StateDict) -> bool:
  return 'storage_tokens' in state_dict and 'blocks.0.attn.qkv.weight' in state_dict


def _check_periods(periods: np.ndarray, source: str) -> None:
  """Meta's files keep the periods in bfloat16 (8 bits of mantissa): rope.py's float32 ones, as
  timm's, to two of its steps (another temperature is far off)."""
  ours = rope.dinov3_periods(4 * len(periods))
  if not np.allclose(np.asarray(periods, np.float32), ours, rtol=2**-7, atol=0):
    raise ValueError(
        f"{source}: its rotary embeddings' periods ({_PERIODS}) are not DINOv3's of temperature "
        f"{rope.DINOV3_TEMPERATURE:g}, which vit_jax's rope_style 'dinov3' computes"
    )


def timm_names(state_dict: StateDict, source: str) -> StateDict:
  """The state dict in the names of timm's Eva."""
  # Checked where read with their values (architecture's shapes-only read has zeros).
  if _PERIODS in state_dict and np.any(state_dict[_PERIODS]):
    _check_periods(state_dict[_PERIODS], source)
  renamed = {}
  for name, tensor in state_dict.items():
    if name == _PERIODS or name.endswith('.bias_mask') or name.startswith(_LEFT_OUT):
      continue
    if name.endswith('attn.qkv.bias') and f'{name}_mask' in state_dict:
      query, _, value = np.split(np.asarray(tensor) * np.asarray(state_dict[f'{name}_mask']), 3)
      renamed[name.replace('qkv.bias', 'q_bias')] = query
      renamed[name.replace('qkv.bias', 'v_bias')] = value
      continue
    renamed[torch_names.replaced(name, _RENAMED)] = tensor
  return renamed


def timm_config(config: Mapping[str, Any], state_dict: StateDict, path: str) -> Mapping[str, Any]:
  """timm's DINOv3 of the file's width and MLP (none for another width), pooling its class token,
  under what a config.json beside the file says."""
  del path
  width = state_dict['cls_token'].shape[-1]
  architecture = _ARCHITECTURES.get((width, 'blocks.0.mlp.fc1_g.weight' in state_dict))
  if architecture is None:
    return config
  return {'architecture': architecture, 'global_pool': 'token', **config}


_IMAGENET = ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
_SATELLITE = ([0.430, 0.411, 0.296], [0.213, 0.156, 0.143])


def normalization(
    config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  """The config.json's pretrained_cfg mean and std, else SAT-493M's for a file named so, else
  ImageNet's."""
  said = timm_layout.normalization(config, path)
  if said is not None:
    return said
  return _SATELLITE if 'sat493m' in os.path.basename(os.path.normpath(path)) else _IMAGENET
