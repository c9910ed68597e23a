"""Our parameter tree as a timm state dict (`to_state_dict`), timm_layout.py's naming reversed: timm's
`VisionTransformer`'s, its `Eva`'s (EVA-02's class, for rotary embeddings and gated MLPs) or its
`Beit`'s, with a one-line error for what that class cannot hold. The config.json with which timm builds
the model is timm_export.py's.
"""

from typing import Any

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import torch_names
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import differential
from vit_jax.models.pooling import MAP_HEAD


def to_state_dict(params: Any, cls: str = 'vision_transformer') -> StateDict:
  """A state dict of timm's class `cls` (timm_export.ARGUMENTS' keys): its `VisionTransformer`,
  its `Eva` (for rotary embeddings and gated MLPs) or its `Beit` (Eva's names, relative position
  biases beside them), of a tree in our layout (float32 numpy arrays); raises a one-line ValueError
  for what that class cannot hold."""
  eva = cls != 'vision_transformer'
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
  if 'Transformer/posembed_input/pos_embedding' not in flat and not eva:
    raise ValueError(
        "timm's VisionTransformer holds its position embeddings as a tensor: learned 1-D ones "
        '(or fixed ones, which timm_export.export writes), not 2-D, relative or none (model.posemb)'
    )
  d = flat['embedding/kernel'].shape[-1]
  out = {'patch_embed.proj.weight': flat.pop('embedding/kernel').transpose(3, 2, 0, 1)}
  for ours, theirs in (
      ('Transformer/posembed_input/pos_embedding', 'pos_embed'),
      ('embedding/bias', 'patch_embed.proj.bias'),
      ('cls', 'cls_token'),
      ('dist', 'dist_token'),
      ('reg', 'reg_token'),
  ):
    if ours in flat:
      out[theirs] = flat.pop(ours)
  for ours, theirs in (
      ('embedding_norm', 'patch_embed.norm'),
      ('Transformer/pre_norm', 'norm_pre'),
  ):
    out.update(_norm_out(flat, ours, theirs))
  # Grouped-query attention in any block: Eva's separate projections in all (qkv_fused=False).
  grouped = any(
      flat[name].shape != flat[name.replace('/key/', '/query/')].shape
      for name in flat
      if name.startswith('Transformer/') and name.endswith('/key/kernel')
  )
  i, rope_frequencies = 0, []
  while f'{torch_names.BLOCK.format(i)}/LayerNorm_0/scale' in flat:
    t, ours = f'blocks.{i}.', torch_names.BLOCK.format(i)
    weights = torch_names.attention_out(flat, torch_names.ATTENTION.format(i), d)
    if f'{ours}/LayerNorm_2/scale' not in flat:  # model.parallel_block: one norm for both.
      out.update(_parallel_block_out(flat, weights, t, ours))
      i += 1
      continue
    out.update(_query_key_value_out(weights, t, eva, grouped))
    out[f'{t}attn.proj.weight'], out[f'{t}attn.proj.bias'] = (
        weights['out.weight'],
        weights['out.bias'],
    )
    for theirs, our_norm in (('norm1', 'LayerNorm_0'), ('norm2', 'LayerNorm_2')):
      out.update(_norm_out(flat, f'{ours}/{our_norm}', t + theirs))
    out.update(_mlp_out(flat, t, f'{ours}/MlpBlock_3/', packed=cls == 'eva'))
    for scale, eva_scale in (('ls1', 'gamma_1'), ('ls2', 'gamma_2')):
      if f'{ours}/{scale}' in flat:
        out[f'{t}{eva_scale}' if eva else f'{t}{scale}.gamma'] = flat.pop(f'{ours}/{scale}')
    attention = torch_names.ATTENTION.format(i)
    # model.attn_norm: timm's scale_attn_inner / _norm.
    out.update(_norm_out(flat, f'{attention}/norm', f'{t}attn.norm'))
    out.update(_qk_norms_out(flat, ours, f'{t}attn.'))
    out.update(_differential_out(flat, attention, f'{t}attn.'))
    if eva and f'{ours}/rope_freqs' in flat:
      rope_frequencies.append(flat.pop(f'{ours}/rope_freqs'))
    if eva and f'{ours}/relative_posemb/relative_bias' in flat:  # Beit's: the offsets', then 3.
      offsets = flat.pop(f'{ours}/relative_posemb/relative_bias')
      out[f'{t}attn.relative_position_bias_table'] = np.concatenate(
          [offsets.reshape(-1, offsets.shape[-1]), flat.pop(f'{ours}/relative_posemb/prefix_bias')]
      )
    i += 1
  if rope_frequencies:  # RoPE-Mixed's, every block's in one tensor [2, depth, heads, head_dim / 2].
    out['rope.freqs'] = np.stack(rope_frequencies, axis=1)
  if f'{MAP_HEAD}/probe' in flat:
    out.update(_map_head_out(flat, d))
  for norm, theirs in ((torch_names.ENCODER_NORM, 'norm'), ('fc_norm', 'fc_norm')):
    out.update(_norm_out(flat, norm, theirs))
  for head in ('head', 'head_dist'):
    if f'{head}/bias' in flat:
      out[f'{head}.weight'] = flat.pop(f'{head}/kernel').T
      out[f'{head}.bias'] = flat.pop(f'{head}/bias')
  if flat:
    raise ValueError(
        f"timm's {'Eva' if eva else 'VisionTransformer'} has no counterpart of {sorted(flat)[0]!r}"
    )
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _query_key_value_out(weights: StateDict, t: str, eva: bool, grouped: bool) -> StateDict:
  """Block `t`'s fused `attn.qkv` of `{q,k,v}.{weight,bias}`: with its bias (a zero key bias where
  ours has none, which computes the same: timm's VisionTransformer, and Eva's AttentionRope that
  timm_export.py picks for a model with a key bias), or Eva's `q_bias` and `v_bias` (EvaAttention's,
  whose key bias is a zero buffer) for a model without one. Eva's `q_proj`, `k_proj`, `v_proj` in a
  `grouped` model, of keys and values of fewer heads in some block (AttentionRope's)."""
  if grouped:
    if not eva:
      raise ValueError(
          "timm's VisionTransformer has no grouped-query attention (model.num_kv_heads): Eva has"
      )
    return {
        f'{t}attn.{n}_proj.{kind}': weights[f'{n}.{kind}']
        for n in 'qkv'
        for kind in ('weight', 'bias')
    }
  out = {f'{t}attn.qkv.weight': np.concatenate([weights[f'{n}.weight'] for n in 'qkv'])}
  if eva and 'k.bias' not in weights:
    out[f'{t}attn.q_bias'], out[f'{t}attn.v_bias'] = weights['q.bias'], weights['v.bias']
    return out
  key_bias = weights.get('k.bias', np.zeros_like(weights['q.bias']))
  out[f'{t}attn.qkv.bias'] = np.concatenate([weights['q.bias'], key_bias, weights['v.bias']])
  return out


def _differential_out(flat: dict[str, np.ndarray], attention: str, theirs: str) -> StateDict:
  """timm's DiffAttention's lambda vectors and `sub_norm`, named from `theirs`, of our attention
  `attention`'s (model.diff_attention), taken out of `flat`; none without them."""
  if f'{attention}/lambda_q1' not in flat:
    return {}
  out = {theirs + name: flat.pop(f'{attention}/{name}') for name in differential.LAMBDAS}
  return {**out, **_norm_out(flat, f'{attention}/sub_norm', theirs + 'sub_norm')}


def _parallel_block_out(
    flat: dict[str, np.ndarray], weights: StateDict, t: str, ours: str
) -> StateDict:
  """Block `t`'s tensors of timm's ParallelScalingBlock, of our parallel block `ours` (its
  attention's `weights` already taken out of `flat`): `in_proj` packing the MLP's first layer, then
  the queries, keys and values, with their biases (a zero key bias where ours has none)."""
  take = lambda name: flat.pop(f'{ours}/{name}')
  if f'{ours}/MlpBlock_3/Dense_linear/kernel' in flat:
    raise ValueError("timm's ParallelScalingBlock has no gated MLP (model.mlp_gated)")
  key_bias = weights.get('k.bias', np.zeros_like(weights['q.bias']))
  out = {
      **_norm_out(flat, f'{ours}/LayerNorm_0', t + 'in_norm'),
      f'{t}in_proj.weight': np.concatenate(
          [take('MlpBlock_3/Dense_0/kernel').T] + [weights[f'{n}.weight'] for n in 'qkv']
      ),
      f'{t}in_proj.bias': np.concatenate(
          [take('MlpBlock_3/Dense_0/bias'), weights['q.bias'], key_bias, weights['v.bias']]
      ),
  }
  mlp_out = take('MlpBlock_3/Dense_1/kernel').T, take('MlpBlock_3/Dense_1/bias')
  differential_out = _differential_out(flat, f'{ours}/MultiHeadDotProductAttention_1', t)
  if differential_out:  # DiffParallelScalingBlock's: one projection of both branches' outputs.
    out[f'{t}out_proj.weight'] = np.concatenate([weights['out.weight'], mlp_out[0]], axis=1)
    out[f'{t}out_proj.bias'] = weights['out.bias'] + mlp_out[1]
    out.update(differential_out)
  else:
    out[f'{t}attn_out_proj.weight'], out[f'{t}attn_out_proj.bias'] = (
        weights['out.weight'],
        weights['out.bias'],
    )
    out[f'{t}mlp_out_proj.weight'], out[f'{t}mlp_out_proj.bias'] = mlp_out
  if f'{ours}/ls1' in flat:
    out[f'{t}ls.gamma'] = take('ls1')
  return {**out, **_qk_norms_out(flat, ours, t)}


def _qk_norms_out(flat: dict[str, np.ndarray], ours: str, theirs: str) -> StateDict:
  """timm's `q_norm` and `k_norm`, named from `theirs`, of block `ours`'s qk-norm LayerNorms, taken
  out of `flat`; none without them."""
  return {
      **_norm_out(flat, f'{ours}/q_norm', theirs + 'q_norm'),
      **_norm_out(flat, f'{ours}/k_norm', theirs + 'k_norm'),
  }


def _norm_out(flat: dict[str, np.ndarray], ours: str, theirs: str) -> StateDict:
  """timm's norm `theirs` (without '.weight') of our norm `ours`, taken out of `flat`: a LayerNorm's
  weight and bias, an RMSNorm's weight alone (torch_names.Reader.norm reversed); none without it."""
  if f'{ours}/scale' not in flat:
    return {}
  out = {f'{theirs}.weight': flat.pop(f'{ours}/scale')}
  if f'{ours}/bias' in flat:
    out[f'{theirs}.bias'] = flat.pop(f'{ours}/bias')
  return out


def _mlp_out(flat: dict[str, np.ndarray], t: str, mlp: str, packed: bool) -> StateDict:
  """Block `t`'s `mlp.*` of our MLP `mlp`, taken out of `flat`: `fc1`, `fc2`; a gated one's gate
  `fc1_g` and linear `fc1_x` (timm's SwiGLU), or both in `fc1` where `packed` and the hidden units
  have no norm (Eva's GluMlp; its SwiGLU with scale_mlp); the norm `mlp.norm`."""
  take = lambda name: flat.pop(mlp + name)
  out = {f'{t}mlp.fc2.weight': take('Dense_1/kernel').T, f'{t}mlp.fc2.bias': take('Dense_1/bias')}
  gate = take('Dense_0/kernel').T, take('Dense_0/bias')
  norm = _norm_out(flat, mlp + 'norm', f'{t}mlp.norm')
  if f'{mlp}Dense_linear/kernel' not in flat:
    out[f'{t}mlp.fc1.weight'], out[f'{t}mlp.fc1.bias'] = gate
  else:
    linear = take('Dense_linear/kernel').T, take('Dense_linear/bias')
    if norm or not packed:
      out[f'{t}mlp.fc1_g.weight'], out[f'{t}mlp.fc1_g.bias'] = gate
      out[f'{t}mlp.fc1_x.weight'], out[f'{t}mlp.fc1_x.bias'] = linear
    else:
      out[f'{t}mlp.fc1.weight'] = np.concatenate([gate[0], linear[0]])
      out[f'{t}mlp.fc1.bias'] = np.concatenate([gate[1], linear[1]])
  return {**out, **norm}


def _map_head_out(flat: dict[str, np.ndarray], d: int) -> StateDict:
  """timm's `attn_pool.*` (AttentionPoolLatent) of our `MAPHead_0`, taken out of `flat`."""
  take = lambda name: flat.pop(f'{MAP_HEAD}/{name}')
  weights = torch_names.attention_out(flat, f'{MAP_HEAD}/MultiHeadDotProductAttention_0', d)
  out = {'attn_pool.latent': take('probe')}
  for kind in ('weight', 'bias'):
    out[f'attn_pool.q.{kind}'] = weights[f'q.{kind}']
    out[f'attn_pool.kv.{kind}'] = np.concatenate([weights[f'k.{kind}'], weights[f'v.{kind}']])
    out[f'attn_pool.proj.{kind}'] = weights[f'out.{kind}']
  out.update(_norm_out(flat, f'{MAP_HEAD}/LayerNorm_0', 'attn_pool.norm'))
  for theirs, dense in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
    out[f'attn_pool.mlp.{theirs}.weight'] = take(f'MlpBlock_0/{dense}/kernel').T
    out[f'attn_pool.mlp.{theirs}.bias'] = take(f'MlpBlock_0/{dense}/bias')
  return out
