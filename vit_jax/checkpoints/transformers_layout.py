"""Hugging Face transformers' ViTs in: `ViTModel` / `ViTForImageClassification` (`from_state_dict`).

transformers' separate `query` / `key` / `value` are ours; its `pooler` is the pre-logits layer
(Dense + tanh). Its LayerNorm epsilon has no tensor: the config.json's `layer_norm_eps` is checked.
"""

from typing import Any, Mapping, Optional

from flax import traverse_util

from vit_jax.checkpoints import torch_files, torch_names
from vit_jax.checkpoints.torch_files import StateDict


def from_state_dict(
    state_dict: StateDict, num_heads: int, source: str = 'state dict'
) -> dict[str, Any]:
  """The nested tree of a transformers `ViTModel` or `ViTForImageClassification` state dict."""
  # The classifier wraps the encoder as `vit.`; ViTModel's names have no prefix.
  state_dict = {name.removeprefix('vit.'): value for name, value in state_dict.items()}
  r = torch_names.Reader(state_dict, source, 'transformers')
  e = 'embeddings.'
  tree = {
      'embedding/kernel': torch_names.patch_kernel(
          r.take(e + 'patch_embeddings.projection.weight')
      ),
      'embedding/bias': r.take(e + 'patch_embeddings.projection.bias'),
      'cls': r.take(e + 'cls_token'),
      'Transformer/posembed_input/pos_embedding': r.take(e + 'position_embeddings'),
  }
  for i in range(torch_names.num_blocks(state_dict, r'encoder\.layer\.(\d+)\.')):
    t, ours = f'encoder.layer.{i}.', torch_names.BLOCK.format(i)
    weights = {
        'out.weight': r.take(t + 'attention.output.dense.weight'),
        'out.bias': r.take(t + 'attention.output.dense.bias'),
    }
    for name, theirs in (('q', 'query'), ('k', 'key'), ('v', 'value')):
      weights[f'{name}.weight'] = r.take(f'{t}attention.attention.{theirs}.weight')
      weights[f'{name}.bias'] = r.take(f'{t}attention.attention.{theirs}.bias')
    tree.update(torch_names.attention_in(torch_names.ATTENTION.format(i), weights, num_heads))
    tree.update(
        torch_names.norms_and_mlp(
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
      tree[f'{ours}/kernel'], tree[f'{ours}/bias'] = torch_names.kernel(
          r.take(f'{theirs}.weight')
      ), r.take(f'{theirs}.bias')
  r.check_all_taken()
  return traverse_util.unflatten_dict(tree, sep='/')


def recognises(state_dict: StateDict) -> bool:
  return any(
      name.removeprefix('vit.') == 'embeddings.patch_embeddings.projection.weight'
      for name in state_dict
  )


def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
  """The model fields of a transformers ViT: the sizes from its tensors, and from the config.json
  `save_pretrained` writes beside them the heads, activation and LayerNorm epsilon (ViTConfig's
  defaults, gelu and 1e-12, where it leaves them out)."""
  state_dict = {name.removeprefix('vit.'): value for name, value in state_dict.items()}
  patches = state_dict['embeddings.patch_embeddings.projection.weight'].shape
  fields = {
      'patch_size': patches[-1],
      'hidden_size': patches[0],
      'num_layers': torch_names.num_blocks(state_dict, r'encoder\.layer\.(\d+)\.'),
      'mlp_dim': state_dict['encoder.layer.0.intermediate.dense.weight'].shape[0],
      'classifier': 'token',
      'fc_norm': False,
      'pre_norm': False,
      'num_registers': 0,
      'layer_scale': None,
      'posemb': 'learn',
      'posemb_where': 'input',
  }
  if config:
    fields['num_heads'] = config.get('num_attention_heads', 12)
    fields['mlp_activation'] = torch_names.activation(config.get('hidden_act', 'gelu'), path)
    fields['layernorm_epsilon'] = float(config.get('layer_norm_eps', 1e-12))
  return fields


def normalization(
    config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  """The image_mean and image_std of the image processor's preprocessor_config.json beside the
  weights (a hub snapshot has one; `save_pretrained` of a model alone writes none), if it normalises.
  """
  del config
  processor = torch_files.beside(path, 'preprocessor_config.json')
  if processor.get('do_normalize', True) and 'image_mean' in processor and 'image_std' in processor:
    return list(processor['image_mean']), list(processor['image_std'])
  return None
