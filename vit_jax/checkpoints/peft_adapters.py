"""Hugging Face peft's LoRA adapters as `config.init_from`: a directory of `adapter_config.json` and
`adapter_model.safetensors` (what `PeftModel.save_pretrained` writes, and the hub's adapter
repositories hold) is read as its base model (the config's `base_model_name_or_path`: a local
directory or file, else a hub repository) with every adapter folded into the weight it adapts,
W + lora_alpha / r * B A (rsLoRA's alpha / sqrt(r); rank_pattern's and alpha_pattern's where they
name the layer), and the modules peft trained whole
(`modules_to_save`, a classifier) in place of the base's. The state dict is then the base's, in its
own naming: timm's, transformers' or OpenCLIP's readers take it as they take the base.
"""

import json
import math
import os
import re
from typing import Any

import numpy as np
from etils import epath

from vit_jax.checkpoints import hub, peft_transformers, torch_files

CONFIG = torch_files.ADAPTER_CONFIG
WEIGHTS = ('adapter_model.safetensors', 'adapter_model.bin')
PREFIX = 'base_model.model.'  # peft's name of the model it wraps.
FACTORS = ('.lora_A.weight', '.lora_B.weight')


def is_adapter_dir(path: str) -> bool:
  return (epath.Path(path) / CONFIG).is_file()


def _settings(path: str) -> dict[str, Any]:
  """The adapter config, with one-line errors for what folding cannot express."""
  config = json.loads((epath.Path(path) / CONFIG).read_text())
  refused = {
      'peft_type': (config.get('peft_type') != 'LORA', "LoRA's ('LORA')"),
      'use_dora': (config.get('use_dora'), 'False (DoRA rescales the weights it adapts)'),
      'bias': (config.get('bias', 'none') != 'none', "'none' (trained biases are not saved apart)"),
      'base_model_name_or_path': (
          not config.get('base_model_name_or_path'),
          'the base checkpoint (a local directory or a hub repository)',
      ),
  }
  for field, (bad, fix) in refused.items():
    if bad:
      raise ValueError(
          f'{path}/{CONFIG}: {field}={config.get(field)!r}; vit_jax folds LoRA adapters whose '
          f'{field} is {fix}: fix the adapter config, or fine-tune from a merged checkpoint '
          '(peft: merge_and_unload, then save_pretrained)'
      )
  return config


def _scale(settings: dict[str, Any], module: str, rank: int) -> float:
  """The factor of B A in `module`'s update: its alpha (the first alpha_pattern key that ends its
  name, as peft matches them, else lora_alpha) over its rank (the factors' own: rank_pattern's
  where it names the module), or over its square root with rsLoRA."""
  alphas = settings.get('alpha_pattern') or {}
  pattern = next((k for k in alphas if re.match(rf'(.*\.)?({k})$', module)), None)
  alpha = alphas[pattern] if pattern is not None else settings['lora_alpha']
  return alpha / (math.sqrt(rank) if settings.get('use_rslora') else rank)


def base(path: str) -> tuple[str, str]:
  """The base checkpoint of the adapters at `path`: (its name, where it is). A local path as their
  base_model_name_or_path gives it (or relative to `path`): its absolute path, twice; else the hub
  repository of that name, downloaded into the Hugging Face cache if need be."""
  name = _settings(path)['base_model_name_or_path']
  for local in (name, os.path.join(path, name)):
    if os.path.exists(local):
      return os.path.abspath(local), os.path.abspath(local)
  return name, hub.local(f'{hub.PREFIX}{name}')


def _base_name(module: str, stems: set[str], path: str, model_type: str) -> str:
  """The base state dict's name of peft's `module` (peft's names are the wrapped model's modules,
  e.g. 'vit.encoder.layer.0.attention.attention.query', a file's may lack the 'vit.' prefix; those of
  transformers 5 are renamed, 'vit.layers.0.attention.q_proj', ViTModel's renames where the base's
  `model_type` has none of its own)."""
  matches = lambda m: [s for s in stems if s == m or m.endswith(f'.{s}') or s.endswith(f'.{m}')]
  renamed = model_type if model_type in peft_transformers.RENAMED else 'vit'
  found = matches(module) or matches(peft_transformers.file_name(module, renamed))
  if len(found) != 1:
    raise ValueError(
        f'{path}: the adapted layer {module!r} matches {len(found)} weights of its base '
        f'({", ".join(sorted(found)[:3]) or "none"}): is base_model_name_or_path its base?'
    )
  return found[0]


def read_apart(
    path: str, shapes_only: bool = False
) -> tuple[torch_files.StateDict, dict[str, Any], torch_files.StateDict]:
  """The base state dict with peft's whole-trained modules in place, the base's config.json, and
  the update of each weight the adapters of `path` adapt (by its name in the base: scale * B A, in
  its shape; none with `shapes_only`, which reads as torch_files.read)."""
  settings = _settings(path)
  state_dict, config = torch_files.read(base(path)[1], shapes_only)
  weights = next((epath.Path(path) / n for n in WEIGHTS if (epath.Path(path) / n).is_file()), None)
  if weights is None:
    raise ValueError(f'{path} has {CONFIG} but none of {", ".join(WEIGHTS)}: download them too')
  adapters, _ = torch_files.read(str(weights))
  adapters = {k.removeprefix(PREFIX): v for k, v in adapters.items()}
  stems = {k.removesuffix('.weight') for k in state_dict if k.endswith('.weight')}
  updates = {}
  for key in sorted(k for k in adapters if k.endswith(FACTORS[0])):
    module = key.removesuffix(FACTORS[0])
    a, b = (np.asarray(adapters.pop(module + f), np.float32) for f in FACTORS)
    if settings.get('fan_in_fan_out'):  # GPT-2's Conv1D layout: weight (in, out).
      a, b = b.T, a.T
    name = f'{_base_name(module, stems, path, config.get("model_type"))}.weight'
    if not shapes_only:
      scale = _scale(settings, module, rank=a.shape[0])
      updates[name] = (scale * (b @ a)).reshape(state_dict[name].shape)
  # What peft trained whole (modules_to_save, a classifier): saved under the module's own name, which
  # the readers take with or without the wrapper's prefix ('vit.'), as they take the base's.
  for key, value in adapters.items():
    state_dict[key] = np.zeros_like(value) if shapes_only else value
  return state_dict, config, updates


def read(path: str, shapes_only: bool = False) -> tuple[torch_files.StateDict, dict[str, Any]]:
  """The base state dict with the adapters of `path` folded in (`read_apart`'s), and the base's
  config.json; `shapes_only` as torch_files.read (the shapes are the base's: folding keeps them)."""
  state_dict, config, updates = read_apart(path, shapes_only)
  for name, update in updates.items():
    weight = state_dict[name]
    state_dict[name] = (np.asarray(weight, np.float32) + update).astype(weight.dtype)
  return state_dict, config
