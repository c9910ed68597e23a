"""timm's `VisionTransformer`, `Eva` (EVA-02's class) and `Beit` (BEiT's) state dicts in: our tree
(`from_state_dict`); the model fields they fix are timm_architecture.py's, the export
timm_export.py's.

The architectures map one to one except: timm has no pre-logits layer; timm's `no_embed_class` (no
position embedding for the class token) is ours with a zero one (and zero ones for its registers,
`reg_token`: model.num_registers); timm's attention pooling `attn_pool` (SigLIP's, global_pool='map')
is our MAP head (big_vision's; Eva's, Perception Encoder's, with heads of its own attending to every
token: model.map_heads, model.map_include_prefix); timm's layer scale `ls1.gamma`, `ls2.gamma`
(DeiT III, DINOv2; Eva's `gamma_1`, `gamma_2`) is ours (model.layer_scale). Eva's EvaAttention has
no key bias (model.key_bias=False; its AttentionRope has one, and may have fewer key and value
heads: model.num_kv_heads; Sapiens 2's layer scale is `gamma_1` alone), its MLP may be gated
(SwiGLU: model.mlp_gated) with a norm (model.mlp_norm); RoPE-Mixed's learned frequencies
`rope.freqs` are each block's `rope_freqs`. Beit's blocks are Eva's names with a relative position
bias in each attention (`relative_position_bias_table`, or one `rel_pos_bias` all share):
model.posemb='relative'. VisionTransformer's ParallelScalingBlocks (`in_norm`, `in_proj`) are
model.parallel_block, its DiffAttention's `lambda_*` and `sub_norm` model.diff_attention.
"""

from typing import Any, Mapping, Optional

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import differential
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
    if r.has(t + 'in_proj.weight'):
      tree.update(_parallel_block_in(r, i, num_heads))
      continue
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
    tree.update(_qk_norms_in(r, t + 'attn.', ours))
    tree.update(_differential_in(r, t + 'attn.', attention))
  blocks = torch_names.num_blocks(state_dict, r'blocks\.(\d+)\.')
  tree.update(
      torch_names.relative_biases_in(
          r, _SHARED_RELATIVE, 'blocks.{}.' + _BLOCK_RELATIVE, blocks, source
      )
  )
  if r.has('rope.freqs'):  # RoPE-Mixed's learned frequencies, [2, depth, heads, head_dim / 2].
    frequencies = r.take('rope.freqs')
    for i in range(frequencies.shape[1]):
      tree[f'{torch_names.BLOCK.format(i)}/rope_freqs'] = frequencies[:, i]
  if r.has(
      'attn_pool.latent'
  ):  # timm's MAP head (SigLIP's AttentionPoolLatent): ours, big_vision's.
    tree.update(_map_head_in(r, map_heads or num_heads))
  for theirs, norm in (('norm', torch_names.ENCODER_NORM), ('fc_norm', 'fc_norm')):
    if r.has(f'{theirs}.weight'):
      tree.update(r.norm(theirs, norm))
  for head in ('head', 'head_dist'):
    if r.has(f'{head}.weight'):
      tree[f'{head}/kernel'] = torch_names.kernel(r.take(f'{head}.weight'))
      tree[f'{head}/bias'] = r.take(f'{head}.bias')
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def _parallel_block_in(r: torch_names.Reader, i: int, num_heads: int) -> dict[str, np.ndarray]:
  """Block i, a timm ParallelScalingBlock (model.parallel_block): its `in_norm`, its `in_proj`
  packing the MLP's first layer, then the queries, keys and values (the MLP's bias in
  `in_proj.bias`, or `mlp_bias` where the projections have none), separate output projections (one,
  of both concatenated, and differential attention: DiffParallelScalingBlock), one layer scale."""
  t, ours, attention = f'blocks.{i}.', torch_names.BLOCK.format(i), torch_names.ATTENTION.format(i)
  in_proj = r.take(t + 'in_proj.weight')
  d = in_proj.shape[1]
  units = in_proj.shape[0] - 3 * d
  biases = (
      r.take(t + 'in_proj.bias')
      if r.has(t + 'in_proj.bias')
      else np.concatenate([r.take(t + 'mlp_bias'), np.zeros(3 * d, np.float32)])
  )
  fc1, q, k, v = np.split(in_proj, [units, units + d, units + 2 * d])
  fc1_bias, q_bias, k_bias, v_bias = np.split(biases, [units, units + d, units + 2 * d])
  if r.has(t + 'out_proj.weight'):  # DiffParallelScalingBlock's: [attention's | MLP's] inputs.
    out, fc2 = np.split(r.take(t + 'out_proj.weight'), [d], axis=1)
    out_bias, fc2_bias = r.take(t + 'out_proj.bias'), np.zeros(d, np.float32)
  else:
    out, fc2 = r.take(t + 'attn_out_proj.weight'), r.take(t + 'mlp_out_proj.weight')
    out_bias, fc2_bias = (
        r.bias(t + f'{name}.bias', d) for name in ('attn_out_proj', 'mlp_out_proj')
    )
  weights = {
      'q.weight': q,
      'k.weight': k,
      'v.weight': v,
      'q.bias': q_bias,
      'k.bias': k_bias,
      'v.bias': v_bias,
      'out.weight': out,
      'out.bias': out_bias,
  }
  layers = {'Dense_0': (fc1, fc1_bias), 'Dense_1': (fc2, fc2_bias)}
  tree = {
      **torch_names.attention_in(attention, weights, num_heads),
      **r.norm(t + 'in_norm', f'{ours}/LayerNorm_0'),
      **torch_names.mlp_in(f'{ours}/MlpBlock_3/', layers),
  }
  if r.has(t + 'ls.gamma'):
    tree[f'{ours}/ls1'] = r.take(t + 'ls.gamma')
  return {**tree, **_qk_norms_in(r, t, ours), **_differential_in(r, t, attention)}


def _qk_norms_in(r: torch_names.Reader, theirs: str, ours: str) -> dict[str, np.ndarray]:
  """timm's qk_norm, `q_norm` and `k_norm` named from `theirs`, as block `ours`'s; none where
  absent."""
  tree = {}
  for norm in ('q_norm', 'k_norm'):
    if r.has(f'{theirs}{norm}.weight'):
      tree.update(r.norm(f'{theirs}{norm}', f'{ours}/{norm}'))
  return tree


def _differential_in(r: torch_names.Reader, theirs: str, attention: str) -> dict[str, np.ndarray]:
  """timm's differential attention's (DiffAttention's, model.diff_attention) lambda vectors and
  `sub_norm` (an RMSNorm), named from `theirs`, for our attention `attention`; none where absent."""
  if not r.has(theirs + 'lambda_q1'):
    return {}
  tree = {f'{attention}/{name}': r.take(theirs + name) for name in differential.LAMBDAS}
  return {**tree, **r.norm(theirs + 'sub_norm', f'{attention}/sub_norm')}


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
    packed = packed_gate(layers['Dense_0'][0].shape, layers['Dense_1'][0].shape)
  tree = torch_names.mlp_in(mlp, layers, packed)
  if r.has(t + 'mlp.norm.weight'):
    tree.update(r.norm(t + 'mlp.norm', f'{mlp}norm'))
  return tree


def packed_gate(fc1: tuple[int, ...], fc2: tuple[int, ...]) -> bool:
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


# Tensors of the blocks only timm's Eva (and Beit) has: its attention's q_bias / v_bias or separate
# projections, its layer scale's name, SwiGLU's split fc1 (and beside them RoPE-Mixed's rope.freqs).
_EVA_TENSORS = ('attn.q_bias', 'attn.q_proj.weight', 'gamma_1', 'mlp.fc1_g.weight')
# Beit's relative position biases: each block's, or one all blocks share.
_BLOCK_RELATIVE = 'attn.relative_position_bias_table'
_SHARED_RELATIVE = 'rel_pos_bias.relative_position_bias_table'


def tensor_class(state_dict: StateDict) -> str:
  """The timm class a state dict's tensors show: 'beit', 'eva' or 'vision_transformer'."""
  if _SHARED_RELATIVE in state_dict or f'blocks.0.{_BLOCK_RELATIVE}' in state_dict:
    return 'beit'
  eva = any(f'blocks.0.{name}' in state_dict for name in _EVA_TENSORS)
  return 'eva' if eva or 'rope.freqs' in state_dict else 'vision_transformer'
