"""Fitting a loaded parameter tree to a model of another resolution or class count (position-embedding
interpolation, head surgery; a new head may pool otherwise than the checkpoint's). A model with fixed position embeddings (`posemb='sincos2d'`) has no
`pos_embedding`: there is nothing to resize, and a checkpoint with learned ones is an error, not a drop.

Every learned position embedding (posemb.py) is resized to the new patch grid: the 1-D ones at the
input or in each block (`every_layer`) as the original code does, the 2-D ones along each axis, the
relative biases over their range of offsets (2h - 1, 2w - 1). A checkpoint with other kinds of position
embeddings than the model is an error naming `model.posemb` / `model.posemb_where`; the tree of
'shared_every_layer' is the tree of 'input' (one `posembed_input`), so only the config tells them apart.
The arrays are resized by vit_jax/checkpoints/posemb_resizing.py.

A BiT (bit.py) is a ResNet: it has no position embeddings, so fitting it to another resolution
changes nothing but the head.

It knows the models' parameter names (vit.py, mpp.py, bit.py), so it lives beside them; the
original `.npz` layout, read and written, is vit_jax/checkpoints/npz_files.py; orbax checkpoints of
whole train states are vit_jax/checkpoints/checkpoint.py.
"""

import re
from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from vit_jax.checkpoints import posemb_resizing
from vit_jax.models import scan_layout

_REPORT_FIRST = ('embedding/', 'cls', 'dist', 'reg')
# The classifier's heads: DeiT's distilled models have a second, on the distillation token.
_HEADS = ('head', 'head_dist')
# Parameters of the masked-patch-prediction model that a classifier does not have.
_SELF_SUPERVISION_ONLY = ('mask_token', 'mpp_head')
# The final LayerNorm: the encoder's, before the pooling, or after it (model.fc_norm); and the MAP
# head (pooling.py). A new head may pool otherwise than the checkpoint's (state_dicts.POOLING_FIELDS).
_FINAL_NORMS = ('Transformer/encoder_norm', 'fc_norm')
_MAP_HEAD = 'MAPHead_0'


def _posemb_kind(flat: dict[str, Any]) -> tuple[str, str]:
  """The position embeddings a flat tree has, told by its parameter names: (what, the flags that make
  a model with them)."""
  names = [k for k in flat if posemb_resizing.POSEMB_PARAM.search(k)]
  if not names:
    return 'no learned position embeddings', '--config.model.posemb=sincos2d (or none)'
  if any('relative_posemb/' in k for k in names):
    return 'relative position embeddings', '--config.model.posemb=relative'
  two_d = any(posemb_resizing.POSEMB_AXIS.search(k) for k in names)
  flags = f'--config.model.posemb={"learn2d" if two_d else "learn"}'
  if any('/posembed/' in k for k in names):
    return (
        f'learned {"2-D " if two_d else ""}position embeddings in every block',
        f'{flags} --config.model.posemb_where=every_layer',
    )
  return f'learned {"2-D " if two_d else ""}position embeddings', flags


# Parameters that a bool model field adds: (their path's pattern, the field, what they are).
_STRUCTURE_FIELDS = (
    (r'/[qk]_norm/', 'qk_norm', 'query/key normalisation'),
    (r'/MultiHeadDotProductAttention_1/key/bias$', 'key_bias', 'key biases'),
    (r'/MultiHeadDotProductAttention_1/norm/', 'attn_norm', 'LayerNorms in its attention'),
    (r'/MlpBlock_3/Dense_linear/', 'mlp_gated', 'gated MLPs (GLU)'),
    (r'/MlpBlock_3/norm/', 'mlp_norm', 'LayerNorms in its MLPs'),
)


def _architecture_error(
    path: str, loaded: Any, target: Any, params: dict[str, Any], targets: dict[str, Any]
) -> ValueError:
  kind, want = _posemb_kind(params), _posemb_kind(targets)
  if posemb_resizing.POSEMB_PARAM.search(path) and kind[0] != want[0]:
    # Learned embeddings are what the blocks were trained with: replacing them with others is a
    # change of architecture the config has to ask for.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has {kind[0]}; '
        f'set {kind[1]} to match it'
    )
  if path == 'reg':
    return ValueError(
        f'reg: checkpoint {loaded} vs model {target}: the checkpoint has '
        + (
            f"{loaded[1]} register token{'s' if loaded[1] > 1 else ''}"
            if loaded != 'none'
            else 'no register tokens'
        )
        + f"; set --config.model.num_registers={loaded[1] if loaded != 'none' else 0}"
    )
  if path == 'dist':
    has = loaded != 'none'
    return ValueError(
        f'dist: checkpoint {loaded} vs model {target}: the checkpoint has '
        f"{'a' if has else 'no'} distillation token (DeiT's); set --config.model.distilled={has}"
    )
  if path == 'cls' and 'none' in (loaded, target):
    if loaded != 'none':
      return ValueError(
          f'cls: checkpoint {loaded} vs model none: the checkpoint has a class token; set '
          '--config.model.class_token=True (classifier gap or map leave it unpooled)'
      )
    return ValueError(
        f'cls: checkpoint none vs model {target}: the checkpoint has no class token to pool; set '
        '--config.model.classifier=gap (or map) and class_token=False'
    )
  if path.startswith(f'{_MAP_HEAD}/') and 'none' in (loaded, target):
    if loaded != 'none':
      return ValueError(
          f'{path}: checkpoint {loaded} vs model none: the checkpoint pools by attention; set '
          '--config.model.classifier=map, or --config.keep_head=False for a new head that pools '
          'otherwise'
      )
    return ValueError(
        f'{path}: checkpoint none vs model {target}: the checkpoint has no MAP head, and none is '
        'drawn afresh into a loaded model; set --config.model.classifier=gap (or token)'
    )
  for norm, fc_norm in zip(_FINAL_NORMS, (False, True)):
    if path.startswith(f'{norm}/') and 'none' in (loaded, target):
      fc_norm = fc_norm if loaded != 'none' else not fc_norm  # The checkpoint's.
      return ValueError(
          f'{path}: checkpoint {loaded} vs model {target}: the checkpoint normalises '
          f"{'after' if fc_norm else 'before'} its pooling; set --config.model.fc_norm={fc_norm}, "
          'or --config.keep_head=False for a new head (its new LayerNorm starts at scale 1)'
      )
  for pattern, field, what in _STRUCTURE_FIELDS:
    if re.search(pattern, path):
      has = loaded != 'none'
      return ValueError(
          f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has '
          f"{'' if has else 'no '}{what}; set --config.model.{field}={has}"
      )
  if re.search(r'/ls[12]$', path):  # Layer scale: a tensor per block, its value any positive one.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: '
        + (
            'the checkpoint has layer scale; set --config.model.layer_scale=1e-5 (the '
            "checkpoint's scales replace the initial value)"
            if target == 'none'
            else 'the checkpoint has no layer scale; unset --config.model.layer_scale'
        )
    )
  return ValueError(
      f'{path}: checkpoint {loaded} vs model {target}: the checkpoint is another '
      'architecture; set --config.variant (and --config.model.*) to match it'
  )


def num_prefix_tokens(params: Mapping[str, Any]) -> int:
  """The tokens before the patches (the class, distillation and register tokens, which have no place
  on the grid) of a ViT's parameters, nested or flat: their top-level names say."""
  return ('cls' in params) + ('dist' in params) + (params['reg'].shape[1] if 'reg' in params else 0)


def _kernel_shape(flat: dict[str, Any], layer: str) -> Optional[tuple[int, ...]]:
  return tuple(flat[f'{layer}/kernel'].shape) if f'{layer}/kernel' in flat else None


def _without(flat: dict[str, Any], layer: str) -> dict[str, Any]:
  return {k: v for k, v in flat.items() if not k.startswith(f'{layer}/')}


def _has(flat: dict[str, Any], layer: str) -> bool:
  return any(k.startswith(f'{layer}/') for k in flat)


def _fit_pooling(
    params: dict[str, Any], targets: dict[str, Any]
) -> tuple[dict[str, Any], list[str]]:
  """`params` for a new head's pooling: the checkpoint's final LayerNorm replaced by a new one (scale
  1, bias 0) where the model normalises on the other side of its pooling, as MAE's and timm's
  fine-tuning of a class-token backbone with fc_norm do; the checkpoint's MAP head dropped where the
  model has none. Also returns the log's notes."""
  notes = []
  old, new = (next((n for n in _FINAL_NORMS if _has(tree, n)), None) for tree in (params, targets))
  if old and new and old != new:
    params = _without(params, old)
    params.update(
        {
            k: (np.ones if k.endswith('/scale') else np.zeros)(t.shape, t.dtype)
            for k, t in targets.items()
            if k.startswith(f'{new}/')
        }
    )
    side = 'after' if new == 'fc_norm' else 'before'
    notes.append(
        f'replaced {old} with a new {new} (scale 1, bias 0): the model normalises {side} '
        'its pooling'
    )
  if _has(params, _MAP_HEAD) and not _has(targets, _MAP_HEAD):
    params = _without(params, _MAP_HEAD)
    notes.append(f'dropped {_MAP_HEAD} (attention pooling): the model pools otherwise')
  return params, notes


def adapt_params(
    loaded: Any,
    target_shapes: Any,
    *,
    keep_head: bool,
    keep_pre_logits: bool,
    posemb_method: str = 'bilinear',
) -> tuple[dict[str, Any], list[str]]:
  """Fits a loaded parameter tree to a model's tree (of arrays or `jax.ShapeDtypeStruct`s).

  The head becomes zeros of the model's shape (the fine-tuning recipe) unless `keep_head`, and then
  may pool otherwise (`_fit_pooling`); the pre-logits layer is dropped unless `keep_pre_logits` and
  the model has one; the position embeddings are resized to the model's grid. Everything else must
  match exactly. Returns the fitted numpy tree
  and lines for the log saying what changed; raises ValueError naming the parameter on a mismatch.
  """
  # Also when this checkpoint needs no resizing: a typo is a typo.
  posemb_resizing.check_posemb_method(posemb_method)
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

  for head in _HEADS:
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
    params, pooling_notes = _fit_pooling(params, targets)
    notes.extend(pooling_notes)

  for layer in _SELF_SUPERVISION_ONLY:
    if any(k == layer or k.startswith(f'{layer}/') for k in params) and not any(
        k == layer or k.startswith(f'{layer}/') for k in targets
    ):
      params = {k: v for k, v in params.items() if k != layer and not k.startswith(f'{layer}/')}
      notes.append(f'dropped {layer} (masked patch prediction only)')

  prefix = num_prefix_tokens(targets)
  if num_prefix_tokens(params) == prefix:
    for key in sorted(set(params) & set(targets)):
      note = posemb_resizing.resize_param(params, key, targets[key].shape, prefix, posemb_method)
      notes.extend([note] if note else [])

  # The parameters that tell architectures apart most plainly (patch size, classifier) come first.
  for key in sorted(set(params) | set(targets), key=lambda k: (not k.startswith(_REPORT_FIRST), k)):
    got = tuple(params[key].shape) if key in params else 'none'
    want = tuple(targets[key].shape) if key in targets else 'none'
    if got != want:
      raise _architecture_error(key, got, want, params, targets)
  fitted = {key: np.asarray(params[key], targets[key].dtype) for key in targets}
  return traverse_util.unflatten_dict(fitted, sep='/'), notes


def param_shapes(model: nn.Module, image_size: int) -> Any:
  """The parameter tree `model` initialises for images of `image_size`, as `jax.ShapeDtypeStruct`s
  in the per-block layout of the checkpoints; nothing is computed."""
  key = jax.random.key(0)
  return jax.eval_shape(
      lambda: scan_layout.per_block(model).init(
          {'params': key, 'mpp': key}, jnp.zeros((1, image_size, image_size, 3)), train=False
      )
  )['params']
