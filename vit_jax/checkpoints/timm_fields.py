"""The model fields a timm checkpoint's creation arguments (timm_arguments.py's `Arguments`, which
its `check` passed) fix and its tensors cannot show: the MLP's activation, the norms' kind and
epsilon, rotary embeddings, pooling, the MAP head's heads and where the blocks normalise. Each
reader gives None (or leaves the field out) where the config.json does not say, and a one-line
ValueError for a value vit_jax's ViT does not compute.
"""

from typing import Any, Mapping, Optional

from vit_jax.checkpoints import timm_arguments, torch_names
from vit_jax.checkpoints.timm_arguments import Arguments

# timm's activation layers (the table's names, and the strings model_args may hold) as ours.
_ACTIVATIONS = {'GELU': 'gelu', 'GELUTanh': 'gelu_tanh', 'QuickGELU': 'quick_gelu', 'SiLU': 'silu'}
_ACTIVATIONS.update(torch_names.ACTIVATIONS)
_POOLS = {
    'vision_transformer': ('token', 'avg', 'map', ''),
    'eva': ('token', 'avg', 'map', ''),
    'beit': ('token', 'avg', ''),
}


def activation(args: Arguments, gated: bool, path: str) -> Optional[str]:
  """model.mlp_activation, None where the config.json does not say."""
  if args.cls in ('eva', 'beit'):  # Their MLP: GELU, or SwiGLU's SiLU; they have no act_layer.
    return 'silu' if gated else ('gelu' if args.known else None)
  if not args.has('act_layer'):
    return None
  named = args.get('act_layer') or 'GELU'  # VisionTransformer's default, nn.GELU.
  return torch_names.activation(named, path, _ACTIVATIONS, args.describe())


# timm's norm layers (their names in the table, or as model_args may spell them): norms.NORM_LAYERS'.
_NORM_LAYERS = {
    'LayerNorm': 'layernorm',
    'layernorm': 'layernorm',
    'RmsNorm': 'rmsnorm',
    'rmsnorm': 'rmsnorm',
}


# The epsilon of a norm model_args name as a string: timm's get_norm_layer builds its LayerNorm or
# RmsNorm at their default.
NAMED_NORM_EPSILON = 1e-6


def _norm_layer(norm: Any) -> tuple[Optional[str], Optional[float]]:
  """(our kind, epsilon) of one of timm's norm_layer values; kind None for another layer."""
  if isinstance(norm, str):  # As model_args may give it.
    return _NORM_LAYERS.get(norm), NAMED_NORM_EPSILON
  return _NORM_LAYERS.get(norm.get('type', norm.get('partial'))), norm.get('eps')


def norm_layer(args: Arguments, path: str) -> tuple[Optional[str], Optional[float]]:
  """(model.norm_layer, model.layernorm_epsilon), each None where the config.json does not say.
  timm's embed_norm_layer (model.embed_norm: the tensors show it) must be the same norm."""
  if not args.has('norm_layer'):
    return None, None
  norm = args.get('norm_layer')
  if norm is None:  # VisionTransformer's default: LayerNorm(eps=1e-6).
    return 'layernorm', 1e-6
  kind, epsilon = _norm_layer(norm)
  # None or '' (timm's get_norm_layer's none) where the patch embeddings have no norm.
  embed = (args.get('embed_norm_layer') if args.has('embed_norm_layer') else None) or None
  if kind is None or (embed is not None and _norm_layer(embed) != (kind, epsilon)):
    raise ValueError(
        f'{path}: {args.describe()} normalises with {norm!r}'
        + (f' and its patch embeddings with {embed!r}' if embed is not None else '')
        + ", which vit_jax's ViT does not compute (its norms are one kind: LayerNorms or RMSNorms)"
    )
  return kind, epsilon


def rotary(args: Arguments) -> tuple[Optional[bool], Optional[tuple[int, int]], str]:
  """(model.rope, model.rope_grid, model.rope_style) of arguments `check` passed; rope None where
  the config.json does not say."""
  if args.cls != 'eva':
    return False, None, 'eva02'  # timm's VisionTransformer and Beit have none.
  if not args.has('use_rot_pos_emb'):
    return None, None, 'eva02'
  if not args.get('use_rot_pos_emb'):
    return False, None, 'eva02'
  style = timm_arguments.rope_style(args)
  grid = args.get('ref_feat_shape')
  if style in ('dinov3', 'rope_mixed') or grid is None:  # Their types ignore ref_feat_shape.
    return True, None, style
  return True, (grid, grid) if isinstance(grid, int) else tuple(grid), style


def pooling(args: Arguments, config: Mapping[str, Any], path: str) -> Optional[str]:
  """timm's global_pool (the config.json's own, which timm writes, first), None where unsaid."""
  pool = config.get('global_pool', args.get('global_pool') if args.has('global_pool') else None)
  if pool is not None and pool not in _POOLS[args.cls]:
    raise ValueError(
        f"{path}: {args.describe()} pools with global_pool={pool!r}, which vit_jax's ViT does not "
        "compute (model.classifier: token pools as timm's token, gap as its avg, map as its map)"
    )
  return pool


def map_head(args: Arguments, pool: Optional[str], path: str) -> tuple[Optional[int], bool]:
  """(model.map_heads, model.map_include_prefix) of timm's attention pooling `attn_pool` for its
  pooling `pool`: VisionTransformer's has num_heads heads (None) and attends to the tokens before
  the patches where pool_include_prefix; Eva's has attn_pool_num_heads heads (None: num_heads) and
  attends to every token."""
  if pool != 'map':
    if args.cls == 'vision_transformer' and args.get('pool_include_prefix'):
      raise ValueError(
          f'{path}: {args.describe()} pools with global_pool={pool!r} over the class token and '
          "registers too (pool_include_prefix=True), which vit_jax's ViT does not compute (its "
          'gap averages the patches alone)'
      )
    return None, False
  if args.cls == 'eva':
    return args.get('attn_pool_num_heads'), True
  return None, bool(args.get('pool_include_prefix'))


def res_post_norm(args: Arguments) -> Optional[bool]:
  """model.res_post_norm: timm's ResPostBlock (VisionTransformer's block_fn) or Eva's
  use_post_norm; None where the config.json does not say."""
  if args.cls == 'beit':
    return False
  arg = 'block_fn' if args.cls == 'vision_transformer' else 'use_post_norm'
  if not args.has(arg):
    return None
  return args.get(arg) == 'ResPostBlock' if arg == 'block_fn' else bool(args.get(arg))
