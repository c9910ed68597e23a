"""Fitting a loaded parameter tree to a model of another resolution, patch size or class count
(position-embedding interpolation, patch-embedding resampling, head surgery; a new head may pool
otherwise than the checkpoint's). A model with
fixed position embeddings (`posemb='sincos2d'`) has no `pos_embedding`: there is nothing to resize,
and a checkpoint with learned ones is an error, not a drop.

Every learned position embedding (posemb.py) is resized to the new patch grid: the 1-D ones at the
input or in each block (`every_layer`) as the original code does, the 2-D ones along each axis, the
relative biases over their range of offsets (2h - 1, 2w - 1). A checkpoint with other kinds of position
embeddings than the model is an error naming `model.posemb` / `model.posemb_where`; the tree of
'shared_every_layer' is the tree of 'input' (one `posembed_input`), so only the config tells them apart.
The arrays are resized by vit_jax/checkpoints/posemb_resizing.py; a tree that does not fit is a
one-line error from vit_jax/checkpoints/tree_mismatch.py naming the flags that make it fit.

A BiT (bit.py) is a ResNet: it has no position embeddings, so fitting it to another resolution
changes nothing but the head.

It knows the models' parameter names (vit.py, mpp.py, mae.py, bit.py), so it lives beside them; the
original `.npz` layout, read and written, is vit_jax/checkpoints/npz_files.py; orbax checkpoints of
whole train states are vit_jax/checkpoints/checkpoint.py.
"""

from typing import Any, Callable, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import patch_resizing, posemb_resizing, tree_mismatch
from vit_jax.models import lora, scan_layout, vit
from vit_jax.models.pooling import MAP_HEAD

_REPORT_FIRST = ('embedding/', 'cls', 'dist', 'reg')
# Parameters of the self-supervised models (masked patch prediction, the masked autoencoder's decoder)
# that a classifier does not have.
_SELF_SUPERVISION_ONLY = ('mask_token', 'mpp_head', 'decoder')


def without_self_supervision(params: Mapping[str, Any]) -> dict[str, Any]:
  """A nested parameter tree without the self-supervised models' own layers (MPP's head and mask
  token, MAE's decoder): the backbone's."""
  return {name: value for name, value in params.items() if name not in _SELF_SUPERVISION_ONLY}


def _under(key: str, layer: str) -> bool:
  """Whether a flattened parameter name is `layer` or one of its parameters."""
  return key == layer or key.startswith(f'{layer}/')


def _has(flat: Mapping[str, Any], layer: str) -> bool:
  return any(_under(key, layer) for key in flat)


def num_prefix_tokens(params: Mapping[str, Any]) -> int:
  """The tokens before the patches (the class, distillation and register tokens, which have no place
  on the grid) of a ViT's parameters, nested or flat: their top-level names say."""
  return ('cls' in params) + ('dist' in params) + (params['reg'].shape[1] if 'reg' in params else 0)


def _kernel_shape(flat: dict[str, Any], layer: str) -> Optional[tuple[int, ...]]:
  return tuple(flat[f'{layer}/kernel'].shape) if f'{layer}/kernel' in flat else None


def _without(flat: dict[str, Any], layer: str) -> dict[str, Any]:
  return {k: v for k, v in flat.items() if not k.startswith(f'{layer}/')}


def _fit_pooling(
    params: dict[str, Any],
    targets: dict[str, Any],
    draw_map_head: Optional[Callable[[], Any]],
) -> tuple[dict[str, Any], list[str]]:
  """`params` for a new head's pooling: the final LayerNorm where the model has it, a new one (scale
  1, bias 0) where the checkpoint has it elsewhere or not at all, as MAE's and timm's fine-tuning of
  a class-token backbone with fc_norm do; the checkpoint's final LayerNorm and MAP head dropped where
  the model has none, and a new one drawn by `draw_map_head` where only the model has one. Also
  returns the log's notes."""
  notes = []
  old, new = tree_mismatch.final_norm(params), tree_mismatch.final_norm(targets)
  if old != new:
    params = _without(params, old) if old else params
    if new:
      params.update(
          {
              k: (np.ones if k.endswith('/scale') else np.zeros)(t.shape, t.dtype)
              for k, t in targets.items()
              if k.startswith(f'{new}/')
          }
      )
    side = 'after' if new == 'fc_norm' else 'before'
    if old and new:
      notes.append(
          f'replaced {old} with a new {new} (scale 1, bias 0): the model normalises {side} '
          'its pooling'
      )
    else:
      notes.append(
          f'dropped {old}: the model has no final LayerNorm'
          if old
          else f'added a new {new} (scale 1, bias 0): the checkpoint has no final LayerNorm'
      )
  old, new = tree_mismatch.has(params, MAP_HEAD), tree_mismatch.has(targets, MAP_HEAD)
  if old and not new:
    params = _without(params, MAP_HEAD)
    notes.append(f'dropped {MAP_HEAD} (attention pooling): the model pools otherwise')
  elif new and not old and draw_map_head is not None:
    params.update(
        {
            k: np.asarray(v)
            for k, v in traverse_util.flatten_dict({MAP_HEAD: draw_map_head()}, sep='/').items()
        }
    )
    notes.append(f'drew a new {MAP_HEAD} (attention pooling) as from scratch')
  return params, notes


def adapt_params(
    loaded: Any,
    target_shapes: Any,
    *,
    keep_head: bool,
    keep_pre_logits: bool,
    posemb_method: str = 'bilinear',
    patch_method: str = 'bilinear',
    draw_map_head: Optional[Callable[[], Any]] = None,
    draw_params: Optional[Callable[[], Any]] = None,
    seed: int = 0,
) -> tuple[dict[str, Any], list[str]]:
  """Fits a loaded parameter tree to a model's tree (of arrays or `jax.ShapeDtypeStruct`s).

  The head becomes zeros of the model's shape (the fine-tuning recipe) unless `keep_head`, and then
  may pool otherwise (`_fit_pooling`; `draw_map_head()`: a new MAP head's parameters, for a model
  that pools by attention and a checkpoint that does not); the pre-logits layer is dropped unless
  `keep_pre_logits` and the model has one; the position embeddings are resized to the model's grid.
  Low-rank adapters of the model (lora.py) that the checkpoint lacks are drawn from `seed`, their `b`
  zeros, so the model starts as the checkpoint; the layers of a self-supervised task (MAE's decoder,
  MPP's head and mask token) that the checkpoint lacks are taken from `draw_params()`, the model's
  parameters as a run from scratch draws them; a patch embedding of another patch size is resampled
  to the model's by `patch_method` (patch_resizing.py). Everything else must match exactly. Returns the
  fitted numpy tree and lines for the log saying what changed; raises ValueError naming the
  parameter on a mismatch.
  """
  # Also when this checkpoint needs no resizing: a typo is a typo.
  posemb_resizing.check_posemb_method(posemb_method)
  patch_resizing.check_patch_method(patch_method)
  params = traverse_util.flatten_dict(loaded, sep='/')
  targets = traverse_util.flatten_dict(target_shapes, sep='/')
  notes = []

  old, new = _kernel_shape(params, 'pre_logits'), _kernel_shape(targets, 'pre_logits')
  if old and not (keep_pre_logits and new) and keep_head and _kernel_shape(targets, 'head'):
    # The checkpoint's head reads the pre-logits layer's output: without that layer it would read the
    # pooled features instead, silently another function when their widths agree (ViT-B's 768).
    raise ValueError(
        f'pre_logits/kernel: checkpoint {old} vs model {new or "none"}: keep_head keeps a head '
        "that reads the checkpoint's pre-logits layer; set --config.keep_pre_logits=True "
        f'and --config.model.representation_size={old[1]} to keep both, or '
        '--config.keep_head=False for a new zero-initialised head'
    )
  if keep_pre_logits and not new:  # The flag would do nothing.
    raise ValueError(
        "config.keep_pre_logits=True keeps the checkpoint's pre-logits layer, but "
        + (
            f'the model has none: add it with --config.model.representation_size={old[1]}'
            if old
            else 'the checkpoint has none: set --config.keep_pre_logits=False'
        )
    )
  if old and not (keep_pre_logits and new):
    params = _without(params, 'pre_logits')
    notes.append(f'dropped pre_logits {old}')
  if new and not (keep_pre_logits and old):
    # A fresh pre-logits layer cannot be zeros (tanh(0) = 0 would give the zero head no gradient).
    raise ValueError(
        f'pre_logits/kernel: checkpoint {old or "none"} vs model {new}: the model has a '
        'pre-logits layer to load; set --config.keep_pre_logits=True with a checkpoint '
        'that has one, or remove it with --config.model.representation_size=None'
    )

  for head in vit.HEADS:
    old, new = _kernel_shape(params, head), _kernel_shape(targets, head)
    if keep_head and new and old != new:
      raise ValueError(
          f'{head}/kernel: checkpoint {old or "none"} vs model {new}: keep_head needs the '
          "checkpoint's head for as many classes as the model; set --config.keep_head=False "
          'for a new zero-initialised head, or make the number of classes match'
      )
    if old and not new:
      params = _without(params, head)
      notes.append(f'dropped {head} {old}: the model has none')
    elif new and not keep_head:
      params = _without(params, head)
      params.update(
          {k: np.zeros(t.shape, t.dtype) for k, t in targets.items() if k.startswith(f'{head}/')}
      )
      notes.append(
          f'replaced {head} {old} with zeros {new}' if old else f'added a zero {head} {new}'
      )

  if not keep_head:
    params, pooling_notes = _fit_pooling(params, targets, draw_map_head)
    notes.extend(pooling_notes)

  for layer in _SELF_SUPERVISION_ONLY:
    if _has(params, layer) and not _has(targets, layer):
      params = {k: v for k, v in params.items() if not _under(k, layer)}
      notes.append(f'dropped {layer} (self-supervised pretraining only)')
  missing = [
      layer for layer in _SELF_SUPERVISION_ONLY if _has(targets, layer) and not _has(params, layer)
  ]
  if missing and draw_params is not None:
    drawn = traverse_util.flatten_dict(draw_params(), sep='/')
    params.update({k: v for k, v in drawn.items() if any(_under(k, layer) for layer in missing)})
    notes.append(
        f'drew {" and ".join(missing)} as a run from scratch draws them: the checkpoint has none'
    )

  fresh = {k: t for k, t in targets.items() if lora.ADAPTER_PATH.search(k) and k not in params}
  if fresh:
    params.update(lora.draw(fresh, seed))
    notes.append(f'drew {len(fresh) // 2} low-rank adapters (b zeros: the checkpoint unchanged)')

  prefix = num_prefix_tokens(targets)
  if num_prefix_tokens(params) == prefix:
    for key in sorted(set(params) & set(targets)):
      note = posemb_resizing.resize_param(params, key, targets[key].shape, prefix, posemb_method)
      notes.extend([note] if note else [])
  if patch_resizing.KERNEL in targets:
    note = patch_resizing.resize_param(params, targets[patch_resizing.KERNEL].shape, patch_method)
    notes.extend([note] if note else [])

  # The parameters that tell architectures apart most plainly (patch size, classifier) come first.
  for key in sorted(set(params) | set(targets), key=lambda k: (not k.startswith(_REPORT_FIRST), k)):
    got = tuple(params[key].shape) if key in params else 'none'
    want = tuple(targets[key].shape) if key in targets else 'none'
    if got != want:
      raise tree_mismatch.explain(key, got, want, params, targets)
  fitted = {key: np.asarray(params[key], targets[key].dtype) for key in targets}
  return traverse_util.unflatten_dict(fitted, sep='/'), notes


def keeps_own_shapes(config: ml_collections.ConfigDict) -> bool:
  """Whether the run's parameters have other shapes than its model at its image size reads."""
  return config.flexi.kernel_size is not None or config.flexi.posemb_grid is not None


def kept_model(config: ml_collections.ConfigDict, model: nn.Module) -> tuple[nn.Module, int]:
  """The model and image size whose parameters (`param_shapes`) have the shapes a run of `config`
  keeps: `model` at config.image_size, or with `keeps_own_shapes` (a FlexiViT's, train/flexi.py) the
  model cutting flexi.kernel_size px patches out of images of flexi.posemb_grid of them."""
  if not keeps_own_shapes(config):
    return model, config.image_size
  kernel = config.flexi.kernel_size or model.patch_size
  grid = config.flexi.posemb_grid or config.image_size // model.patch_size
  return model.clone(patch_size=kernel), grid * kernel


def param_shapes(model: nn.Module, image_size: int) -> Any:
  """The parameter tree `model` initialises for images of `image_size`, as `jax.ShapeDtypeStruct`s
  in the per-block layout of the checkpoints; nothing is computed."""
  key = jax.random.key(0)
  return jax.eval_shape(
      lambda: scan_layout.per_block(model).init(
          {'params': key, 'mpp': key}, jnp.zeros((1, image_size, image_size, 3)), train=False
      )
  )['params']
