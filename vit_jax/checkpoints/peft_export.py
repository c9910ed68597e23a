"""A run's low-rank adapters as Hugging Face peft's (`export`): the `adapter_model.safetensors` and
`adapter_config.json` that `PeftModel.from_pretrained(base, DIR)` loads over timm's model of the
checkpoint the run started from, or over transformers' classifier class of it
(peft_transformers.py names those), and that `config.init_from=DIR` reads back (peft_adapters.py).

Over a timm checkpoint, adapters are named for timm's modules (timm_export_tensors.py's naming).
timm fuses the query, key and value projections into one `attn.qkv` (EVA-02's gated MLP its two
halves into one `mlp.fc1`): the adapters of the parts of such a module are one adapter of it, of
rank r per adapted part, A their A's stacked and B theirs block-diagonal (zeros where a part has
none), with alpha times the parts too (`rank_pattern`, `alpha_pattern`), so that alpha / r stays the
run's and the update is the same. The parameters that trained beside the adapters (a new head) are
peft's `modules_to_save`: the whole timm modules that hold them.
"""

import dataclasses
import re
from typing import Any, Callable, Optional

import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import (
    hub,
    peft_adapters,
    peft_transformers,
    state_dicts,
    timm_export_args,
    timm_export_tensors,
    torch_files,
)
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import lora, vit

Shapes = dict[str, tuple[int, ...]]  # A state dict's tensors' shapes.
CONFIG, WEIGHTS = peft_adapters.CONFIG, peft_adapters.WEIGHTS[0]
# Our adapted layer (its name in a block) -> (timm's module in the block, the layer's part of it), by
# timm's classes: the first the model has.
_TIMM_MODULES = {
    'query': (('attn.qkv', 0), ('attn.q_proj', 0)),
    'key': (('attn.qkv', 1), ('attn.k_proj', 0)),
    'value': (('attn.qkv', 2), ('attn.v_proj', 0)),
    'out': (('attn.proj', 0),),
    'Dense_0': (('mlp.fc1_g', 0), ('mlp.fc1', 0)),  # The MLP's first layer, a gated one's gate.
    'Dense_linear': (('mlp.fc1_x', 0), ('mlp.fc1', 1)),
    'Dense_1': (('mlp.fc2', 0),),
}
_BLOCK = re.compile(r'^Transformer/encoderblock_(\d+)/(?:.+/)?([^/]+)$')


@dataclasses.dataclass(frozen=True)
class Base:
  """The timm or transformers checkpoint a run's adapters are over."""

  name: str  # peft's `base_model_name_or_path`: its hub repository, or its absolute path.
  path: str  # Its local file or directory.
  layout: str  # 'timm' or 'transformers' (state_dicts.LAYOUTS).
  shapes: Shapes  # Of its tensors, by its files' names.
  config: dict[str, Any]  # Its config.json.
  # Whether the run started from peft's adapters over it, whose updates of layers the run does not
  # adapt were folded into its frozen kernels (state_dicts.load).
  through_adapters: bool


def base(init_from: Optional[str]) -> Base:
  """The base of adapters trained over `init_from` (a run's config.init_from, or the base of the
  peft adapters it names). A one-line ValueError where it is neither a timm nor a transformers
  checkpoint, whose modules the adapters name."""
  if not init_from:
    raise ValueError('the run started from no checkpoint (config.init_from) for peft to adapt')
  path = hub.local(init_from)
  through_adapters = peft_adapters.is_adapter_dir(path)
  if through_adapters:
    name, path = peft_adapters.base(path)
  else:
    name = init_from.removeprefix(hub.PREFIX) if init_from.startswith(hub.PREFIX) else path
  tensors, config = (
      torch_files.read(path, shapes_only=True) if torch_files.is_state_dict_path(path) else ({}, {})
  )
  layout = state_dicts.layout_name(tensors, path) if tensors else None
  if layout not in ('timm', 'transformers'):
    raise ValueError(
        f"the adapters name timm's or transformers' modules, and the run started from {init_from}, "
        "neither a timm nor a transformers checkpoint: start from timm's copy of those weights "
        '(e.g. hf-hub:timm/...)'
    )
  shapes = {k: tuple(np.shape(v)) for k, v in tensors.items()}
  return Base(name, path, layout, shapes, dict(config), through_adapters)


def check_unfolded(
    checkpoint: Base, params: Any, model_config: dict[str, Any], trained: Callable[[str], bool]
) -> None:
  """Where the run started from peft's adapters over `checkpoint`, a one-line ValueError unless its
  blocks' frozen kernels (`params`, of the adapted model of `model_config`; `trained(path)` says
  which train) are the checkpoint's: adapters of layers the run does not adapt were folded into
  them."""
  if not checkpoint.through_adapters:
    return
  theirs, _ = state_dicts.load(checkpoint.path, lora.without_adapters(model_config), False)
  theirs = traverse_util.flatten_dict(theirs, sep='/')
  for name, kernel in traverse_util.flatten_dict(params, sep='/').items():
    if name.startswith('Transformer/encoderblock_') and name.endswith('/kernel'):
      if not trained(name) and not np.array_equal(kernel, theirs[name]):
        raise ValueError(
            f"the run's {name} is not its base's: the peft adapters it started from of layers the "
            'run does not adapt were folded into it (adapt those too: model.lora_targets); the '
            'merged timm/ export holds the run'
        )


def _timm_module(layer: str, shapes: Shapes) -> tuple[str, int]:
  """(timm's module, the part of it) of our adapted `layer` in the base of tensor `shapes`; a
  one-line error where it has no module for it alone."""
  found = _BLOCK.match(layer)
  block, name = (int(found[1]), found[2]) if found else (None, layer)
  for module, part in _TIMM_MODULES.get(name, ()):
    if f'blocks.{block}.{module}.weight' in shapes:
      return f'blocks.{block}.{module}', part
  raise ValueError(
      f"the base has no timm module of the adapted layer {layer} alone (timm's parallel blocks "
      'pack the projections into one): the merged timm/ export holds the run'
  )


def _adapters(
    flat: dict[str, np.ndarray],
    shapes: Shapes,
    rank: int,
    module_of: Callable[[str], tuple[str, int]],
) -> dict[str, StateDict]:
  """The base's module -> its lora_A [parts' ranks, inputs] and lora_B [outputs, parts' ranks] of
  the adapters in `flat` (our '/'-joined per-block parameters), in the base of tensor `shapes`, whose
  module and part of it our adapted layer is `module_of(layer)`."""
  parts: dict[str, list[tuple[int, np.ndarray, np.ndarray]]] = {}
  for path in sorted(p for p in flat if lora.ADAPTER_PATH.search(p) and p.endswith('/a')):
    adapter = path.removesuffix('/a')
    module, part = module_of(adapter.removesuffix(lora.SUFFIX))
    if module.endswith('.attn.qkv') and f'{module[: -len("qkv")]}q_bias' in shapes:
      raise ValueError(
          f"timm computes the base's {module} from its weight with q_bias and v_bias (Eva's and "
          "Beit's F.linear), past peft's adapter of it: the merged timm/ export holds the run, or "
          'train adapters of other layers than query, key and value'
      )
    a = np.asarray(flat[path], np.float32).reshape(-1, rank)
    b = np.asarray(flat[f'{adapter}/b'], np.float32).reshape(rank, -1)
    parts.setdefault(module, []).append((part, a, b))
  out = {}
  for module, adapted in parts.items():
    weight = shapes[f'{module}.weight']
    rows = adapted[0][2].shape[1]  # A part's outputs: the parts of a timm module are equal.
    lora_a = np.concatenate([a.T for _, a, _ in adapted])
    if (
        len(weight) != 2
        or lora_a.shape[1] != weight[1]
        or max(p for p, _, _ in adapted) >= weight[0] // rows
    ):
      raise ValueError(
          f"the base's {module}.weight {weight} is not a projection of the run's adapted layers: is "
          'config.init_from the checkpoint the run started from?'
      )
    lora_b = np.zeros((weight[0], rank * len(adapted)), np.float32)
    for i, (part, _, b) in enumerate(adapted):
      lora_b[part * rows : (part + 1) * rows, i * rank : (i + 1) * rank] = b.T
    out[module] = {'lora_A': lora_a, 'lora_B': lora_b}
  return out


def _whole_modules(
    flat: dict[str, np.ndarray],
    trained: Callable[[str], bool],
    cls: str,
    adapted: set[str],
    shapes: Shapes,
) -> tuple[list[str], StateDict]:
  """timm's modules that hold the parameters `trained` names beside the adapters (peft's
  modules_to_save), in the base of tensor `shapes`, and their tensors; a one-line error for one peft
  cannot save whole there."""
  mask = {
      path: np.full(np.shape(x), float(trained(path)))
      for path, x in flat.items()
      if not lora.ADAPTER_PATH.search(path)
  }
  masked = timm_export_tensors.to_state_dict(traverse_util.unflatten_dict(mask, sep='/'), cls)
  tensors = sorted(name for name, x in masked.items() if x.any())
  modules = {name.rpartition('.')[0] for name in tensors}
  for tensor in tensors:
    module = tensor.rpartition('.')[0]
    within = sorted(m for m in adapted if m == module or m.startswith(f'{module}.'))
    # The base's patch embedding reads images normalised its own way (ours folds it in).
    where = (
        'outside any module'
        if not module
        else f'in a module with adapters ({within[0]})'
        if within
        else 'in the patch embedding, which reads images as the base normalises them'
        if module.startswith('patch_embed')
        # A new head: the base may have none, or another number of classes.
        else 'in no module of the base'
        if module not in vit.HEADS and tensor not in shapes
        else None
    )
    if where:
      raise ValueError(
          f"peft saves trained modules whole, and timm's {tensor} trains {where}: keep it frozen "
          '(config.optim.trained), or use the merged timm/ export'
      )
  # A module within another that trains is saved with it.
  saved = sorted(m for m in modules if not any(m.startswith(f'{o}.') for o in modules))
  plain = {p: x for p, x in flat.items() if not lora.ADAPTER_PATH.search(p)}
  ours = timm_export_tensors.to_state_dict(traverse_util.unflatten_dict(plain, sep='/'), cls)
  return saved, {n: x for n, x in ours.items() if any(n.startswith(f'{m}.') for m in saved)}


def export(
    params: Any,
    adapters: lora.Spec,
    trained: Callable[[str], bool],
    model_config: dict[str, Any],
    checkpoint: Base,
) -> tuple[StateDict, dict[str, Any]]:
  """peft's adapter state dict and adapter_config.json of `params` (our per-block tree with
  `adapters`, of the model of `model_config`), over the timm or transformers checkpoint the run
  started from (`checkpoint`), named as its modules; `trained(path)` says which parameters trained.
  What peft cannot hold over that checkpoint is a one-line ValueError."""
  shapes = checkpoint.shapes
  flat = traverse_util.flatten_dict(params, sep='/')
  if checkpoint.layout == 'timm':
    cls = timm_export_args.timm_class(model_config)
    factors = _adapters(flat, shapes, adapters.rank, lambda layer: _timm_module(layer, shapes))
    saved, whole = _whole_modules(flat, trained, cls, set(factors), shapes)
  else:
    module_of, live, whole = peft_transformers.naming(
        flat, trained, model_config, shapes, checkpoint.config, checkpoint.path
    )
    factors = _adapters(flat, shapes, adapters.rank, module_of)
    factors = {live(module): pair for module, pair in factors.items()}
    saved = sorted({name.rpartition('.')[0] for name in whole})
  tensors = {
      f'{peft_adapters.PREFIX}{module}.{factor}.weight': value
      for module, pair in factors.items()
      for factor, value in pair.items()
  }
  tensors.update({peft_adapters.PREFIX + name: value for name, value in whole.items()})
  # Keys as peft matches them (the whole name, its dots literal); the modules of one part need none.
  parts = {module: pair['lora_A'].shape[0] // adapters.rank for module, pair in factors.items()}
  config = {
      'peft_type': 'LORA',
      'base_model_name_or_path': checkpoint.name,
      'r': adapters.rank,
      'lora_alpha': adapters.alpha,
      'lora_dropout': adapters.dropout_rate,
      'target_modules': sorted(factors),
      'rank_pattern': {re.escape(m): n * adapters.rank for m, n in parts.items() if n > 1},
      'alpha_pattern': {re.escape(m): n * adapters.alpha for m, n in parts.items() if n > 1},
      'modules_to_save': saved or None,
      'bias': 'none',
      'use_rslora': False,
      'use_dora': False,
      'fan_in_fan_out': False,
      'init_lora_weights': True,
      'inference_mode': True,
      'task_type': None,
  }
  return {k: np.ascontiguousarray(v) for k, v in tensors.items()}, config
