"""The model fields a timm ViT's state dict fixes (`architecture`): what its tensors show (their
shapes only: timm_layout.py reads their values), and with the config.json timm writes beside them
(timm_arguments.py, timm_fields.py) what they do not: what has no parameters but changes the
function (timm's pooling, the MLP's activation, Eva's rotary embeddings, res-post-norm blocks).
"""

from typing import Any, Mapping, Optional, Union

from vit_jax.checkpoints import timm_arguments, timm_fields, timm_layout, torch_names
from vit_jax.checkpoints.torch_files import StateDict


def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields a timm ViT's tensors show, and with the config.json timm writes beside them (its
  `architecture`, `global_pool` and `model_args`: timm_arguments.py, timm_fields.py) those they do
  not: heads, activation, LayerNorm epsilon, pooling and rotary embeddings. A one-line ValueError
  for a model whose tensors load but compute another function than vit_jax's ViT."""
  patches = state_dict['patch_embed.proj.weight'].shape
  has = lambda name: f'blocks.0.{name}' in state_dict
  args = timm_arguments.Arguments(config, timm_layout.tensor_class(state_dict))
  timm_arguments.check(args, path)
  _check_square_grid(state_dict, args, path)
  parallel = has('in_proj.weight')  # timm's ParallelScalingBlock (model.parallel_block).
  if not (parallel or has('mlp.fc2.weight')):
    raise ValueError(
        f"{path}: the timm model's blocks are not a ViT's (attention, then an MLP, or both of one "
        "norm): vit_jax's ViT does not compute them"
    )
  if parallel:  # Its in_proj packs the MLP's units before the queries, keys and values.
    rows, width = state_dict['blocks.0.in_proj.weight'].shape
    fc2 = (width, rows - 3 * width)
  else:
    fc2 = state_dict['blocks.0.mlp.fc2.weight'].shape
  gated = not parallel and (
      has('mlp.fc1_g.weight')
      or timm_layout.packed_gate(state_dict['blocks.0.mlp.fc1.weight'].shape, fc2)
  )
  pool = timm_fields.pooling(args, config, path)
  fields = {
      'patch_size': patches[-1],
      'hidden_size': patches[0],
      'num_layers': torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.'),
      'mlp_dim': fc2[1],
      'pre_norm': 'norm_pre.weight' in state_dict,
      'num_registers': state_dict['reg_token'].shape[1] if 'reg_token' in state_dict else 0,
      'layer_scale': (
          (args.get('init_values') or 1e-5)
          if has('ls1.gamma') or has('gamma_1') or has('ls.gamma')
          else None
      ),
      # Sapiens 2's layer scale of the attention alone (timm's attn_only_layer_scale).
      'layer_scale_mlp': not (has('gamma_1') and not has('gamma_2')),
      'fc_norm': 'fc_norm.weight' in state_dict,
      # RMSNorms have no bias (AIMv2's; timm_arguments.norm_layer checks what the config.json says).
      'norm_layer': 'layernorm' if has('norm1.bias') or has('in_norm.bias') else 'rmsnorm',
      'embed_norm': 'patch_embed.norm.weight' in state_dict,
      'final_norm': 'norm.weight' in state_dict or 'fc_norm.weight' in state_dict,
      'class_token': 'cls_token' in state_dict,
      'qk_norm': has('attn.q_norm.weight') or has('q_norm.weight'),
      # A parallel block's key bias is in_proj's, or zeros without one (timm_layout.py).
      'key_bias': has('attn.qkv.bias') or has('attn.k_proj.bias') or parallel,
      'parallel_block': parallel,
      'diff_attention': has('attn.lambda_q1') or has('lambda_q1'),
      'attn_norm': has('attn.norm.weight'),
      'mlp_gated': gated,
      'mlp_norm': has('mlp.norm.weight'),
      'distilled': 'dist_token' in state_dict,
      'classifier': _classifier(state_dict, pool, path),
      'posemb': _posemb(state_dict, path),
      'posemb_where': 'input',
  }
  fields['map_heads'], fields['map_include_prefix'] = timm_fields.map_head(
      args, 'map' if fields['classifier'] == 'map' else pool, path
  )
  fields['map_mlp_dim'] = _map_mlp_dim(state_dict, fc2[1], gated and args.cls == 'eva', path)
  said_norm, epsilon = timm_fields.norm_layer(args, path)
  said = {
      'num_heads': args.get('num_heads') if args.has('num_heads') else None,
      'mlp_activation': timm_fields.activation(args, gated, path),
      'layernorm_epsilon': epsilon,
  }
  if said_norm not in (None, fields['norm_layer']):
    raise ValueError(
        f'{path}: {args.describe()} normalises with {said_norm}, its tensors with '
        f"{fields['norm_layer']}: the config.json is another model's"
    )
  post_norm = timm_fields.res_post_norm(args)
  if post_norm is not None:
    fields['res_post_norm'] = post_norm
  fields['rope'], fields['rope_grid'], fields['rope_style'] = timm_fields.rotary(args)
  _check_learned_rotary(state_dict, fields, args, path)
  if 'rope.freqs' in state_dict:  # The tensors show RoPE-Mixed, also without a config.json.
    fields['rope'], fields['rope_grid'], fields['rope_style'] = True, None, 'rope_mixed'
  fields.update({field: value for field, value in said.items() if value is not None})
  if 'num_heads' in fields:  # The key heads are counted in the queries' head width.
    fields['num_kv_heads'] = _kv_heads(state_dict, fields)
  if fields['rope'] is None:
    del fields['rope'], fields['rope_grid'], fields['rope_style']
  return fields


def _check_square_grid(state_dict: StateDict, args: timm_arguments.Arguments, path: str) -> None:
  """A one-line ValueError for learned position embeddings of a grid that is not square (timm's
  img_size=(h, w)): vit_jax's ViTs take square images, and such a grid's rows may pass for a square
  one (1 + 4 x 6 rows are 5 x 5 without a class token's)."""
  size = args.get('img_size')
  if 'pos_embed' not in state_dict or not isinstance(size, (list, tuple)) or size[0] == size[-1]:
    return
  raise ValueError(
      f'{path}: {args.describe()} was made for {size[0]}x{size[-1]} px images (img_size), its '
      "position embeddings a grid that is not square, and vit_jax's ViTs take square images: "
      'resize its pos_embed to a square grid in timm (timm.layers.resample_abs_pos_embed) and save '
      'that, or pick another checkpoint'
  )


def _kv_heads(
    state_dict: StateDict, fields: Mapping[str, Any]
) -> Optional[Union[int, tuple[int, ...]]]:
  """model.num_kv_heads: None where every block's keys have the queries' heads, else the key heads
  of all blocks, or of each (Sapiens 2's grouped-query attention, its first and last blocks' full).
  """
  rows = [
      state_dict[f'blocks.{i}.attn.k_proj.weight'].shape[0]
      for i in range(fields['num_layers'])
      if f'blocks.{i}.attn.k_proj.weight' in state_dict
  ]
  if all(n == fields['hidden_size'] for n in rows):
    return None
  head_dim = fields['hidden_size'] // fields['num_heads']
  heads = tuple(n // head_dim for n in rows)
  return heads[0] if len(set(heads)) == 1 else heads


def _map_mlp_dim(state_dict: StateDict, mlp_dim: int, gated_eva: bool, path: str) -> Optional[int]:
  """model.map_mlp_dim of timm's attention pooling: None where its MLP is as wide as the blocks'
  `mlp_dim` (Perception Encoder G's is narrower: Eva's attn_pool_mlp_ratio). A one-line ValueError
  for one of another activation than the blocks' (timm's Eva pools with a GELU MLP, which its gated
  ViTs' SiLU is not)."""
  if 'attn_pool.mlp.fc1.weight' not in state_dict:
    return None
  if gated_eva:
    raise ValueError(
        f"{path}: the timm model's attention pooling has a GELU MLP, its blocks a gated one: "
        "vit_jax's MAP head has the blocks' activation"
    )
  units = state_dict['attn_pool.mlp.fc1.weight'].shape[0]
  return None if units == mlp_dim else units


def _posemb(state_dict: StateDict, path: str) -> str:
  """model.posemb: learned embeddings (pos_embed), Beit's relative biases, or none."""
  relative = timm_layout.tensor_class(state_dict) == 'beit'
  if relative and 'pos_embed' in state_dict:
    raise ValueError(
        f'{path}: the timm model adds learned position embeddings and relative position biases '
        "(Beit's use_abs_pos_emb with use_rel_pos_bias), and vit_jax's ViT has one kind "
        '(model.posemb)'
    )
  return 'relative' if relative else 'learn' if 'pos_embed' in state_dict else 'none'


def _check_learned_rotary(
    state_dict: StateDict, fields: dict[str, Any], args: timm_arguments.Arguments, path: str
) -> None:
  """A one-line ValueError where the config.json's rotary embeddings and the tensors disagree on
  RoPE-Mixed's learned frequencies (timm's `rope.freqs`)."""
  said = fields['rope'] is not None
  mixed = bool(fields['rope']) and fields['rope_style'] == 'rope_mixed'
  if said and mixed != ('rope.freqs' in state_dict):
    raise ValueError(
        f'{path}: {args.describe()} is created with '
        + ('' if mixed else 'no ')
        + "RoPE-Mixed's learned rotary frequencies, and its tensors "
        + ('have none' if mixed else 'have them (rope.freqs)')
        + ": the config.json is another model's"
    )


def _classifier(state_dict: StateDict, pool: Optional[str], path: str) -> str:
  """Our model.classifier for timm's pooling `pool` (timm_arguments.pooling), or where unsaid, what
  the tensors show (a class token and timm's fc_norm: its default for 'avg', which our 'token' never
  has)."""
  class_token = 'cls_token' in state_dict
  if 'attn_pool.latent' in state_dict:
    return 'map'
  if pool in (None, ''):
    return 'token' if class_token and 'fc_norm.weight' not in state_dict else 'gap'
  if pool == 'token' and not class_token:
    raise ValueError(
        f"{path}: the timm model pools with global_pool='token' without a class token (its first "
        "token), which vit_jax's ViT does not compute"
    )
  return {'avg': 'gap', 'map': 'map', 'token': 'token'}[pool]
