"""timm's `VisionTransformer` in (`from_state_dict`) and out (`to_state_dict`, `export_config`).

The architectures map one to one except: timm has no pre-logits layer; timm's `no_embed_class` (no
position embedding for the class token) is ours with a zero one (and zero ones for its registers,
`reg_token`: model.num_registers); timm's attention pooling `attn_pool` (SigLIP's, global_pool='map')
is our MAP head (big_vision's); timm's layer scale `ls1.gamma`, `ls2.gamma` (DeiT III, DINOv2) is ours
(model.layer_scale). What has no parameters but changes the function (timm's pooling, the MLP's
activation) is checked against the config.json beside the weights, when there is one.
"""

import math
from typing import Any, Mapping, Optional

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import torch_names
from vit_jax.models import vit
from vit_jax.checkpoints.torch_files import StateDict

_MAP_HEAD = 'MAPHead_0'


def from_state_dict(
    state_dict: StateDict, num_heads: int, source: str = 'state dict'
) -> dict[str, Any]:
  """The nested tree of a timm `VisionTransformer` state dict."""
  r = torch_names.Reader(state_dict, source, 'timm')
  tree = {
      'embedding/kernel': torch_names.patch_kernel(r.take('patch_embed.proj.weight')),
      'Transformer/posembed_input/pos_embedding': r.take('pos_embed'),
  }
  if r.has('patch_embed.proj.bias'):  # None in a pre_norm ViT (CLIP's), nor in ours with pre_norm.
    tree['embedding/bias'] = r.take('patch_embed.proj.bias')
  if r.has('norm_pre.weight'):
    tree['Transformer/pre_norm/scale'] = r.take('norm_pre.weight')
    tree['Transformer/pre_norm/bias'] = r.take('norm_pre.bias')
  prefix = 0  # Tokens before the patches: the class and distillation tokens, the registers.
  if r.has('cls_token'):
    tree['cls'] = r.take('cls_token')
    prefix += 1
  if r.has('dist_token'):  # DeiT's VisionTransformerDistilled.
    tree['dist'] = r.take('dist_token')
    prefix += 1
  if r.has('reg_token'):
    tree['reg'] = r.take('reg_token')
    prefix += tree['reg'].shape[1]
  posemb = tree['Transformer/posembed_input/pos_embedding']
  rows = posemb.shape[1]
  if prefix and torch_names.square(rows) and not torch_names.square(rows - prefix):
    # timm's `no_embed_class` (FlexiViT, DeiT III, DINOv2 with registers): a square grid of
    # embeddings and none for the prefix tokens (with theirs, 1 + gs * gs rows are never square).
    # Ours adds one to every token: adding zeros to the prefix tokens computes the same.
    tree['Transformer/posembed_input/pos_embedding'] = np.concatenate(
        [np.zeros((1, prefix, posemb.shape[2]), posemb.dtype), posemb], axis=1
    )
  for i in range(torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.')):
    t, ours = f'blocks.{i}.', torch_names.BLOCK.format(i)
    qkv_weight, qkv_bias = np.split(r.take(t + 'attn.qkv.weight'), 3), np.split(
        r.take(t + 'attn.qkv.bias'), 3
    )
    weights = {
        'out.weight': r.take(t + 'attn.proj.weight'),
        'out.bias': r.take(t + 'attn.proj.bias'),
    }
    for j, name in enumerate('qkv'):
      weights[f'{name}.weight'], weights[f'{name}.bias'] = qkv_weight[j], qkv_bias[j]
    tree.update(torch_names.attention_in(torch_names.ATTENTION.format(i), weights, num_heads))
    tree.update(torch_names.norms_and_mlp(r, t, ours, ('norm1', 'norm2'), ('mlp.fc1', 'mlp.fc2')))
    for scale in ('ls1', 'ls2'):  # Layer scale (timm's init_values: DeiT III, DINOv2).
      if r.has(f'{t}{scale}.gamma'):
        tree[f'{ours}/{scale}'] = r.take(f'{t}{scale}.gamma')
    for norm in ('q_norm', 'k_norm'):  # timm's qk_norm.
      if r.has(f'{t}attn.{norm}.weight'):
        tree[f'{ours}/{norm}/scale'] = r.take(f'{t}attn.{norm}.weight')
        tree[f'{ours}/{norm}/bias'] = r.take(f'{t}attn.{norm}.bias')
  if r.has(
      'attn_pool.latent'
  ):  # timm's MAP head (SigLIP's AttentionPoolLatent): ours, big_vision's.
    tree.update(_map_head_in(r, num_heads))
  for theirs, norm in (('norm', 'Transformer/encoder_norm'), ('fc_norm', 'fc_norm')):
    if r.has(f'{theirs}.weight'):
      tree[f'{norm}/scale'], tree[f'{norm}/bias'] = r.take(f'{theirs}.weight'), r.take(
          f'{theirs}.bias'
      )
  for head in ('head', 'head_dist'):
    if r.has(f'{head}.weight'):
      tree[f'{head}/kernel'] = torch_names.kernel(r.take(f'{head}.weight'))
      tree[f'{head}/bias'] = r.take(f'{head}.bias')
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def _map_head_in(r: torch_names.Reader, num_heads: int) -> dict[str, np.ndarray]:
  """Our `MAPHead_0` from timm's `attn_pool.*`: the latent is the probe, `q` and the fused `kv` the
  query and key/value projections, `proj` the output, then its LayerNorm and MLP."""
  p = 'attn_pool.'
  key_value = np.split(r.take(p + 'kv.weight'), 2), np.split(r.take(p + 'kv.bias'), 2)
  weights = {
      'q.weight': r.take(p + 'q.weight'),
      'q.bias': r.take(p + 'q.bias'),
      'k.weight': key_value[0][0],
      'k.bias': key_value[1][0],
      'v.weight': key_value[0][1],
      'v.bias': key_value[1][1],
      'out.weight': r.take(p + 'proj.weight'),
      'out.bias': r.take(p + 'proj.bias'),
  }
  tree = {
      f'{_MAP_HEAD}/probe': r.take(p + 'latent'),
      **torch_names.attention_in(f'{_MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      f'{_MAP_HEAD}/LayerNorm_0/scale': r.take(p + 'norm.weight'),
      f'{_MAP_HEAD}/LayerNorm_0/bias': r.take(p + 'norm.bias'),
  }
  for theirs, ours in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
    tree[f'{_MAP_HEAD}/MlpBlock_0/{ours}/kernel'] = torch_names.kernel(
        r.take(f'{p}mlp.{theirs}.weight')
    )
    tree[f'{_MAP_HEAD}/MlpBlock_0/{ours}/bias'] = r.take(f'{p}mlp.{theirs}.bias')
  return tree


def to_state_dict(params: Any) -> StateDict:
  """A timm `VisionTransformer` state dict of a tree in our layout (float32 numpy arrays); raises a
  one-line ValueError for what timm's ViT cannot hold."""
  flat = {
      k: np.asarray(v, np.float32) for k, v in traverse_util.flatten_dict(params, sep='/').items()
  }
  for prefix, what in (
      ('pre_logits/', 'pre-logits layer (model.representation_size)'),
      ('conv_root/', 'ResNet stem (the R50 hybrid)'),
  ):
    if any(k.startswith(prefix) for k in flat):
      raise ValueError(f"timm's VisionTransformer has no {what}")
  if any(k.startswith('Transformer/encoderblock_0/row/') for k in flat):
    raise ValueError("timm's VisionTransformer has no axial blocks (Axial-ViT)")
  if 'Transformer/posembed_input/pos_embedding' not in flat:
    raise ValueError(
        "timm's VisionTransformer has no fixed sincos2d position embeddings, nor 2-D, "
        'relative or none (model.posemb): only learned 1-D ones'
    )
  d = flat['embedding/kernel'].shape[-1]
  out = {
      'patch_embed.proj.weight': flat.pop('embedding/kernel').transpose(3, 2, 0, 1),
      'pos_embed': flat.pop('Transformer/posembed_input/pos_embedding'),
  }
  if 'embedding/bias' in flat:
    out['patch_embed.proj.bias'] = flat.pop('embedding/bias')
  if 'Transformer/pre_norm/scale' in flat:
    out['norm_pre.weight'] = flat.pop('Transformer/pre_norm/scale')
    out['norm_pre.bias'] = flat.pop('Transformer/pre_norm/bias')
  if 'cls' in flat:
    out['cls_token'] = flat.pop('cls')
  if 'dist' in flat:
    out['dist_token'] = flat.pop('dist')
  if 'reg' in flat:
    out['reg_token'] = flat.pop('reg')
  i = 0
  while f'{torch_names.BLOCK.format(i)}/LayerNorm_0/scale' in flat:
    t, ours = f'blocks.{i}.', torch_names.BLOCK.format(i)
    weights = torch_names.attention_out(flat, torch_names.ATTENTION.format(i), d)
    for kind in ('weight', 'bias'):
      out[f'{t}attn.qkv.{kind}'] = np.concatenate([weights[f'{n}.{kind}'] for n in 'qkv'])
      out[f'{t}attn.proj.{kind}'] = weights[f'out.{kind}']
    for theirs, our_norm in (('norm1', 'LayerNorm_0'), ('norm2', 'LayerNorm_2')):
      out[f'{t}{theirs}.weight'] = flat.pop(f'{ours}/{our_norm}/scale')
      out[f'{t}{theirs}.bias'] = flat.pop(f'{ours}/{our_norm}/bias')
    for theirs, dense in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
      out[f'{t}mlp.{theirs}.weight'] = flat.pop(f'{ours}/MlpBlock_3/{dense}/kernel').T
      out[f'{t}mlp.{theirs}.bias'] = flat.pop(f'{ours}/MlpBlock_3/{dense}/bias')
    for scale in ('ls1', 'ls2'):
      if f'{ours}/{scale}' in flat:
        out[f'{t}{scale}.gamma'] = flat.pop(f'{ours}/{scale}')
    for norm in ('q_norm', 'k_norm'):
      if f'{ours}/{norm}/scale' in flat:
        out[f'{t}attn.{norm}.weight'] = flat.pop(f'{ours}/{norm}/scale')
        out[f'{t}attn.{norm}.bias'] = flat.pop(f'{ours}/{norm}/bias')
    i += 1
  if f'{_MAP_HEAD}/probe' in flat:
    out.update(_map_head_out(flat, d))
  for norm, theirs in (('Transformer/encoder_norm', 'norm'), ('fc_norm', 'fc_norm')):
    if f'{norm}/bias' in flat:
      out[f'{theirs}.weight'] = flat.pop(f'{norm}/scale')
      out[f'{theirs}.bias'] = flat.pop(f'{norm}/bias')
  for head in ('head', 'head_dist'):
    if f'{head}/bias' in flat:
      out[f'{head}.weight'] = flat.pop(f'{head}/kernel').T
      out[f'{head}.bias'] = flat.pop(f'{head}/bias')
  if flat:
    raise ValueError(f"timm's VisionTransformer has no counterpart of {sorted(flat)[0]!r}")
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _map_head_out(flat: dict[str, np.ndarray], d: int) -> StateDict:
  """timm's `attn_pool.*` (AttentionPoolLatent) of our `MAPHead_0`, taken out of `flat`."""
  take = lambda name: flat.pop(f'{_MAP_HEAD}/{name}')
  weights = torch_names.attention_out(flat, f'{_MAP_HEAD}/MultiHeadDotProductAttention_0', d)
  out = {'attn_pool.latent': take('probe')}
  for kind in ('weight', 'bias'):
    out[f'attn_pool.q.{kind}'] = weights[f'q.{kind}']
    out[f'attn_pool.kv.{kind}'] = np.concatenate([weights[f'k.{kind}'], weights[f'v.{kind}']])
    out[f'attn_pool.proj.{kind}'] = weights[f'out.{kind}']
  out['attn_pool.norm.weight'] = take('LayerNorm_0/scale')
  out['attn_pool.norm.bias'] = take('LayerNorm_0/bias')
  for theirs, dense in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
    out[f'attn_pool.mlp.{theirs}.weight'] = take(f'MlpBlock_0/{dense}/kernel').T
    out[f'attn_pool.mlp.{theirs}.bias'] = take(f'MlpBlock_0/{dense}/bias')
  return out


def normalization(
    config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  """The mean and std of the config.json's pretrained_cfg (timm's data config), if it has them."""
  del path
  pretrained = config.get('pretrained_cfg', {})
  if 'mean' in pretrained and 'std' in pretrained:
    return list(pretrained['mean']), list(pretrained['std'])
  return None


def recognises(state_dict: StateDict) -> bool:
  return 'patch_embed.proj.weight' in state_dict


# The attention heads of timm's ViT widths (64 channels a head, but for huge's, SigLIP so400m's and
# gigantic's), for a config.json of a registered architecture without model_args (as the hub's).
_HEADS_BY_WIDTH = {
    192: 3,
    384: 6,
    768: 12,
    1024: 16,
    1152: 16,
    1280: 16,
    1408: 16,
    1536: 24,
    1664: 16,
}


def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields a timm ViT's tensors show, and with the config.json timm writes beside them
  (its `architecture`, `global_pool` and the `model_args` it was created with) those they do not:
  heads, activation (timm's default is the exact GELU; its *_quickgelu CLIPs' quick GELU) and
  LayerNorm epsilon (1e-6, but torch's 1e-5 in timm's CLIP architectures)."""
  args = config.get('model_args', {})
  patches = state_dict['patch_embed.proj.weight'].shape
  fields = {
      'patch_size': patches[-1],
      'hidden_size': patches[0],
      'num_layers': torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.'),
      'pre_norm': 'norm_pre.weight' in state_dict,
      'num_registers': state_dict['reg_token'].shape[1] if 'reg_token' in state_dict else 0,
      'layer_scale': args.get('init_values', 1e-5) if 'blocks.0.ls1.gamma' in state_dict else None,
      'fc_norm': 'fc_norm.weight' in state_dict,
      'class_token': 'cls_token' in state_dict,
      'qk_norm': 'blocks.0.attn.q_norm.weight' in state_dict,
      'distilled': 'dist_token' in state_dict,
      'classifier': _classifier(state_dict, config, path),
      'posemb': 'learn',
      'posemb_where': 'input',
  }
  if 'blocks.0.mlp.fc1.weight' in state_dict:
    fields['mlp_dim'] = state_dict['blocks.0.mlp.fc1.weight'].shape[0]
  name = config.get('architecture')
  heads = args.get('num_heads', _HEADS_BY_WIDTH.get(patches[0]) if name else None)
  if heads is not None:
    fields['num_heads'] = heads
  if name is not None:
    act = args.get('act_layer', 'quick_gelu' if 'quickgelu' in name else 'gelu')
    fields['mlp_activation'] = torch_names.activation(act, path)
    fields['layernorm_epsilon'] = 1e-5 if 'clip' in name else 1e-6
  return fields


def _classifier(state_dict: StateDict, config: Mapping[str, Any], path: str) -> str:
  """Our model.classifier for a timm ViT's pooling: its config.json's global_pool where it has one,
  else what the tensors show (a class token and timm's fc_norm: its default for 'avg', which our
  'token' never has). Pooling has no parameters: timm's 'max' and 'avgmax' have the tensors of an
  'avg' model and would load with other logits: one-line errors."""
  pool = config.get('global_pool', config.get('model_args', {}).get('global_pool'))
  class_token = 'cls_token' in state_dict
  if 'attn_pool.latent' in state_dict:
    return 'map'
  if pool in (None, ''):
    return 'token' if class_token and 'fc_norm.weight' not in state_dict else 'gap'
  if pool == 'avg':
    return 'gap'
  if pool == 'token' and class_token:
    return 'token'
  raise ValueError(
      f"{path}: the timm model pools with global_pool={pool!r}, which vit_jax's ViT does not "
      "compute (model.classifier: token pools as timm's token, gap as its avg, map as its map)"
  )


def eval_crop(pp_eval: Mapping[str, Any], image_size: int) -> dict[str, Any]:
  """timm's `crop_pct` and `crop_mode` for the eval crop of `pp_eval` (a config.pp_eval), so that
  timm's `resolve_data_config` + `create_transform` prepare images as vit_jax's evaluation does.

  'resize' squashes the whole image to the square: timm's 'squash' at crop_pct 1. 'central' resizes the
  shorter side to round(image_size / crop_fraction), then takes the central square: timm's 'center',
  whose shorter side is floor(image_size / crop_pct), so crop_pct is chosen to floor to the same size.
  """
  if pp_eval['crop'] == 'resize':
    return {'crop_pct': 1.0, 'crop_mode': 'squash'}
  if pp_eval['crop'] != 'central':
    raise ValueError(
        f"config.pp_eval.crop={pp_eval['crop']!r} has no timm counterpart: use 'resize' or "
        "'central'"
    )
  target = round(image_size / pp_eval['crop_fraction'])
  crop_pct = pp_eval['crop_fraction']
  if math.floor(image_size / crop_pct) != target:
    # E.g. 384 / 0.875 = 438.9 rounds to 439, floors to 438: aim timm's division at the middle of 439.
    crop_pct = image_size / (target + 0.5)
  return {'crop_pct': crop_pct, 'crop_mode': 'center'}


# The registered ViT timm builds an export as, by (LayerNorm epsilon, model.distilled): model_args
# replace its sizes and options, but its LayerNorm (timm's norm_layer, not in its config.json) and its
# class stay: 1e-6, or torch's default 1e-5 (CLIP's); DeiT's VisionTransformerDistilled for the
# distillation token.
_TIMM_ARCHITECTURES = {
    (1e-6, False): 'vit_base_patch16_224',
    (1e-5, False): 'vit_base_patch16_clip_224',
    (1e-6, True): 'deit_base_distilled_patch16_224',
}


def _mlp_ratio(hidden_size: int, mlp_dim: int) -> float:
  """timm's `mlp_ratio` for an MLP of `mlp_dim` units: timm makes int(hidden_size * mlp_ratio) of
  them, and mlp_dim / hidden_size times hidden_size can round below mlp_dim (56 * (488 / 56) is
  487.99...); half a unit more floors to mlp_dim."""
  ratio = mlp_dim / hidden_size
  return ratio if int(hidden_size * ratio) == mlp_dim else (mlp_dim + 0.5) / hidden_size


def export_config(
    model: Mapping[str, Any],
    image_size: int,
    num_classes: Optional[int],
    class_names: Optional[list[str]] = None,
    *,
    pp_eval: Mapping[str, Any],
) -> dict[str, Any]:
  """The config.json with which `timm.create_model('local-dir:DIR', pretrained=True)` builds this
  model and loads DIR/model.safetensors (`to_state_dict`). Images are in [-1, 1]: mean = std = 0.5. Its
  preprocessing is the run's `pp_eval` (`eval_crop`), resized with PIL's bilinear filter, which
  always antialiases: pp_eval.antialias=True's resize (without it, a shrunk image differs). What
  timm's ViT cannot compute and the parameters do not show is a one-line ValueError."""
  if model['posemb_where'] != 'input':  # 'shared_every_layer' has the tree of 'input'.
    raise ValueError(
        "timm's VisionTransformer adds position embeddings only at the input "
        f"(model.posemb_where={model['posemb_where']})"
    )
  distilled = bool(model['distilled'])
  architecture = _TIMM_ARCHITECTURES.get((model['layernorm_epsilon'], distilled))
  if architecture is None:
    epsilons = [e for e, d in _TIMM_ARCHITECTURES if d == distilled]
    raise ValueError(
        f"timm's {'distilled DeiT' if distilled else 'VisionTransformer'}'s LayerNorms have "
        f"epsilon {' or '.join(f'{e:g}' for e in epsilons)} "
        f"(model.layernorm_epsilon={model['layernorm_epsilon']:g})"
    )
  model_args = {
      'img_size': image_size,
      'patch_size': model['patch_size'],
      'embed_dim': model['hidden_size'],
      'depth': model['num_layers'],
      'num_heads': model['num_heads'],
      'mlp_ratio': _mlp_ratio(model['hidden_size'], model['mlp_dim']),
      'qkv_bias': True,
      'class_token': vit.has_class_token(model['classifier'], model['class_token']),
      'global_pool': {'token': 'token', 'gap': 'avg', 'map': 'map'}[model['classifier']],
      'fc_norm': bool(model['fc_norm']),
      'act_layer': model['mlp_activation'],
  }
  if model['layer_scale'] is not None:
    model_args['init_values'] = model['layer_scale']
  if model['num_registers']:
    model_args['reg_tokens'] = model['num_registers']
  if model['qk_norm']:
    model_args['qk_norm'] = True
  model_args['pre_norm'] = model['pre_norm']  # Explicit: the CLIP architecture's default is True.
  pretrained_cfg = {
      'input_size': [3, image_size, image_size],
      'fixed_input_size': True,
      'mean': [0.5] * 3,
      'std': [0.5] * 3,
      'interpolation': 'bilinear',
      **eval_crop(pp_eval, image_size),
      'num_classes': num_classes or 0,
  }
  if class_names:
    pretrained_cfg['label_names'] = list(class_names)
  return {
      'architecture': architecture,
      'num_classes': num_classes or 0,
      'num_features': model['hidden_size'],
      'model_args': model_args,
      'pretrained_cfg': pretrained_cfg,
  }
