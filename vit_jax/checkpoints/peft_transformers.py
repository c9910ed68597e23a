"""The modules of a Hugging Face transformers checkpoint that a run's peft adapters over it name
(peft_export.py's other kind of base): those of the `*ForImageClassification` class of its
model_type (`CLASSES`), whose `classifier` holds the head the run trained (peft's
`modules_to_save`), as transformers 5 names them.

Which of the base's tensors each of our parameters is read from is found by reading, as init_from
does (transformers_layout.py), a state dict of the base's names whose every tensor holds its own
number: the readers move tensors and never mix them, so no table of names per family is needed.
Those are the names transformers 4 gave the modules, which its files keep
(`encoder.layer.N.attention.attention.query`); transformers 5 renames some as it loads them
(`RENAMED`), and peft names the model's modules. peft_adapters.py reads adapters of either naming.
"""

import re
from typing import Any, Callable, Mapping

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import transformers_layout
from vit_jax.models import lora

# model_type -> (the module of its *ForImageClassification that holds the base model, which prefixes
# its modules' names where the files do not; the pooling its classifier reads, as our
# model.classifier): ViT's reads the class token, DINOv2's it beside the patches' mean, SigLIP's
# every token's mean.
CLASSES = {
    'vit': ('vit.', 'token'),
    'dinov2': ('dinov2.', 'token_gap'),
    'dinov2_with_registers': ('dinov2_with_registers.', 'token_gap'),  # Not the registers' mean.
    'siglip': ('vision_model.', 'gap'),  # A whole SigLIP's (its vision tower alone loads no class).
}
HEAD = 'classifier'
# transformers 5's renames of the modules its files name, in the order it applies them (its
# conversion_mapping.py: ViTModel's, Dinov2Model's and Dinov2WithRegistersModel's), as (the files'
# dotted names, the model's).
_VIT_ATTENTION = (
    ('attention.attention.query', 'attention.q_proj'),
    ('attention.attention.key', 'attention.k_proj'),
    ('attention.attention.value', 'attention.v_proj'),
    ('attention.output.dense', 'attention.o_proj'),
)
RENAMED = {
    'vit': (
        ('encoder.layer', 'layers'),
        *_VIT_ATTENTION,
        ('intermediate.dense', 'mlp.fc1'),
        ('output.dense', 'mlp.fc2'),
    ),
    'dinov2': _VIT_ATTENTION,
    'dinov2_with_registers': _VIT_ATTENTION,
}


def _renamed(name: str, pairs: tuple[tuple[str, str], ...]) -> str:
  for old, new in pairs:
    name = re.sub(rf'(?<![^.]){re.escape(old)}(?=\.|$)', new, name)
  return name


def module_name(name: str, model_type: str) -> str:
  """The module a transformers checkpoint of `model_type` names `name` in its files, as transformers
  5 names it ('vit.encoder.layer.0.attention.attention.query' -> 'vit.layers.0.attention.q_proj').
  """
  return _renamed(name, RENAMED.get(model_type, ()))


def file_name(name: str, model_type: str) -> str:
  """`module_name`'s inverse: the name in its files of a module transformers 5 names `name`."""
  pairs = RENAMED.get(model_type, ())
  return _renamed(name, tuple((new, old) for old, new in reversed(pairs)))


def _model_type(config: Mapping[str, Any], path: str) -> str:
  model_type = config.get('model_type')
  if model_type not in CLASSES:
    raise ValueError(
        f"peft's adapters over {path} name the modules of transformers' *ForImageClassification "
        f'of its model_type, {model_type!r}: vit_jax writes those of {", ".join(CLASSES)} (the '
        'merged timm/ export holds the run)'
    )
  return model_type


def sources(shapes: Mapping[str, tuple[int, ...]], config: Mapping[str, Any], path: str) -> dict:
  """Our '/'-joined parameter -> the name of the tensor of the transformers checkpoint at `path` (of
  tensor `shapes` and config.json `config`) that init_from reads it from, for those read from one.
  """
  names = sorted(shapes)
  numbered = {k: np.broadcast_to(np.float32(i + 1), shapes[k]) for i, k in enumerate(names)}
  num_heads = transformers_layout.architecture(numbered, config, path)['num_heads']
  tree = transformers_layout.from_state_dict(numbered, num_heads, path)
  found = {}
  for param, value in traverse_util.flatten_dict(tree, sep='/').items():
    value = np.asarray(value)
    number = value.flat[0] if value.size else 0
    if number >= 1 and number == round(number) and value.min() == value.max():
      found[param] = names[int(number) - 1]
  return found


def naming(
    flat: dict[str, np.ndarray],
    trained: Callable[[str], bool],
    model_config: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    config: Mapping[str, Any],
    path: str,
) -> tuple[Callable[[str], tuple[str, int]], Callable[[str], str], dict[str, np.ndarray]]:
  """How peft names the adapters of `flat` (our '/'-joined parameters; `trained(path)` says which
  train) over the transformers checkpoint at `path`: (our adapted layer -> (the checkpoint's module,
  part 0), a module of its files -> its name in *ForImageClassification, the tensors peft saves whole
  by those names: the trained classifier). One-line ValueErrors for what peft cannot hold there."""
  model_type = _model_type(config, path)
  prefix, pooling = CLASSES[model_type]
  pre_logits = any(p.startswith('pre_logits/') for p in flat)
  if model_config['classifier'] != pooling or pre_logits:
    raise ValueError(
        f"transformers' {model_type} *ForImageClassification pools {pooling!r} into its "
        f"classifier, and the run {model_config['classifier']!r}"
        + (' through a pre-logits layer' if pre_logits else '')
        + f': train with --config.model.classifier={pooling} (and no model.representation_size) for '
        'peft adapters of it, or use the merged timm/ export'
    )
  found = sources(shapes, config, path)
  modules: dict[str, str] = {}

  def module(layer: str) -> tuple[str, int]:
    tensor = found.get(f'{layer}/kernel', '')
    if not tensor.endswith('.weight') or modules.setdefault(tensor, layer) != layer:
      raise ValueError(
          f'the adapted layer {layer} is read from no projection of its own of {path}: the merged '
          'timm/ export holds the run'
      )
    return tensor.removesuffix('.weight'), 0

  live = lambda name: module_name(name if name.startswith(prefix) else prefix + name, model_type)
  saved = {}
  for param, value in flat.items():
    if lora.ADAPTER_PATH.search(param) or not trained(param):
      continue
    if param not in ('head/kernel', 'head/bias'):
      raise ValueError(
          f"peft saves trained modules whole, and the run's {param} trains outside transformers' "
          f'{HEAD}: keep it frozen (config.optim.trained), or use the merged timm/ export'
      )
    saved[f'{HEAD}.{param.rpartition("/")[2].replace("kernel", "weight")}'] = (
        np.asarray(value).T if param.endswith('kernel') else np.asarray(value)
    )
  return module, live, saved
