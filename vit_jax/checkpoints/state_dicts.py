"""ViT parameters in PyTorch's naming: timm's `VisionTransformer` and Hugging Face transformers'
`ViTModel` / `ViTForImageClassification`, in (`from_timm`, `from_transformers`) and out (`to_timm`).

A state dict here is a flat `{name: numpy array}`, read from `.safetensors` (no torch needed), or from
a `.pth` / `.bin` when torch is installed. The trees
are in the original `.npz` layout (loading.py), so head surgery and position-embedding resizing apply
to them as to any checkpoint. Weights of PyTorch's `Linear` are (out, in), Flax kernels (in, out); the
attention kernels are split per head, (D, heads, D/heads).

The architectures map one to one except: timm has no pre-logits layer; timm's fused `qkv` is
transformers' separate `query` / `key` / `value`; transformers' `pooler` is the pre-logits layer
(Dense + tanh); timm's `no_embed_class` (no position embedding for the class token) is ours with a
zero one (and zero ones for its registers, `reg_token`: model.num_registers); timm's attention
pooling `attn_pool` (SigLIP's, global_pool='map') is our MAP head (big_vision's); timm's layer scale
`ls1.gamma`, `ls2.gamma` (DeiT III, DINOv2) is ours (model.layer_scale); neither names the hybrid's
ResNet stem in a way read here. What has no parameters but changes the function (timm's pooling, the
MLP's activation, transformers' LayerNorm epsilon) is checked against the config.json beside the
weights, when there is one.
"""

import json
import math
import re
from typing import Any, Callable, Mapping, Optional

import ml_dtypes
import numpy as np
from etils import epath
from flax import traverse_util

StateDict = dict[str, np.ndarray]
_BLOCK = 'Transformer/encoderblock_{}'
_ATTENTION = _BLOCK + '/MultiHeadDotProductAttention_1'
SAFETENSORS = 'model.safetensors'
_TORCH_SUFFIXES = ('.pth', '.pt', '.bin')
_SAFETENSORS_DTYPES = {
    'F64': np.float64,
    'F32': np.float32,
    'F16': np.float16,
    'BF16': ml_dtypes.bfloat16,
    'I64': np.int64,
    'I32': np.int32,
    'I16': np.int16,
    'I8': np.int8,
    'U8': np.uint8,
    'BOOL': np.bool_,
}
_SAFETENSORS_NAMES = {np.dtype(dtype): name for name, dtype in _SAFETENSORS_DTYPES.items()}
# The MLP activations of timm's `act_layer` and transformers' `hidden_act` that vit_jax's ViT has:
# their `model.mlp_activation` (transformers' gelu_new and gelu_pytorch_tanh are GELU's tanh form,
# gelu_python the exact one).
_ACTIVATIONS = {
    'gelu': 'gelu',
    'gelu_tanh': 'gelu_tanh',
    'gelu_new': 'gelu_tanh',
    'gelu_pytorch_tanh': 'gelu_tanh',
    'gelu_python': 'gelu',
    'quick_gelu': 'quick_gelu',
}


def _kernel(weight: np.ndarray) -> np.ndarray:
  return weight.T


def _patch_kernel(weight: np.ndarray) -> np.ndarray:
  return weight.transpose(2, 3, 1, 0)  # (D, 3, p, p) -> (p, p, 3, D)


def _attention_in(
    prefix: str, weights: dict[str, np.ndarray], num_heads: int
) -> dict[str, np.ndarray]:
  """Our query/key/value/out parameters from (out, in) weights and biases named q, k, v, out."""
  d = weights['out.weight'].shape[0]
  tree = {
      f'{prefix}/out/kernel': weights['out.weight'].T.reshape(num_heads, d // num_heads, d),
      f'{prefix}/out/bias': weights['out.bias'],
  }
  for name, ours in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    tree[f'{prefix}/{ours}/kernel'] = weights[f'{name}.weight'].T.reshape(
        d, num_heads, d // num_heads
    )
    tree[f'{prefix}/{ours}/bias'] = weights[f'{name}.bias'].reshape(num_heads, d // num_heads)
  return tree


class _Reader:
  """Takes tensors out of a state dict by name, so that what is left over can be reported."""

  def __init__(self, state_dict: StateDict, source: str, layout: str):
    self._left = dict(state_dict)
    self._source, self._layout = source, layout

  def has(self, name: str) -> bool:
    return name in self._left

  def take(self, name: str) -> np.ndarray:
    if name not in self._left:
      raise ValueError(
          f'{self._source}: {self._layout} tensor {name!r} is missing: the file is not a '
          'complete ViT in that naming'
      )
    return np.asarray(self._left.pop(name), np.float32)

  def check_all_taken(self) -> None:
    if self._left:
      name = sorted(self._left)[0]
      raise ValueError(
          f'{self._source}: {self._layout} tensor {name!r} {self._left[name].shape} has no '
          f"counterpart in vit_jax's ViT ({len(self._left)} such): the checkpoint is "
          'another architecture'
      )


def _num_blocks(state_dict: StateDict, pattern: str) -> int:
  return len({m[1] for name in state_dict if (m := re.match(pattern, name))})


def _norms_and_mlp(
    r: _Reader, prefix: str, block: str, norms: tuple[str, str], denses: tuple[str, str]
) -> dict[str, np.ndarray]:
  """A block's two LayerNorms and two MLP layers, named `prefix` + `norms` / `denses` in PyTorch."""
  tree = {}
  for theirs, ours in zip(norms, ('LayerNorm_0', 'LayerNorm_2')):
    tree[f'{block}/{ours}/scale'] = r.take(f'{prefix}{theirs}.weight')
    tree[f'{block}/{ours}/bias'] = r.take(f'{prefix}{theirs}.bias')
  for theirs, ours in zip(denses, ('Dense_0', 'Dense_1')):
    tree[f'{block}/MlpBlock_3/{ours}/kernel'] = _kernel(r.take(f'{prefix}{theirs}.weight'))
    tree[f'{block}/MlpBlock_3/{ours}/bias'] = r.take(f'{prefix}{theirs}.bias')
  return tree


def _square(n: int) -> bool:
  return n >= 0 and math.isqrt(n) ** 2 == n


def from_timm(state_dict: StateDict, num_heads: int, source: str = 'state dict') -> dict[str, Any]:
  """The nested tree of a timm `VisionTransformer` state dict."""
  r = _Reader(state_dict, source, 'timm')
  tree = {
      'embedding/kernel': _patch_kernel(r.take('patch_embed.proj.weight')),
      'Transformer/posembed_input/pos_embedding': r.take('pos_embed'),
  }
  if r.has('patch_embed.proj.bias'):  # None in a pre_norm ViT (CLIP's), nor in ours with pre_norm.
    tree['embedding/bias'] = r.take('patch_embed.proj.bias')
  if r.has('norm_pre.weight'):
    tree['Transformer/pre_norm/scale'] = r.take('norm_pre.weight')
    tree['Transformer/pre_norm/bias'] = r.take('norm_pre.bias')
  prefix = 0  # Tokens before the patches: the class token, then the registers (DINOv2's).
  if r.has('cls_token'):
    tree['cls'] = r.take('cls_token')
    prefix += 1
  if r.has('reg_token'):
    tree['reg'] = r.take('reg_token')
    prefix += tree['reg'].shape[1]
  posemb = tree['Transformer/posembed_input/pos_embedding']
  rows = posemb.shape[1]
  if prefix and _square(rows) and not _square(rows - prefix):
    # timm's `no_embed_class` (FlexiViT, DeiT III, DINOv2 with registers): a square grid of
    # embeddings and none for the prefix tokens (with theirs, 1 + gs * gs rows are never square).
    # Ours adds one to every token: adding zeros to the prefix tokens computes the same.
    tree['Transformer/posembed_input/pos_embedding'] = np.concatenate(
        [np.zeros((1, prefix, posemb.shape[2]), posemb.dtype), posemb], axis=1
    )
  for i in range(_num_blocks(state_dict, r'blocks\.(\d+)\.')):
    t, ours = f'blocks.{i}.', _BLOCK.format(i)
    qkv_weight, qkv_bias = np.split(r.take(t + 'attn.qkv.weight'), 3), np.split(
        r.take(t + 'attn.qkv.bias'), 3
    )
    weights = {
        'out.weight': r.take(t + 'attn.proj.weight'),
        'out.bias': r.take(t + 'attn.proj.bias'),
    }
    for j, name in enumerate('qkv'):
      weights[f'{name}.weight'], weights[f'{name}.bias'] = qkv_weight[j], qkv_bias[j]
    tree.update(_attention_in(_ATTENTION.format(i), weights, num_heads))
    tree.update(_norms_and_mlp(r, t, ours, ('norm1', 'norm2'), ('mlp.fc1', 'mlp.fc2')))
    for scale in ('ls1', 'ls2'):  # Layer scale (timm's init_values: DeiT III, DINOv2).
      if r.has(f'{t}{scale}.gamma'):
        tree[f'{ours}/{scale}'] = r.take(f'{t}{scale}.gamma')
  if r.has(
      'attn_pool.latent'
  ):  # timm's MAP head (SigLIP's AttentionPoolLatent): ours, big_vision's.
    tree.update(_map_head_in(r, num_heads))
  for theirs, norm in (('norm', 'Transformer/encoder_norm'), ('fc_norm', 'fc_norm')):
    if r.has(f'{theirs}.weight'):
      tree[f'{norm}/scale'], tree[f'{norm}/bias'] = r.take(f'{theirs}.weight'), r.take(
          f'{theirs}.bias'
      )
  if r.has('head.weight'):
    tree['head/kernel'], tree['head/bias'] = _kernel(r.take('head.weight')), r.take('head.bias')
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


_MAP_HEAD = 'MAPHead_0'


def _map_head_in(r: _Reader, num_heads: int) -> dict[str, np.ndarray]:
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
      **_attention_in(f'{_MAP_HEAD}/MultiHeadDotProductAttention_0', weights, num_heads),
      f'{_MAP_HEAD}/LayerNorm_0/scale': r.take(p + 'norm.weight'),
      f'{_MAP_HEAD}/LayerNorm_0/bias': r.take(p + 'norm.bias'),
  }
  for theirs, ours in (('fc1', 'Dense_0'), ('fc2', 'Dense_1')):
    tree[f'{_MAP_HEAD}/MlpBlock_0/{ours}/kernel'] = _kernel(r.take(f'{p}mlp.{theirs}.weight'))
    tree[f'{_MAP_HEAD}/MlpBlock_0/{ours}/bias'] = r.take(f'{p}mlp.{theirs}.bias')
  return tree


def from_transformers(
    state_dict: StateDict, num_heads: int, source: str = 'state dict'
) -> dict[str, Any]:
  """The nested tree of a transformers `ViTModel` or `ViTForImageClassification` state dict."""
  # The classifier wraps the encoder as `vit.`; ViTModel's names have no prefix.
  state_dict = {name.removeprefix('vit.'): value for name, value in state_dict.items()}
  r = _Reader(state_dict, source, 'transformers')
  e = 'embeddings.'
  tree = {
      'embedding/kernel': _patch_kernel(r.take(e + 'patch_embeddings.projection.weight')),
      'embedding/bias': r.take(e + 'patch_embeddings.projection.bias'),
      'cls': r.take(e + 'cls_token'),
      'Transformer/posembed_input/pos_embedding': r.take(e + 'position_embeddings'),
  }
  for i in range(_num_blocks(state_dict, r'encoder\.layer\.(\d+)\.')):
    t, ours = f'encoder.layer.{i}.', _BLOCK.format(i)
    weights = {
        'out.weight': r.take(t + 'attention.output.dense.weight'),
        'out.bias': r.take(t + 'attention.output.dense.bias'),
    }
    for name, theirs in (('q', 'query'), ('k', 'key'), ('v', 'value')):
      weights[f'{name}.weight'] = r.take(f'{t}attention.attention.{theirs}.weight')
      weights[f'{name}.bias'] = r.take(f'{t}attention.attention.{theirs}.bias')
    tree.update(_attention_in(_ATTENTION.format(i), weights, num_heads))
    tree.update(
        _norms_and_mlp(
            r,
            t,
            ours,
            ('layernorm_before', 'layernorm_after'),
            ('intermediate.dense', 'output.dense'),
        )
    )
  tree['Transformer/encoder_norm/scale'] = r.take('layernorm.weight')
  tree['Transformer/encoder_norm/bias'] = r.take('layernorm.bias')
  for theirs, ours in (('pooler.dense', 'pre_logits'), ('classifier', 'head')):
    if r.has(f'{theirs}.weight'):
      tree[f'{ours}/kernel'], tree[f'{ours}/bias'] = _kernel(r.take(f'{theirs}.weight')), r.take(
          f'{theirs}.bias'
      )
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def to_timm(params: Any) -> StateDict:
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
  if 'reg' in flat:
    out['reg_token'] = flat.pop('reg')
  i = 0
  while f'{_BLOCK.format(i)}/LayerNorm_0/scale' in flat:
    t, ours = f'blocks.{i}.', _BLOCK.format(i)
    weights = _attention_out(flat, _ATTENTION.format(i), d)
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
    i += 1
  if f'{_MAP_HEAD}/probe' in flat:
    out.update(_map_head_out(flat, d))
  for ours, theirs in (
      ('Transformer/encoder_norm', 'norm'),
      ('fc_norm', 'fc_norm'),
      ('head', 'head'),
  ):
    if f'{ours}/bias' in flat:
      weight = flat.pop(f'{ours}/scale' if ours != 'head' else 'head/kernel')
      out[f'{theirs}.weight'] = weight.T if ours == 'head' else weight
      out[f'{theirs}.bias'] = flat.pop(f'{ours}/bias')
  if flat:
    raise ValueError(f"timm's VisionTransformer has no counterpart of {sorted(flat)[0]!r}")
  return {k: np.ascontiguousarray(v) for k, v in out.items()}


def _attention_out(flat: dict[str, np.ndarray], prefix: str, d: int) -> StateDict:
  """`_attention_in` reversed: (out, in) weights and biases named q, k, v, out of our attention
  `prefix`'s parameters, taken out of `flat`."""
  weights = {}
  for name, ours in (('q', 'query'), ('k', 'key'), ('v', 'value'), ('out', 'out')):
    weights[f'{name}.weight'] = flat.pop(f'{prefix}/{ours}/kernel').reshape(d, d).T
    weights[f'{name}.bias'] = flat.pop(f'{prefix}/{ours}/bias').reshape(d)
  return weights


def _map_head_out(flat: dict[str, np.ndarray], d: int) -> StateDict:
  """timm's `attn_pool.*` (AttentionPoolLatent) of our `MAPHead_0`, taken out of `flat`."""
  take = lambda name: flat.pop(f'{_MAP_HEAD}/{name}')
  weights = _attention_out(flat, f'{_MAP_HEAD}/MultiHeadDotProductAttention_0', d)
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


# Layouts told apart by a tensor only they have: name -> (marker, converter).
LAYOUTS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    'timm': ('patch_embed.proj.weight', from_timm),
    'transformers': ('embeddings.patch_embeddings.projection.weight', from_transformers),
}


def is_state_dict_path(path: str) -> bool:
  """Whether `path` names what `read` reads: a .safetensors / .pth / .pt / .bin file, or a directory
  holding a model.safetensors (a Hugging Face or timm model directory)."""
  if path.endswith(('.safetensors', *_TORCH_SUFFIXES)):
    return True
  directory = epath.Path(path)
  return (directory / SAFETENSORS).is_file() or (directory / f'{SAFETENSORS}.index.json').is_file()


def read_safetensors(path: epath.Path) -> StateDict:
  """The tensors of a .safetensors file: an 8-byte little-endian header size, a JSON header of
  {name: {dtype, shape, data_offsets}}, then the data. Read here rather than with the safetensors
  package, whose NumPy API has no bfloat16, the dtype of many published checkpoints."""
  data = path.read_bytes()
  try:
    size = int.from_bytes(data[:8], 'little')
    header = json.loads(data[8 : 8 + size])
    header.pop('__metadata__', None)
    body = memoryview(data)[8 + size :]
    return {
        name: np.frombuffer(
            body[slice(*t['data_offsets'])], _SAFETENSORS_DTYPES[t['dtype']]
        ).reshape(t['shape'])
        for name, t in header.items()
    }
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    raise ValueError(
        f'{path} is not a readable safetensors file ({type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}): fix --config.init_from'
    ) from None


def write_safetensors(tensors: StateDict, path: str) -> None:
  """`tensors` as a .safetensors file (the layout `read_safetensors` reads), data 8-byte aligned."""
  header, offset = {}, 0
  for name, array in tensors.items():
    header[name] = {
        'dtype': _SAFETENSORS_NAMES[array.dtype],
        'shape': list(array.shape),
        'data_offsets': [offset, offset + array.nbytes],
    }
    offset += array.nbytes
  encoded = json.dumps(header, separators=(',', ':')).encode()
  encoded += b' ' * (-len(encoded) % 8)
  with epath.Path(path).open('wb') as f:
    f.write(len(encoded).to_bytes(8, 'little') + encoded)
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())


def _read_torch(path: epath.Path) -> StateDict:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        f'{path}: reading a PyTorch file needs torch (pip install torch); or save it as '
        '.safetensors, which needs none'
    ) from None
  with path.open('rb') as f:
    loaded = torch.load(f, map_location='cpu', weights_only=True)
  for key in ('state_dict', 'model'):  # Training checkpoints wrap the weights.
    if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
      loaded = loaded[key]
  return {
      k.removeprefix('module.'): v.float().numpy()
      for k, v in loaded.items()
      if isinstance(v, torch.Tensor)
  }


def read(path: str) -> tuple[StateDict, dict[str, Any]]:
  """The state dict at `path` (see `is_state_dict_path`; a sharded model.safetensors.index.json too)
  and the config.json beside it, if any."""
  p = epath.Path(path)
  if path.endswith(_TORCH_SUFFIXES):
    files, read_file = [p], _read_torch
  elif path.endswith('.safetensors'):
    files, read_file = [p], read_safetensors
  elif (p / SAFETENSORS).is_file():
    files, read_file = [p / SAFETENSORS], read_safetensors
  else:
    index = json.loads((p / f'{SAFETENSORS}.index.json').read_text())
    files, read_file = [
        p / name for name in sorted(set(index['weight_map'].values()))
    ], read_safetensors
  for file in files:
    if not file.is_file():
      raise ValueError(f'no checkpoint file at {str(file)!r}: fix --config.init_from')
  state_dict = {}
  for file in files:
    state_dict.update(read_file(file))
  config_file = (p if p.is_dir() else p.parent) / 'config.json'
  config = json.loads(config_file.read_text()) if config_file.is_file() else {}
  return state_dict, config


def load(
    path: str,
    num_heads: int,
    mlp_activation: Optional[str] = None,
    layernorm_epsilon: Optional[float] = None,
) -> tuple[dict[str, Any], list[str]]:
  """The tree of the timm or transformers ViT at `path`, for a model with `num_heads` heads, and lines
  for the log; a one-line ValueError when it is something else, or when the config.json beside it
  names an MLP activation or LayerNorm epsilon other than the model's (`mlp_activation`,
  `layernorm_epsilon`: those have no tensors, so the weights would load and compute another
  function)."""
  state_dict, config = read(path)
  layout = next(
      (
          name
          for name, (marker, _) in LAYOUTS.items()
          if any(k.removeprefix('vit.') == marker for k in state_dict)
      ),
      None,
  )
  if layout is None:
    examples = ', '.join(repr(k) for k in sorted(state_dict)[:3])
    raise ValueError(
        f'{path}: a state dict of another model ({len(state_dict)} tensors, e.g. {examples}): '
        "init_from reads ViTs in timm's or Hugging Face transformers' naming, .npz files "
        'and vit_jax workdirs'
    )
  heads = config.get('num_attention_heads', config.get('model_args', {}).get('num_heads'))
  if heads is not None and heads != num_heads:
    raise ValueError(
        f'{path}: the checkpoint has {heads} attention heads, the model {num_heads}: set '
        f'--config.model.num_heads={heads} (or a --config.variant with that many)'
    )
  if layout == 'timm':
    _check_timm_pooling(state_dict, config, path)
  notes = [f'read {layout} state dict ({len(state_dict)} tensors)']
  named = config.get('hidden_act', config.get('model_args', {}).get('act_layer'))
  activation = _ACTIVATIONS.get(named, named)
  if named is not None and activation not in _ACTIVATIONS.values():
    # The MLP's nonlinearity has no parameters: loading the weights would compute another function.
    raise ValueError(
        f"{path}: the checkpoint's MLP uses the activation {named!r}, which vit_jax's ViT "
        f"has not (model.mlp_activation: {', '.join(sorted(set(_ACTIVATIONS.values())))})"
    )
  if mlp_activation and activation is not None and activation != mlp_activation:
    raise ValueError(
        f"{path}: the checkpoint's MLP was trained with {named}, the model uses "
        f'{mlp_activation}: set --config.model.mlp_activation={activation}'
    )
  epsilon = _layernorm_epsilon(layout, config)
  if layernorm_epsilon and epsilon is not None and not math.isclose(epsilon, layernorm_epsilon):
    raise ValueError(
        f"{path}: the checkpoint's LayerNorms use epsilon {epsilon:g} (its config.json's "
        f'layer_norm_eps), the model {layernorm_epsilon:g}: set '
        f'--config.model.layernorm_epsilon={epsilon:g}'
    )
  return LAYOUTS[layout][1](state_dict, num_heads, path), notes


def _layernorm_epsilon(layout: str, config: Mapping[str, Any]) -> Optional[float]:
  """The LayerNorm epsilon the config.json beside a state dict says the model used: transformers'
  `layer_norm_eps` (ViTConfig's default 1e-12 where a config.json leaves it out); None where it does
  not say (no config.json; timm's config.json holds no epsilon)."""
  if layout == 'transformers' and config:
    return float(config.get('layer_norm_eps', 1e-12))
  return None


def _check_timm_pooling(state_dict: StateDict, config: Mapping[str, Any], path: str) -> None:
  """A one-line error when the config.json beside a timm state dict names a pooling our ViT does not
  compute. Pooling has no parameters, so the state dict alone cannot tell: timm's class token with
  global_pool='avg' (and fc_norm=False) has the tensors of a class-token ViT, 'max' and 'avgmax' those
  of a GAP one, and they would load with other logits. Without a config.json this is not checked."""
  pool = config.get('global_pool', config.get('model_args', {}).get('global_pool'))
  class_token = 'cls_token' in state_dict
  # 'map' (timm's attn_pool) is left to the reader, which names its tensors.
  if pool in (None, '', 'map') or pool == ('token' if class_token else 'avg'):
    return
  if pool == 'avg':
    raise ValueError(
        f'{path}: the timm model averages its tokens although it has a class token '
        "(global_pool='avg', class_token=True), which vit_jax's ViT does not compute: its "
        'model.classifier=gap has no class token, model.classifier=token pools the class token'
    )
  raise ValueError(
      f"{path}: the timm model pools with global_pool={pool!r}, which vit_jax's ViT does not "
      f"compute (model.classifier: {'token' if class_token else 'gap'} pools as timm's "
      f"{'token' if class_token else 'avg'})"
  )


def timm_eval_crop(pp_eval: Mapping[str, Any], image_size: int) -> dict[str, Any]:
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


# The registered ViT timm builds an export as, by our LayerNorm epsilon: model_args replace its sizes
# and options, but its LayerNorm (timm's norm_layer, not in its config.json) stays: 1e-6, or
# torch's default 1e-5 (CLIP's).
_TIMM_ARCHITECTURES = {1e-6: 'vit_base_patch16_224', 1e-5: 'vit_base_patch16_clip_224'}


def _mlp_ratio(hidden_size: int, mlp_dim: int) -> float:
  """timm's `mlp_ratio` for an MLP of `mlp_dim` units: timm makes int(hidden_size * mlp_ratio) of
  them, and mlp_dim / hidden_size times hidden_size can round below mlp_dim (56 * (488 / 56) is
  487.99...); half a unit more floors to mlp_dim."""
  ratio = mlp_dim / hidden_size
  return ratio if int(hidden_size * ratio) == mlp_dim else (mlp_dim + 0.5) / hidden_size


def timm_config(
    model: Mapping[str, Any],
    image_size: int,
    num_classes: Optional[int],
    class_names: Optional[list[str]] = None,
    *,
    pp_eval: Mapping[str, Any],
) -> dict[str, Any]:
  """The config.json with which `timm.create_model('local-dir:DIR', pretrained=True)` builds this
  model and loads DIR/model.safetensors (`to_timm`). Images are in [-1, 1]: mean = std = 0.5. Its
  preprocessing is the run's `pp_eval` (`timm_eval_crop`), resized with PIL's bilinear filter, which
  always antialiases: pp_eval.antialias=True's resize (without it, a shrunk image differs). What
  timm's ViT cannot compute and the parameters do not show is a one-line ValueError."""
  if model['posemb_where'] != 'input':  # 'shared_every_layer' has the tree of 'input'.
    raise ValueError(
        "timm's VisionTransformer adds position embeddings only at the input "
        f"(model.posemb_where={model['posemb_where']})"
    )
  architecture = _TIMM_ARCHITECTURES.get(model['layernorm_epsilon'])
  if architecture is None:
    raise ValueError(
        "timm's VisionTransformer's LayerNorms have epsilon "
        f"{' or '.join(f'{e:g}' for e in _TIMM_ARCHITECTURES)} "
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
      'class_token': model['classifier'] == 'token',
      'global_pool': {'token': 'token', 'gap': 'avg', 'map': 'map'}[model['classifier']],
      'fc_norm': bool(model['fc_norm']),
      'act_layer': model['mlp_activation'],
  }
  if model['layer_scale'] is not None:
    model_args['init_values'] = model['layer_scale']
  if model['num_registers']:
    model_args['reg_tokens'] = model['num_registers']
  model_args['pre_norm'] = model['pre_norm']  # Explicit: the CLIP architecture's default is True.
  pretrained_cfg = {
      'input_size': [3, image_size, image_size],
      'fixed_input_size': True,
      'mean': [0.5] * 3,
      'std': [0.5] * 3,
      'interpolation': 'bilinear',
      **timm_eval_crop(pp_eval, image_size),
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
