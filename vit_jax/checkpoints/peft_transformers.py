"""The modules of a Hugging Face transformers checkpoint that a run's peft adapters over it name
(peft_export.py's other kind of base): those of the classifier class of its model_type (`CLASSES`:
ViT's, DeiT's, BEiT's, I-JEPA's, DINOv2's, SigLIP's, CLIP's), whose classifiers hold the heads the
run trained (peft's `modules_to_save`), as transformers 5 names them.

Which of the base's tensors each of our parameters is read from is found by reading, as init_from
does (transformers_layout.py), a state dict of the base's names whose every tensor holds its own
number: the readers move tensors and never mix them, so no table of names per family is needed.
Those are the names transformers 4 gave the modules, which its files keep
(`encoder.layer.N.attention.attention.query`); transformers 5 renames some as it loads them
(`RENAMED`), and peft names the model's modules. peft_adapters.py reads adapters of either naming.
"""

import dataclasses
import re
from typing import Any, Callable, Mapping

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import transformers_layout
from vit_jax.models import lora


@dataclasses.dataclass(frozen=True)
class Classifier:
  """transformers' classifier class of a model_type, which peft's adapters over its files wrap."""

  name: str
  # The module that holds the base model, prefixing its modules' names (where the files do not).
  prefix: str
  # The model fields of the run whose logits the class computes: the pooling its classifier reads
  # (model.classifier), where the final LayerNorm is (model.fc_norm) or that there is none
  # (model.final_norm), a distillation token.
  fields: Mapping[str, Any]
  heads: Mapping[str, str] = dataclasses.field(default_factory=lambda: {'head': 'classifier'})


def _fields(
    classifier: str, fc_norm: bool = False, distilled: bool = False, final_norm: bool = True
) -> dict[str, Any]:
  return {
      'classifier': classifier,
      'fc_norm': fc_norm,
      'distilled': distilled,
      'final_norm': final_norm,
  }


# model_type -> its classifier class: ViT's reads the class token, DINOv2's it beside the patches'
# mean, SigLIP's and I-JEPA's every token's mean, BEiT's the patches' mean LayerNormed (its pooler,
# our fc_norm; a file without use_mean_pooling its class token: `classifier`), DeiT's the mean of
# its class token's and distillation token's classifiers (the hub's facebook/deit-*-distilled-*'s
# class), CLIP's the patches' mean of the blocks' output, which its `post_layernorm` (the class
# token's alone, for its CLIPVisionModel's pooler_output) never normalises: no final LayerNorm.
CLASSES = {
    'vit': Classifier('ViTForImageClassification', 'vit.', _fields('token')),
    'deit': Classifier(
        'DeiTForImageClassificationWithTeacher',
        'deit.',
        _fields('token', distilled=True),
        {'head': 'cls_classifier', 'head_dist': 'distillation_classifier'},
    ),
    'beit': Classifier('BeitForImageClassification', 'beit.', _fields('gap', fc_norm=True)),
    'ijepa': Classifier('IJepaForImageClassification', 'ijepa.', _fields('gap')),
    'dinov2': Classifier('Dinov2ForImageClassification', 'dinov2.', _fields('token_gap')),
    'dinov2_with_registers': Classifier(  # Not the registers' mean.
        'Dinov2WithRegistersForImageClassification', 'dinov2_with_registers.', _fields('token_gap')
    ),
    # A whole SigLIP's (its vision tower alone loads no class).
    'siglip': Classifier('SiglipForImageClassification', 'vision_model.', _fields('gap')),
    # A whole CLIP's too (its CLIPVisionModel's config.json builds a default CLIP, not its own).
    'clip': Classifier(
        'CLIPForImageClassification', 'vision_model.', _fields('gap', final_norm=False)
    ),
}
# transformers 5's renames of the modules its files name, in the order it applies them (its
# conversion_mapping.py: ViTModel's, Dinov2Model's and Dinov2WithRegistersModel's; SigLIP's and
# CLIP's towers only drop the `vision_model.` that transformers 4's files of a tower alone prefix),
# as (the files' dotted names, the model's).
_VIT_ATTENTION = (
    ('attention.attention.query', 'attention.q_proj'),
    ('attention.attention.key', 'attention.k_proj'),
    ('attention.attention.value', 'attention.v_proj'),
    ('attention.output.dense', 'attention.o_proj'),
)
_VIT_MODEL = (
    ('encoder.layer', 'layers'),
    *_VIT_ATTENTION,
    ('intermediate.dense', 'mlp.fc1'),
    ('output.dense', 'mlp.fc2'),
)
RENAMED = {
    'vit': _VIT_MODEL,
    # Its _MODEL_TO_CONVERSION_PATTERN gives DeiTModel, BeitModel and IJepaModel ViTModel's.
    'deit': _VIT_MODEL,
    'beit': _VIT_MODEL,
    'ijepa': _VIT_MODEL,
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


def classifier_class(config: Mapping[str, Any], path: str) -> Classifier:
  """The class peft's adapters over the transformers checkpoint at `path` (of config.json `config`)
  name the modules of; a one-line ValueError for a model_type without one here."""
  model_type = config.get('model_type')
  if model_type not in CLASSES:
    raise ValueError(
        f"peft's adapters over {path} name the modules of transformers' *ForImageClassification "
        f'of its model_type, {model_type!r}: vit_jax writes those of {", ".join(CLASSES)} (the '
        'merged timm/ export holds the run)'
    )
  if model_type == 'beit' and not config.get('use_mean_pooling', True):
    return dataclasses.replace(CLASSES[model_type], fields=_fields('token'))
  return CLASSES[model_type]


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
  part 0), a module of its files -> its name in the classifier class, the tensors peft saves whole
  by those names: the trained heads). One-line ValueErrors for what peft cannot hold there."""
  cls = classifier_class(config, path)
  run = {f: model_config[f] for f in cls.fields}  # A resolved model config holds every field.
  wrong = [f for f, v in cls.fields.items() if run[f] != v]
  pre_logits = any(p.startswith('pre_logits/') for p in flat)
  if wrong or pre_logits:
    runs = [f'model.{f}={run[f]!r}' for f in wrong]
    raise ValueError(
        f"transformers' {cls.name} computes its logits otherwise than the run ("
        + ', '.join(runs + ['a pre-logits layer'] * pre_logits)
        + '): train with '
        + ' '.join([f'--config.model.{f}={cls.fields[f]}' for f in wrong] or ['no'])
        + (' (and no model.representation_size)' if wrong else ' model.representation_size')
        + ' for peft adapters of it, or use the merged timm/ export'
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

  model_type = config['model_type']
  live = lambda name: module_name(
      name if name.startswith(cls.prefix) else cls.prefix + name, model_type
  )
  saved = {}
  for param, value in flat.items():
    if lora.ADAPTER_PATH.search(param) or not trained(param):
      continue
    head, _, leaf = param.partition('/')
    if head not in cls.heads or leaf not in ('kernel', 'bias'):
      raise ValueError(
          f"peft saves trained modules whole, and the run's {param} trains outside transformers' "
          f'{" and ".join(cls.heads.values())}: keep it frozen (config.optim.trained), or use the '
          'merged timm/ export'
      )
    saved[f'{cls.heads[head]}.{leaf.replace("kernel", "weight")}'] = (
        np.asarray(value).T if leaf == 'kernel' else np.asarray(value)
    )
  return module, live, saved
