"""timm's `VisionTransformer`, `Eva` (EVA-02's class) and `Beit` (BEiT's) state dicts in: our tree
(`from_state_dict`) and the model fields they fix (`architecture`); out is timm_export.py's.

The architectures map one to one except: timm has no pre-logits layer; timm's `no_embed_class` (no
position embedding for the class token) is ours with a zero one (and zero ones for its registers,
`reg_token`: model.num_registers); timm's attention pooling `attn_pool` (SigLIP's, global_pool='map')
is our MAP head (big_vision's; Eva's, Perception Encoder's, with heads of its own attending to every
token: model.map_heads, model.map_include_prefix); timm's layer scale `ls1.gamma`, `ls2.gamma`
(DeiT III, DINOv2; Eva's `gamma_1`, `gamma_2`) is ours (model.layer_scale). Eva's EvaAttention has
no key bias (model.key_bias=False; its AttentionRope has one), its MLP may be gated (SwiGLU:
model.mlp_gated) with a norm (model.mlp_norm); RoPE-Mixed's learned frequencies `rope.freqs` are each
block's `rope_freqs`. Beit's blocks are Eva's names with a relative position bias in each attention
(`relative_position_bias_table`, or one `rel_pos_bias` all share): model.posemb='relative'.
What has no parameters but changes the function (timm's pooling, the MLP's activation, Eva's rotary
embeddings) is read from the config.json beside the weights, when there is one.
"""

import math
from typing import Any, Mapping, Optional

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import timm_arguments, timm_fields, torch_names
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models.pooling import MAP_HEAD


def from_state_dict(
    state_dict: StateDict,
    num_heads: int,
    source: str = 'state dict',
    map_heads: Optional[int] = None,
) -> dict[str, Any]:
  """The nested tree of a timm `VisionTransformer` or `Eva` state dict; its attention pooling's
  heads `map_heads` (None: num_heads)."""
  r = torch_names.Reader(state_dict, source, 'timm')
  tree = {
      'embedding/kernel': torch_names.patch_kernel(r.take('patch_embed.proj.weight')),
  }
  if r.has('pos_embed'):  # None in Eva's ViTs with rotary embeddings alone (model.posemb='none').
    tree['Transformer/posembed_input/pos_embedding'] = r.take('pos_embed')
  if r.has('patch_embed.proj.bias'):  # None in a pre_norm ViT (CLIP's), nor in ours with pre_norm.
    tree['embedding/bias'] = r.take('patch_embed.proj.bias')
  if r.has('patch_embed.norm.weight'):  # AIMv2's embed_norm_layer (model.embed_norm).
    tree.update(r.norm('patch_embed.norm', 'embedding_norm'))
  if r.has('norm_pre.weight'):
    tree.update(r.norm('norm_pre', 'Transformer/pre_norm'))
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
  posemb = tree.get('Transformer/posembed_input/pos_embedding')
  rows = 0 if posemb is None else posemb.shape[1]
  if prefix and rows and torch_names.square(rows) and not torch_names.square(rows - prefix):
    # timm's `no_embed_class` (FlexiViT, DeiT III, DINOv2 with registers): a square grid of
    # embeddings and none for the prefix tokens (with theirs, 1 + gs * gs rows are never square).
    # Ours adds one to every token: adding zeros to the prefix tokens computes the same.
    tree['Transformer/posembed_input/pos_embedding'] = np.concatenate(
        [np.zeros((1, prefix, posemb.shape[2]), posemb.dtype), posemb], axis=1
    )
  for i in range(torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.')):
    t, ours, attention = (
        f'blocks.{i}.',
        torch_names.BLOCK.format(i),
        torch_names.ATTENTION.format(i),
    )
    out_weight = r.take(t + 'attn.proj.weight')
    weights = {
        **_query_key_value(r, t),
        'out.weight': out_weight,
        'out.bias': r.bias(t + 'attn.proj.bias', out_weight.shape[0]),
    }
    tree.update(torch_names.attention_in(attention, weights, num_heads))
    for theirs, norm in (('norm1', 'LayerNorm_0'), ('norm2', 'LayerNorm_2')):
      tree.update(r.norm(t + theirs, f'{ours}/{norm}'))
    tree.update(_mlp_in(r, t, f'{ours}/MlpBlock_3/'))
    for scale, eva in (('ls1', 'gamma_1'), ('ls2', 'gamma_2')):  # Layer scale (init_values).
      for theirs in (f'{t}{scale}.gamma', f'{t}{eva}'):
        if r.has(theirs):
          tree[f'{ours}/{scale}'] = r.take(theirs)
    if r.has(t + 'attn.norm.weight'):  # EVA-02 CLIP's scale_attn_inner (scale_attn_norm).
      tree.update(r.norm(t + 'attn.norm', f'{attention}/norm'))
    for norm in ('q_norm', 'k_norm'):  # timm's qk_norm.
      if r.has(f'{t}attn.{norm}.weight'):
        tree.update(r.norm(f'{t}attn.{norm}', f'{ours}/{norm}'))
  if _tensor_class(state_dict) == 'beit':
    tree.update(_relative_biases(r, torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.'), source))
  if r.has('rope.freqs'):  # RoPE-Mixed's learned frequencies, [2, depth, heads, head_dim / 2].
    frequencies = r.take('rope.freqs')
    for i in range(frequencies.shape[1]):
      tree[f'{torch_names.BLOCK.format(i)}/rope_freqs'] = frequencies[:, i]
  if r.has(
      'attn_pool.latent'
  ):  # timm's MAP head (SigLIP's AttentionPoolLatent): ours, big_vision's.
    tree.update(_map_head_in(r, map_heads or num_heads))
  for theirs, norm in (('norm', 'Transformer/encoder_norm'), ('fc_norm', 'fc_norm')):
    if r.has(f'{theirs}.weight'):
      tree.update(r.norm(theirs, norm))
  for head in ('head', 'head_dist'):
    if r.has(f'{head}.weight'):
      tree[f'{head}/kernel'] = torch_names.kernel(r.take(f'{head}.weight'))
      tree[f'{head}/bias'] = r.take(f'{head}.bias')
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def _query_key_value(r: torch_names.Reader, t: str) -> dict[str, np.ndarray]:
  """The (out, in) weights and biases `{q,k,v}.{weight,bias}` of block `t`'s attention: timm's fused
  `attn.qkv`, with its bias or (Eva's) only `q_bias` and `v_bias`; or Eva's `q_proj`, `k_proj`,
  `v_proj`. Without a key bias there is no `k.bias` (model.key_bias=False); a missing query or value
  bias (qkv_bias=False) is zeros, which compute the same."""
  if r.has(t + 'attn.q_proj.weight'):
    named = {name: f'{t}attn.{name}_proj.' for name in 'qkv'}
    weights = {f'{n}.weight': r.take(named[n] + 'weight') for n in 'qkv'}
    biases = {f'{n}.bias': r.take(named[n] + 'bias') for n in 'qkv' if r.has(named[n] + 'bias')}
  else:
    weights = dict(
        zip(('q.weight', 'k.weight', 'v.weight'), np.split(r.take(t + 'attn.qkv.weight'), 3))
    )
    if r.has(t + 'attn.qkv.bias'):
      biases = dict(zip(('q.bias', 'k.bias', 'v.bias'), np.split(r.take(t + 'attn.qkv.bias'), 3)))
    else:
      biases = {
          f'{n}.bias': r.take(f'{t}attn.{n}_bias') for n in 'qv' if r.has(f'{t}attn.{n}_bias')
      }
  for name in 'qv':
    biases.setdefault(f'{name}.bias', np.zeros(weights[f'{name}.weight'].shape[0], np.float32))
  return {**weights, **biases}


def _mlp_in(r: torch_names.Reader, t: str, mlp: str) -> dict[str, np.ndarray]:
  """Our MLP `mlp` (ending in '/') from block `t`'s: timm's `Mlp` (fc1, fc2), SwiGLU's gate `fc1_g`
  and linear `fc1_x` or `GluMlp`'s packed fc1 (gate first: SwiGLUPacked, EVA-02 S's), each with the
  hidden units' LayerNorm `mlp.norm` where the model has one (EVA-02 B/L's scale_mlp)."""
  linear = lambda name: (
      w := r.take(f'{t}mlp.{name}.weight'),
      r.bias(f'{t}mlp.{name}.bias', len(w)),
  )
  layers = {'Dense_1': linear('fc2')}  # Without biases: AIMv2's proj_bias=False.
  packed = False
  if r.has(t + 'mlp.fc1_g.weight'):
    for theirs, ours in (('fc1_g', 'Dense_0'), ('fc1_x', 'Dense_linear')):
      layers[ours] = linear(theirs)
  else:
    layers['Dense_0'] = linear('fc1')
    packed = _packed_gate(layers['Dense_0'][0].shape, layers['Dense_1'][0].shape)
  tree = torch_names.mlp_in(mlp, layers, packed)
  if r.has(t + 'mlp.norm.weight'):
    tree.update(r.norm(t + 'mlp.norm', f'{mlp}norm'))
  return tree


def _packed_gate(fc1: tuple[int, ...], fc2: tuple[int, ...]) -> bool:
  """Whether an MLP's `fc1` weight (of shape `fc1`) is timm's GluMlp's packed gate and linear
  layers: twice the units its `fc2` (of shape `fc2`) reads, the gate's first."""
  return fc1[0] == 2 * fc2[1]


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
      f'{MAP_HEAD}/probe': r.take(p + 'latent'),
      **torch_names.attention_in(f'{MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      **r.norm(p + 'norm', f'{MAP_HEAD}/LayerNorm_0'),
  }
  for theirs, ours in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
    tree[f'{MAP_HEAD}/MlpBlock_0/{ours}/kernel'] = torch_names.kernel(
        r.take(f'{p}mlp.{theirs}.weight')
    )
    tree[f'{MAP_HEAD}/MlpBlock_0/{ours}/bias'] = r.take(f'{p}mlp.{theirs}.bias')
  return tree


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


def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields a timm ViT's tensors show, and with the config.json timm writes beside them (its
  `architecture`, `global_pool` and `model_args`: timm_arguments.py, timm_fields.py) those they do
  not: heads, activation, LayerNorm epsilon, pooling and rotary embeddings. A one-line ValueError
  for a model whose tensors load but compute another function than vit_jax's ViT."""
  patches = state_dict['patch_embed.proj.weight'].shape
  has = lambda name: f'blocks.0.{name}' in state_dict
  args = timm_arguments.Arguments(config, _tensor_class(state_dict))
  timm_arguments.check(args, path)
  if 'blocks.0.mlp.fc2.weight' not in state_dict:
    raise ValueError(
        f"{path}: the timm model's blocks are not a ViT's (attention, then an MLP, e.g. timm's "
        "parallel blocks): vit_jax's ViT does not compute them"
    )
  fc2 = state_dict['blocks.0.mlp.fc2.weight'].shape
  gated = has('mlp.fc1_g.weight') or _packed_gate(state_dict['blocks.0.mlp.fc1.weight'].shape, fc2)
  pool = timm_fields.pooling(args, config, path)
  fields = {
      'patch_size': patches[-1],
      'hidden_size': patches[0],
      'num_layers': torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.'),
      'mlp_dim': fc2[1],
      'pre_norm': 'norm_pre.weight' in state_dict,
      'num_registers': state_dict['reg_token'].shape[1] if 'reg_token' in state_dict else 0,
      'layer_scale': (
          (args.get('init_values') or 1e-5) if has('ls1.gamma') or has('gamma_1') else None
      ),
      'fc_norm': 'fc_norm.weight' in state_dict,
      # RMSNorms have no bias (AIMv2's; timm_arguments.norm_layer checks what the config.json says).
      'norm_layer': 'layernorm' if 'blocks.0.norm1.bias' in state_dict else 'rmsnorm',
      'embed_norm': 'patch_embed.norm.weight' in state_dict,
      'final_norm': 'norm.weight' in state_dict or 'fc_norm.weight' in state_dict,
      'class_token': 'cls_token' in state_dict,
      'qk_norm': has('attn.q_norm.weight'),
      'key_bias': has('attn.qkv.bias') or has('attn.k_proj.bias'),
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
  if fields['rope'] is None:
    del fields['rope'], fields['rope_grid'], fields['rope_style']
  return fields


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
  relative = _tensor_class(state_dict) == 'beit'
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


# Tensors of the blocks only timm's Eva (and Beit) has: its attention's q_bias / v_bias or separate
# projections, its layer scale's name, SwiGLU's split fc1 (and beside them RoPE-Mixed's rope.freqs).
_EVA_TENSORS = ('attn.q_bias', 'attn.q_proj.weight', 'gamma_1', 'mlp.fc1_g.weight')
# Beit's relative position biases: each block's, or one all blocks share.
_BLOCK_RELATIVE = 'attn.relative_position_bias_table'
_SHARED_RELATIVE = 'rel_pos_bias.relative_position_bias_table'


def _tensor_class(state_dict: StateDict) -> str:
  """The timm class a state dict's tensors show: 'beit', 'eva' or 'vision_transformer'."""
  if _SHARED_RELATIVE in state_dict or f'blocks.0.{_BLOCK_RELATIVE}' in state_dict:
    return 'beit'
  eva = any(f'blocks.0.{name}' in state_dict for name in _EVA_TENSORS)
  return 'eva' if eva or 'rope.freqs' in state_dict else 'vision_transformer'


def _relative_biases(r: torch_names.Reader, num_blocks: int, source: str) -> dict[str, np.ndarray]:
  """Each block's `relative_posemb` from Beit's tables [(2h - 1)(2w - 1) + 3, heads] of a square
  grid, its own or the one all blocks share (which each block's copy computes alike): the offsets'
  biases, then the class token's three, in posemb.relative_index's order (BEiT's)."""
  shared = r.take(_SHARED_RELATIVE) if r.has(_SHARED_RELATIVE) else None
  tree = {}
  for i in range(num_blocks):
    table = shared if shared is not None else r.take(f'blocks.{i}.{_BLOCK_RELATIVE}')
    side = math.isqrt(table.shape[0] - 3)
    if side * side != table.shape[0] - 3:
      raise ValueError(
          f'{source}: its relative position biases ({table.shape[0]} rows) are not of a square '
          "grid of patches, which vit_jax's reader of timm's Beit takes"
      )
    ours = f'{torch_names.BLOCK.format(i)}/relative_posemb/'
    tree[ours + 'relative_bias'] = table[:-3].reshape(side, side, -1)
    tree[ours + 'prefix_bias'] = table[-3:]
  return tree


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
