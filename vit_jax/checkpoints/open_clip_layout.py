"""OpenCLIP's checkpoints: its hub directories' `open_clip_model.safetensors` or
`open_clip_pytorch_model.bin` with the `open_clip_config.json` beside them (laion/CLIP-*,
apple/DFN*-CLIP-*, UCSC-VLAA's CLIPA, timm/ViT-*-SigLIP*, timm/PE-Core-*, ...), and OpenAI's CLIP
`.pt` files (TorchScript, no config: OpenAI's, QuickGELU, as open_clip reads them). Their image tower is
renamed to timm's names, as timm renames it as it loads it (vision_transformer.py's
`_convert_openai_clip` and `checkpoint_filter_fn`), and read as the timm ViT it then is
(timm_layout.py); the text tower and the logit scale are left out. open_clip builds one of two towers
(its model.py's `_build_vision_tower`):

- its own VisionTransformer (`visual.class_embedding`, `visual.transformer.resblocks`): heads of
  `head_width` units (64), QuickGELU where the model config says `quick_gelu` (OpenAI's, DFN's),
  LayerNorms of 1e-5 (`norm_kwargs`), the class token or the patches' mean pooled (`pool_type`), its
  final LayerNorm before the pooling or after it (`final_ln_after_pool`, CLIPA's: timm's fc_norm),
  layer scale (`ls_init_value`); its projection `proj` into the text tower's space is the head,
  whose bias is zeros, as the patch embedding's without a LayerNorm before the blocks (CLIPA's). Fixed sin-cos position embeddings (`pos_embed_type='sin_cos_2d'`) are read as
  learned ones: the same function, trained on where open_clip keeps them;
- a timm model (`visual.trunk`, `timm_model_name`), in timm's names already: that architecture,
  pooling as open_clip creates it (`timm_pool`), its head timm's (`timm_proj` unset), none
  (`'none'`) or open_clip's linear projection (`visual.head.proj`).

What vit_jax's ViT does not compute (CoCa's attentional pooler, open_clip's custom blocks, an MLP
projection, a timm tower that is no ViT of the table's) is a one-line error.
"""

from typing import Any, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import timm_arguments, torch_files, torch_names, torch_pickle
from vit_jax.checkpoints.torch_files import StateDict

CONFIG = 'open_clip_config.json'
_TOWER, _TRUNK = 'visual.', 'visual.trunk.'
# OpenAI's CLIP normalisation: open_clip's default where a config leaves it out.
_OPENAI = ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711])
# OpenAI's CLIP files are TorchScript archives without a config: open_clip (openai.py's
# `load_openai_model`) builds each with QuickGELU and its tower's defaults.
_OPENAI_CONFIG = {'quick_gelu': True, 'vision_cfg': {}}
# (open_clip's, timm's) parts of its own tower's names, replaced in this order (timm's; the final
# LayerNorm `ln_post` first, which `_timm_names` names).
_RENAMED = (
    ('conv1', 'patch_embed.proj'),
    ('positional_embedding', 'pos_embed'),
    ('transformer.resblocks.', 'blocks.'),
    ('ln_pre', 'norm_pre'),
    ('ln_', 'norm'),
    ('ls_1.', 'ls1.'),
    ('ls_2.', 'ls2.'),
    ('in_proj_', 'qkv.'),
    ('out_proj', 'proj'),
    ('mlp.c_fc', 'mlp.fc1'),
    ('mlp.c_proj', 'mlp.fc2'),
)
# open_clip's custom blocks (CustomResidualAttentionBlock), which its config's flags select.
_CUSTOM_BLOCKS = (
    'qk_norm',
    'scaled_cosine_attn',
    'scale_heads',
    'scale_attn_inner',
    'scale_attn',
    'scale_fc',
)
_POOLS = {'tok': 'token', 'avg': 'avg'}


def recognises(state_dict: StateDict) -> bool:
  return f'{_TOWER}class_embedding' in state_dict or any(k.startswith(_TRUNK) for k in state_dict)


def _vision_config(path: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
  """(the model config, its vision_cfg) of the open_clip_config.json beside the weights."""
  model_config = torch_files.beside(path, CONFIG).get('model_cfg')
  if model_config is None and torch_pickle.is_torchscript(path):
    return _OPENAI_CONFIG, _OPENAI_CONFIG['vision_cfg']
  if model_config is None:
    raise ValueError(
        f'{path}: OpenCLIP weights without the {CONFIG} beside them, which says their heads, '
        "activation and pooling: copy it from the model's hub directory (Meta's Perception "
        "Encoder .pt files, named alike, load in timm's conversion: the hub's timm/vit_pe_*)"
    )
  return model_config, model_config.get('vision_cfg', {})


def _refused(path: str, what: str) -> ValueError:
  return ValueError(
      f"{path}: OpenCLIP's image tower {what}, which vit_jax's ViT does not compute; fine-tune it "
      'in open_clip, or pick another checkpoint'
  )


def _check(state_dict: StateDict, vision: Mapping[str, Any], path: str) -> None:
  """A one-line ValueError for a tower of another function than vit_jax's ViT."""
  if vision.get('timm_model_name'):
    name = vision['timm_model_name']
    if name.partition('.')[0] not in timm_arguments.architectures():
      raise _refused(
          path,
          f"is timm's {name}, not one of the ViTs of timm {timm_arguments.timm_version()} that "
          'vit_jax reads',
      )
    if vision.get('timm_pool', 'avg') in ('abs_attn', 'rot_attn'):
      raise _refused(path, f"pools with open_clip's {vision['timm_pool']!r}")
    if vision.get('timm_proj', 'linear') == 'mlp':
      raise _refused(path, 'projects with an MLP (timm_proj=mlp)')
    if vision.get('timm_proj', 'linear') != 'linear' and vision.get('timm_pool', 'avg') == '':
      raise _refused(path, "pools no token (timm_pool='')")
    return
  custom = [flag for flag in _CUSTOM_BLOCKS if vision.get(flag)]
  if vision.get('block_type') == 'custom' or custom:
    raise _refused(path, f"has open_clip's custom blocks ({', '.join(custom) or 'block_type'})")
  if vision.get('attentional_pool') or any(k.startswith(f'{_TOWER}attn_pool') for k in state_dict):
    raise _refused(path, "pools with CoCa's attentional pooler")
  if vision.get('pool_type', 'tok') not in _POOLS:
    raise _refused(path, f"pools with pool_type={vision['pool_type']!r}")
  if vision.get('act_kwargs'):
    raise _refused(path, f"has an activation of {vision['act_kwargs']!r}")
  if set(vision.get('norm_kwargs') or {}) - {'eps'}:
    raise _refused(path, f"has LayerNorms of {vision['norm_kwargs']!r}")


def timm_names(state_dict: StateDict, source: str) -> StateDict:
  """The image tower's state dict in timm's names."""
  _, vision = _vision_config(source)
  _check(state_dict, vision, source)
  if vision.get('timm_model_name'):
    return _trunk_names(state_dict)
  # Pooled before it (CLIPA's avg), the final LayerNorm is timm's fc_norm; of the class token alone
  # a LayerNorm before the pooling is the same function as one after it.
  post_pool = vision.get('final_ln_after_pool') and vision.get('pool_type') == 'avg'
  renamed = {}
  for name, tensor in state_dict.items():
    if not name.startswith(_TOWER):
      continue
    name = name[len(_TOWER) :].replace('ln_post', 'fc_norm' if post_pool else 'norm')
    name = torch_names.replaced(name, _RENAMED)
    if name == 'proj':  # [width, embedding], timm's head [embedding, width].
      renamed['head.weight'] = np.asarray(tensor).T
      renamed['head.bias'] = np.zeros(tensor.shape[1], tensor.dtype)
    elif name == 'class_embedding':
      renamed['cls_token'] = tensor.reshape(1, 1, -1)
    elif name == 'pos_embed':
      renamed['pos_embed'] = tensor[None]
    else:
      renamed[name] = tensor
  if 'norm_pre.weight' not in renamed:  # vit_jax's patch embedding has a bias without pre_norm.
    kernel = renamed['patch_embed.proj.weight']
    renamed['patch_embed.proj.bias'] = np.zeros(kernel.shape[0], kernel.dtype)
  return renamed


def _trunk_names(state_dict: StateDict) -> StateDict:
  """A timm tower's tensors, open_clip's linear projection its head."""
  renamed = {k[len(_TRUNK) :]: v for k, v in state_dict.items() if k.startswith(_TRUNK)}
  projection = state_dict.get(f'{_TOWER}head.proj.weight')
  if projection is not None:
    renamed['head.weight'] = projection
    renamed['head.bias'] = state_dict.get(
        f'{_TOWER}head.proj.bias', np.zeros(projection.shape[0], projection.dtype)
    )
  return renamed


def timm_config(config: Mapping[str, Any], state_dict: StateDict, path: str) -> dict[str, Any]:
  """timm's config.json of the tower (`config`, a config.json beside the weights, is another
  model's: laion's directories hold transformers' beside OpenCLIP's)."""
  del config
  model_config, vision = _vision_config(path)
  if vision.get('timm_model_name'):
    pool = vision.get('timm_pool', 'avg')
    # A linear projection replaces the head of a tower pooling as its architecture does.
    keeps_pool = vision.get('timm_proj', 'linear') == 'linear' and not pool
    return {
        'architecture': vision['timm_model_name'],
        'model_args': {} if keeps_pool else {'global_pool': pool},
    }
  width = state_dict['patch_embed.proj.weight'].shape[0]
  return {
      'model_args': {
          'num_heads': width // vision.get('head_width', 64),
          'act_layer': 'QuickGELU' if model_config.get('quick_gelu') else 'GELU',
          'norm_layer': {
              'type': 'LayerNorm',
              'eps': (vision.get('norm_kwargs') or {}).get('eps', 1e-5),
          },
          'global_pool': _POOLS[vision.get('pool_type', 'tok')],
          'init_values': vision.get('ls_init_value'),
      }
  }


def normalization(
    config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  """The mean and std of the open_clip_config.json's preprocess_cfg, else OpenAI's (open_clip's)."""
  del config
  preprocess = torch_files.beside(path, CONFIG).get('preprocess_cfg', {})
  return (
      list(preprocess.get('mean', _OPENAI[0])),
      list(preprocess.get('std', _OPENAI[1])),
  )
