"""vit_jax/checkpoints/timm_architectures.json from the installed timm: for every architecture timm
registers as a VisionTransformer, an Eva or a Beit (vision_transformer.py, deit.py, eva.py,
beit.py), the arguments its entry point creates the model with, and each class's defaults. A hub checkpoint's config.json
names its architecture but not these arguments; the table is how vit_jax knows them without timm.

Regenerate after changing the pinned timm (test_timm_architectures_vs_torch.py checks the file):
  .venv/bin/python tests/timm_registry.py > vit_jax/checkpoints/timm_architectures.json
"""

import functools
import inspect
import json
import sys
from typing import Any
from unittest import mock

import timm
import torch
from timm.models import beit, deit, eva, vision_transformer

# The timm classes vit_jax reads, by the name the table gives them.
CLASSES = {
    'vision_transformer': vision_transformer.VisionTransformer,
    'eva': eva.Eva,
    'beit': beit.Beit,
}
# The functions the entry points of each timm module create their models through, and the class each
# creates.
_CREATORS = (
    (vision_transformer, '_create_vision_transformer', 'vision_transformer'),
    (eva, '_create_eva', 'eva'),
    (deit, '_create_deit', 'vision_transformer'),
    (beit, '_create_beit', 'beit'),
)
# Arguments of no consequence to the table (devices, dtypes), or not JSON (the class to build).
_SKIPPED = ('device', 'dtype', 'pretrained_cfg', 'pretrained_cfg_overlay', 'out_indices')


def _norm(layer: Any) -> dict[str, Any]:
  """A norm layer argument as what it builds: its class name and epsilon."""
  built = timm.layers.get_norm_layer(layer)(4)
  return {'type': type(built).__name__, 'eps': built.eps}


def _activation(layer: Any) -> str:
  """An activation argument as what it builds: 'GELU', 'GELUTanh', 'QuickGELU', 'SiLU', ..."""
  built = timm.layers.get_act_layer(layer)()
  if isinstance(built, torch.nn.GELU) and built.approximate == 'tanh':
    return 'GELUTanh'
  return type(built).__name__


# The arguments recorded as what they build, whatever form (name, class, partial) they are given in.
_LAYERS = {'norm_layer': _norm, 'act_layer': _activation}


def _value(arg: str, value: Any) -> Any:
  if value is not None and arg in _LAYERS:
    return _LAYERS[arg](value)
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (tuple, list)):
    return [_value(arg, v) for v in value]
  if isinstance(value, functools.partial):
    return {'partial': value.func.__name__, **{k: _value(k, v) for k, v in value.keywords.items()}}
  if callable(value):
    return value.__name__
  raise TypeError(f'{arg}={value!r}: no JSON form')


def _arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
  return {k: _value(k, v) for k, v in sorted(kwargs.items()) if k not in _SKIPPED}


def _defaults(cls: type) -> dict[str, Any]:
  parameters = inspect.signature(cls.__init__).parameters.values()
  return _arguments({p.name: p.default for p in parameters if p.name != 'self'})


def registered_arguments(name: str) -> tuple[str, dict[str, Any]]:
  """(the class, the arguments) timm's entry point `name` creates its model with, captured at the
  module's create function instead of building the model."""
  captured = {}

  def capture(cls):
    def create(variant, pretrained=False, **kwargs):
      del variant, pretrained
      distilled = kwargs.pop('distilled', False)
      captured['class'] = cls
      captured['args'] = {**kwargs, **({'distilled': True} if distilled else {})}
      return torch.nn.Identity()

    return create

  patches = [mock.patch.object(m, f, capture(cls)) for m, f, cls in _CREATORS]
  for patch in patches:
    patch.start()
  try:
    timm.models.get_arch_name(name)  # Fails early for a name timm does not know.
    timm.models._registry._model_entrypoints[name](pretrained=False)
  finally:
    for patch in patches:
      patch.stop()
  return captured['class'], _arguments(captured['args'])


def table() -> dict[str, Any]:
  names = sorted(
      name
      for module in ('vision_transformer', 'deit', 'eva', 'beit')
      for name in timm.list_models(module=module)
  )
  architectures = {}
  for name in names:
    cls, args = registered_arguments(name)
    architectures[name] = {'class': cls, 'args': args}
  return {
      'timm': timm.__version__,
      'defaults': {name: _defaults(cls) for name, cls in CLASSES.items()},
      'architectures': architectures,
  }


def dumps(data: dict[str, Any]) -> str:
  """One architecture a line: diffs after a timm update read as the architectures that changed."""
  lines = [
      '{',
      f'"timm": {json.dumps(data["timm"])},',
      f'"defaults": {json.dumps(data["defaults"], sort_keys=True)},',
      '"architectures": {',
  ]
  entries = [
      f'{json.dumps(name)}: {json.dumps(entry, sort_keys=True)}'
      for name, entry in data['architectures'].items()
  ]
  lines.append(',\n'.join(entries))
  lines += ['}', '}']
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  sys.stdout.write(dumps(table()))
