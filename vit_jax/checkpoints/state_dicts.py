"""ViTs in PyTorch's naming through `config.init_from`: which layout a state dict is (`LAYOUTS`:
timm's, Hugging Face transformers', and those renamed to timm's), the `model.*` fields it fixes
(`architecture`: what its tensors show and its config.json says), and its parameter tree in our
layout (`load`), checked against the model's fields that have no tensor (heads, MLP activation,
LayerNorm epsilon, pooling), since a mismatch there loads and computes another function.

The files: torch_files.py; the naming shared by the layouts: torch_names.py; each layout:
timm_layout.py (with timm_architecture.py, timm_arguments.py, timm_fields.py; Meta's Sapiens 2 and
DINOv3 files, Apple's AIMv2 files and OpenCLIP's renamed to it by sapiens_layout.py,
meta_dinov3_layout.py, apple_aimv2_layout.py and open_clip_layout.py), transformers_layout.py (with
transformers_families.py); a checkpoint's input normalisation folded in: input_normalization.py;
peft's adapters over a checkpoint: peft_adapters.py; the export to timm: timm_export.py (with
timm_export_args.py, timm_export_beit.py, timm_export_tensors.py), to peft: peft_export.py. `.npz`
ViTs' fields: big_vision_layout.py.
"""

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import (
    apple_aimv2_layout,
    big_vision_layout,
    input_normalization,
    meta_dinov3_layout,
    npz_files,
    open_clip_layout,
    peft_adapters,
    sapiens_layout,
    timm_arguments,
    timm_architecture,
    timm_layout,
    torch_files,
    transformers_layout,
    transformers_mae,
)
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import lora


@dataclasses.dataclass(frozen=True)
class Layout:
  recognises: Callable[[StateDict], bool]  # Whether a state dict is in this naming.
  # (state dict, num_heads, source, the MAP head's heads or None) -> our nested parameter tree.
  from_state_dict: Callable[[StateDict, int, str, Optional[int]], dict[str, Any]]
  # (state dict, its config.json, source) -> the model fields it fixes; a state dict of broadcast
  # zeros (torch_files.read's shapes_only) is enough.
  architecture: Callable[[StateDict, Mapping[str, Any], str], dict[str, Any]]
  # (its config.json, source) -> the (mean, std) per channel its images were normalised with for
  # pixels in [0, 1], where the files beside the weights say; None where they do not.
  normalization: Callable[[Mapping[str, Any], str], Optional[tuple[list[float], list[float]]]]


def _renamed_to_timm(
    recognises: Callable[[StateDict], bool],
    timm_names: Callable[[StateDict, str], StateDict],
    timm_config: Callable[[Mapping[str, Any], StateDict, str], Mapping[str, Any]] = (
        lambda config, *_: config
    ),
    normalization: Callable[
        [Mapping[str, Any], str], Optional[tuple[list[float], list[float]]]
    ] = timm_layout.normalization,
) -> Layout:
  """A layout timm reads by renaming it as it loads it: its state dict renamed (`timm_names`: (state
  dict, source) -> timm's names) and its config.json as timm's (`timm_config`: (config.json, the
  renamed state dict, source) -> timm's), read as timm's."""

  def architecture(state_dict: StateDict, config: Mapping[str, Any], path: str) -> dict[str, Any]:
    renamed = timm_names(state_dict, path)
    return timm_architecture.architecture(renamed, timm_config(config, renamed, path), path)

  return Layout(
      recognises,
      lambda state_dict, num_heads, source, map_heads: timm_layout.from_state_dict(
          timm_names(state_dict, source), num_heads, source, map_heads
      ),
      architecture,
      normalization,
  )


# Told apart in this order: Meta's DINOv3 names are mostly timm's.
LAYOUTS: dict[str, Layout] = {
    # Meta's DINOv3 files (facebookresearch/dinov3's .pth), as timm reads them.
    'meta_dinov3': _renamed_to_timm(
        meta_dinov3_layout.recognises,
        meta_dinov3_layout.timm_names,
        meta_dinov3_layout.timm_config,
        meta_dinov3_layout.normalization,
    ),
    'timm': Layout(
        timm_layout.recognises,
        timm_layout.from_state_dict,
        timm_architecture.architecture,
        timm_layout.normalization,
    ),
    'transformers': Layout(
        transformers_layout.recognises,
        transformers_layout.from_state_dict,
        transformers_layout.architecture,
        transformers_layout.normalization,
    ),
    # Meta's Sapiens 2 files (the hub's timm/vit_*_sapiens2.fb), read as timm reads them.
    'sapiens2': _renamed_to_timm(sapiens_layout.recognises, sapiens_layout.timm_names),
    # Apple's AIMv2 files (the hub's apple/aimv2-* before their transformers ones), as timm reads
    # them; the normalisation of the image processor's preprocessor_config.json beside them.
    'apple_aimv2': _renamed_to_timm(
        apple_aimv2_layout.recognises,
        apple_aimv2_layout.timm_names,
        apple_aimv2_layout.timm_config,
        transformers_layout.normalization,
    ),
    # OpenCLIP's files (the hub's laion/*, apple/DFN*, timm/ViT-*-SigLIP*, ...): their image tower
    # as timm reads it, of the open_clip_config.json beside them.
    'open_clip': _renamed_to_timm(
        open_clip_layout.recognises,
        open_clip_layout.timm_names,
        open_clip_layout.timm_config,
        open_clip_layout.normalization,
    ),
}
# The fields without a tensor, which `load` checks: what each is, for the one-line error.
_WITHOUT_TENSORS = {
    'num_heads': 'number of attention heads',
    'mlp_activation': 'MLP activation',
    'layernorm_epsilon': 'LayerNorm epsilon',
    'classifier': 'pooling',
    'rope': 'rotary position embeddings',
}
# The fields of the pooling and the final LayerNorm, which feed the head. A run that replaces the
# checkpoint's head (config.keep_head=False) may pool otherwise: MAE's and BEiT's fine-tuning averages
# a class-token backbone's patches and normalises after the pooling (classifier='gap',
# fc_norm=True); adapting.py drops or starts afresh what the new pooling does not share with the old.
_MAP_FIELDS = ('map_heads', 'map_mlp_dim', 'map_include_prefix')
POOLING_FIELDS = ('classifier', 'fc_norm', 'final_norm', *_MAP_FIELDS)


def layout_name(state_dict: StateDict, path: str) -> str:
  """The `LAYOUTS` name of the state dict of the checkpoint at `path`; a one-line ValueError for
  another model's."""
  if any(name.startswith('patch_embed.backbone.') for name in state_dict):
    raise ValueError(
        f"{path}: timm's hybrid ViT (vit_*_r*_s*: a ResNet stem, its patch_embed.backbone), which "
        "vit_jax does not read from timm's files: the paper's R50+ViT-B_16 .npz (timm's "
        'vit_base_r50_s16_* were converted from it) loads with --config.variant=R50+ViT-B_16'
    )
  for name, layout in LAYOUTS.items():
    if layout.recognises(state_dict):
      return name
  if 'embeds.proj.weight' in state_dict:
    raise ValueError(
        f"{path}: timm's NaFlexVit (naflexvit_*, its patch embedding `embeds.proj`), which vit_jax "
        "does not read; SigLIP 2's NaFlex towers load from big_vision's siglip2_*_naflex.npz or "
        "transformers' google/siglip2-*-naflex"
    )
  examples = ', '.join(repr(k) for k in sorted(state_dict)[:3])
  raise ValueError(
      f'{path}: a state dict of another model ({len(state_dict)} tensors, e.g. {examples}): '
      "init_from reads ViTs in timm's, Hugging Face transformers', OpenCLIP's, Meta's Sapiens 2 or "
      "DINOv3 or Apple's AIMv2 naming, .npz files and vit_jax workdirs"
  )


def architecture(path: str) -> dict[str, Any]:
  """The `model.*` fields that the timm or transformers ViT at `path` fixes, from its tensors' shapes
  (a .safetensors file's header alone) and the config.json beside it, or those of an `.npz` ViT
  (big_vision_layout.architecture): what config.variant='checkpoint' builds. A field neither shows is
  left out."""
  if path.endswith('.npz'):
    return big_vision_layout.architecture(npz_files.load_npz(path, shapes_only=True), path)
  shapes, config = _read(path, shapes_only=True)
  return LAYOUTS[layout_name(shapes, path)].architecture(shapes, config, path)


def normalization(path: str) -> Optional[tuple[list[float], list[float]]]:
  """The (mean, std) per channel the timm or transformers ViT at `path` was trained to read pixels in
  [0, 1] with, which `load` folds into its patch embedding; None where its files say none or the
  identity's (0.5, 0.5: vit_jax's own images)."""
  shapes, config = _read(path, shapes_only=True)
  return _folded_normalization(LAYOUTS[layout_name(shapes, path)], config, path)


def pixel_decoder(path: str) -> Optional[dict[str, Any]]:
  """What the pixel decoder of the MAE checkpoint at `path` (transformers_mae.py) predicts: the
  pixels normalised as its images were ('normalization', `normalization`'s), per patch or not
  ('norm_pix_loss', None where its config.json does not say); None without a decoder."""
  shapes, config = _read(path, shapes_only=True)
  if not transformers_mae.has_decoder(shapes):
    return None
  layout = LAYOUTS[layout_name(shapes, path)]
  return {
      'normalization': _folded_normalization(layout, config, path),
      'norm_pix_loss': config.get('norm_pix_loss'),
  }


def _folded_normalization(
    layout: Layout, config: Mapping[str, Any], path: str
) -> Optional[tuple[list[float], list[float]]]:
  said = layout.normalization(config, path)
  return None if said is None or np.allclose(said, 0.5) else said


def _read(path: str, shapes_only: bool = False) -> tuple[StateDict, dict[str, Any]]:
  """torch_files.read, or for peft's LoRA adapters their base with them folded in."""
  if peft_adapters.is_adapter_dir(path):
    return peft_adapters.read(path, shapes_only)
  return torch_files.read(path, shapes_only)


def _same(a: Any, b: Any) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    return math.isclose(a, b)
  if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):  # JSON's lists, config tuples.
    return tuple(a) == tuple(b)
  return a == b


def fill(model: Mapping[str, Any], path: str, keep_head: bool = True) -> dict[str, Any]:
  """`model` (config.model's fields, None where unset) with its unset fields set to what the
  checkpoint at `path` fixes (`architecture`, by `fill_fields`): config.variant='checkpoint'. A
  one-line ValueError also for a field without tensors it does not say (no config.json beside it).
  """
  filled = fill_fields(model, architecture(path), keep_head)
  for field, what in _WITHOUT_TENSORS.items():
    if filled.get(field) is None:
      named = torch_files.beside(path, 'config.json').get('architecture')
      if named and named.partition('.')[0] not in timm_arguments.architectures():
        raise ValueError(
            f"{path}: its config.json names timm's {named!r}, none of timm "
            f"{timm_arguments.timm_version()}'s ViTs that vit_jax reads (another model class, or a "
            f"newer timm's), and does not say its {what}: if it is a ViT, set "
            f'--config.model.{field}'
        )
      raise ValueError(
          f'{path} does not say its {what} (model.{field}): there is no config.json beside it, or '
          f'one that leaves it out; set --config.model.{field}'
      )
  return filled


def fill_fields(
    model: Mapping[str, Any], fixed: Mapping[str, Any], keep_head: bool = True
) -> dict[str, Any]:
  """`model` (config.model's fields, None where unset) with its unset fields set to those `fixed` by
  config.init_from. A one-line ValueError for a set field that `fixed` contradicts (but
  `POOLING_FIELDS` without `keep_head`, and the patch size, to which the patch embedding is
  resampled)."""
  filled = dict(model)
  own_pooling = not keep_head and model.get('classifier') not in (None, fixed.get('classifier'))
  for field, value in fixed.items():
    given = model.get(field)
    if given is None:
      # The checkpoint's MAP head's fields are no field of another pooling.
      if not (own_pooling and field in _MAP_FIELDS and model['classifier'] != 'map'):
        filled[field] = value
    # Layer scale's value is the scales' initial one, which the checkpoint's replace; a patch
    # embedding of another patch size is resampled to the model's (adapting.py).
    elif not (
        _same(given, value)
        or (field == 'layer_scale' and value is not None)
        or field == 'patch_size'
        or (field in POOLING_FIELDS and not keep_head)
    ):
      raise ValueError(
          f'config.model.{field}={given!r} contradicts config.init_from, whose {field} is '
          f"{value!r}: drop that setting (config.variant='checkpoint' takes it from the "
          'checkpoint)'
          + (
              ', set --config.keep_head=False for a new head that pools otherwise'
              if field in POOLING_FIELDS
              else ''
          )
          + ', or load another checkpoint'
      )
  return filled


def load(
    path: str, model: Mapping[str, Any], keep_head: bool = True
) -> tuple[dict[str, Any], list[str]]:
  """The tree of the timm or transformers ViT at `path` for a model of the fields `model` (its
  num_heads split the attention kernels), and lines for the log; a one-line ValueError when it is
  something else, or when the checkpoint fixes a field without tensors (`_WITHOUT_TENSORS`) to
  another value than the model's (the pooling's only when `keep_head`, and the MAP head's only where
  both have one)."""
  # peft's adapters stay adapters in a model with adapters (lora.factored), else fold in.
  adapters = lora.model_spec(model) if peft_adapters.is_adapter_dir(path) else None
  if adapters:
    state_dict, config, updates = peft_adapters.read_apart(path)
  else:
    (state_dict, config), updates = _read(path), {}
  name = layout_name(state_dict, path)
  layout = LAYOUTS[name]
  fixed = layout.architecture(state_dict, config, path)
  checked = {
      **_WITHOUT_TENSORS,
      'rope_grid': 'grid of rotary position embeddings',
      'rope_style': 'style of rotary position embeddings',
      'map_heads': "MAP head's number of heads",
      'map_mlp_dim': "MAP head's MLP width",
      'map_include_prefix': "MAP head's attention to the class token and registers",
      'res_post_norm': "blocks' norms after their branches",
  }
  # A MAP head read from the checkpoint (not a new one) must have the model's heads and tokens.
  map_head = model.get('classifier') == fixed.get('classifier') == 'map'
  unchecked = {*([] if keep_head else ['classifier']), *([] if map_head else _MAP_FIELDS)}
  for field, what in checked.items():
    if field in unchecked:
      continue
    if field in fixed and field in model and not _same(fixed[field], model[field]):
      raise ValueError(
          f"{path}: the checkpoint's {what} is {fixed[field]!r}, the model's {model[field]!r}: "
          f'set --config.model.{field}={fixed[field]}, or --config.variant=checkpoint to '
          'take every field from the checkpoint'
      )
  notes = [f'read {name} state dict ({len(state_dict)} tensors)']
  # The checkpoint's MAP head is read as it was trained, also when the model drops it.
  map_heads = model.get('map_heads') if map_head else fixed.get('map_heads')
  tree = layout.from_state_dict(state_dict, model['num_heads'], path, map_heads)
  if 'decoder_hidden_size' in model and transformers_mae.has_decoder(state_dict):
    tree['decoder'] = transformers_mae.decoder(state_dict, config, model, path)
    notes.append("read its MAE pixel decoder (config.task='mae' continues its pretraining)")
  if updates:
    changes = {k: np.broadcast_to(np.float32(0), np.shape(v)) for k, v in state_dict.items()}
    changes = layout.from_state_dict({**changes, **updates}, model['num_heads'], path, map_heads)
    tree, kept, added = lora.factored(tree, changes, adapters)
    notes.append(
        f"kept its adapters' updates of {kept} layers as the model's adapters (rank "
        f'{adapters.rank}, of their SVD)'
        + (
            f', folded those of {added} layers it does not adapt into their kernels'
            if added
            else ''
        )
    )
  said = _folded_normalization(layout, config, path)
  if layout.normalization is transformers_layout.normalization and not torch_files.beside(
      path, transformers_layout.PROCESSOR
  ):
    notes.append(
        f'found no {transformers_layout.PROCESSOR} beside it (a save_pretrained of the model '
        "alone writes none), so its weights read vit_jax's images as they are, in [-1, 1]: a "
        "model trained on other pixels (ImageNet's mean and std...) needs its image "
        "processor's file there"
    )
  if said is not None:
    tree = input_normalization.fold(tree, *said)
    mean, std = (', '.join(f'{x:g}' for x in values) for values in said)
    notes.append(
        f'folded its input normalisation (mean {mean}, std {std}) into the patch embedding, '
        "so that it reads vit_jax's images in [-1, 1]"
    )
  return tree, notes
