"""Parameter groups: learning-rate and weight-decay multipliers, layer-wise learning-rate decay and
frozen parameters (config.optim.{lr_mults, wd_mults, layer_decay, frozen, trained}).

Which parameters are frozen is models/freezing.py's rule.

Groups are chosen by regex, searched in '/'-joined parameter paths of the checkpoint layout
(`Transformer/encoderblock_3/MlpBlock_3/Dense_0/kernel`); the first regex that matches wins. The
optimizer is built before the parameters exist, so each choice is a function of the tree a
transformation is given in `init` and `update`, in either layout: an array of a scanned model's stacked
blocks (`Transformer/encoderblock/...`) gets one value per layer, shaped to broadcast over its leading
axis. `check_param_groups` catches the regexes that match no parameter, once the tree is known.
"""

import functools
import math
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from vit_jax.models import freezing, layer_ids, lora, scan_layout

FROZEN, TRAINED = 'frozen', 'trained'  # The labels of `frozen_labels`.


def path_str(key_path: tuple[Any, ...]) -> str:
  return jax.tree_util.keystr(key_path, simple=True, separator='/')


def _decays(path: str) -> bool:
  """Weight decay applies to weight matrices, not to biases, norms, embeddings or the class token."""
  return path.rsplit('/', 1)[-1] == 'kernel'


def kernels_only(tree: Any) -> Any:
  """The weight-decay mask: True for the kernels of `tree` (parameters, or updates shaped like them)."""
  return jax.tree_util.tree_map_with_path(lambda key_path, _: _decays(path_str(key_path)), tree)


def _per_leaf(tree: Any, value: Callable[[str], Any]) -> Any:
  """`value(path)` for every array of `tree`; for stacked blocks, one per layer unless they agree."""

  def leaf(key_path, x):
    values = [value(path) for path in layer_ids.per_block_paths(path_str(key_path), x.shape)]
    if all(v == values[0] for v in values):
      return values[0]
    return np.reshape(values, (-1,) + (1,) * (len(x.shape) - 1))

  return jax.tree_util.tree_map_with_path(leaf, tree)


def _first_match(groups: tuple[tuple[str, float], ...], path: str, default: float = 1.0) -> float:
  return next((mult for regex, mult in groups if re.search(regex, path)), default)


def scales_updates(optim: ml_collections.ConfigDict) -> bool:
  """Whether some update may be multiplied by other than 1 (lr_mults or layer_decay set)."""
  return bool(optim.lr_mults) or optim.layer_decay is not None


def lr_multipliers(optim: ml_collections.ConfigDict, num_layers: int, tree: Any) -> Any:
  """The multiplier of each parameter's update, its decoupled weight decay included (as timm's
  lr_scale and torch's per-group learning rate, which AdamW's decay is multiplied by; big_vision's
  lr_mults leave its weight decay alone): its lr_mults entry times layer_decay^(L + 1 - id), id the
  parameter's `layer_ids.layer_id` in a model of L = `num_layers` blocks (read with layer_decay only).
  """

  def multiplier(path):
    mult = _first_match(optim.lr_mults, path)
    if optim.layer_decay is not None:
      mult *= optim.layer_decay ** (num_layers + 1 - layer_ids.layer_id(path, num_layers))
    return mult

  return _per_leaf(tree, multiplier)


def wd_multipliers(optim: ml_collections.ConfigDict, tree: Any) -> Any:
  """The multiplier of each parameter's weight decay: its wd_mults entry, any parameter's (as
  big_vision's wd_mults: `(('posembed_input', 1.0),)` decays the position embeddings), else 1 for
  kernels and 0 for the rest."""
  return _per_leaf(tree, lambda path: _first_match(optim.wd_mults, path, float(_decays(path))))


def scale_by_lr_multipliers(
    optim: ml_collections.ConfigDict, num_layers: int
) -> optax.GradientTransformation:
  """Each update times its `lr_multipliers` value (stateless; updates at 1 are left as they are)."""

  def scale(updates, params):
    del params  # The updates name the parameters just as well.
    return jax.tree.map(
        lambda u, m: u if np.all(m == 1) else u * jnp.asarray(m, u.dtype),
        updates,
        lr_multipliers(optim, num_layers, updates),
    )

  return optax.stateless(scale)


def add_decayed_weights(optim: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """Adds optim.weight_decay times each parameter, times its `wd_multipliers` value, to its
  update."""
  if not optim.wd_mults:  # optax's own, as optax.adamw and optax.lion chain it.
    return optax.add_decayed_weights(optim.weight_decay, mask=kernels_only)

  def add(update, param, mult):
    if np.all(mult == 0):
      return update
    return update + jnp.asarray(optim.weight_decay * mult, update.dtype) * param

  def decay(updates, params):
    return jax.tree.map(add, updates, params, wd_multipliers(optim, params))

  return optax.stateless(decay)


def freezes(optim: ml_collections.ConfigDict, model_config: dict[str, Any]) -> bool:
  """Whether some parameter of the model of `model_config` may be frozen."""
  return bool(optim.frozen) or optim.trained is not None or lora.enabled(model_config)


def frozen_labels(optim: ml_collections.ConfigDict, tree: Any) -> Any:
  """FROZEN or TRAINED for each array of `tree`; one-line error for stacked blocks frozen in part."""
  trained = freezing.trained_regexes(optim, tree)
  frozen = _per_leaf(tree, functools.partial(freezing.is_frozen, optim, trained))
  field = 'config.optim.frozen' if optim.frozen else 'config.optim.trained'

  def label(key_path, is_frozen):
    if isinstance(is_frozen, np.ndarray):
      raise ValueError(
          f'{field} freezes some blocks of {path_str(key_path)} but not all, and the '
          'scanned model (config.model.scan) trains them as one array: freeze all blocks or none, or '
          'set --config.model.scan=False'
      )
    return FROZEN if is_frozen else TRAINED

  return jax.tree_util.tree_map_with_path(label, frozen)


def labeller(
    optim: ml_collections.ConfigDict, model_config: dict[str, Any]
) -> Callable[[Any], Any] | None:
  """`frozen_labels` of optim for the parameters of a model of `model_config` (its resolved fields);
  None when every parameter trains."""
  if not freezes(optim, model_config):
    return None
  return functools.partial(frozen_labels, optim)


def trained_part(tree: Any, frozen_labels: Callable[[Any], Any] | None) -> Any:
  """`tree` less the arrays that `frozen_labels(tree)` (`labeller`'s; None: none frozen) labels
  FROZEN: `optax.MaskedNode()` in their places, as optax's masked optimizer states hold them."""
  if frozen_labels is None:
    return tree
  return jax.tree.map(
      lambda x, label: optax.MaskedNode() if label == FROZEN else x, tree, frozen_labels(tree)
  )


def with_trained(part: Any, tree: Any) -> Any:
  """`tree` with the arrays of `part` (a `trained_part`) in their places."""
  left_out = lambda x: isinstance(x, optax.MaskedNode)
  return jax.tree.map(lambda p, x: x if left_out(p) else p, part, tree, is_leaf=left_out)


def labelled(optim: ml_collections.ConfigDict, tree: Any) -> list[tuple[str, Any, bool]]:
  """(path, array, whether it trains) for each array of `tree`, by `frozen_labels`."""
  labels = jax.tree.leaves(frozen_labels(optim, tree))
  return [
      (path_str(path), x, label == TRAINED)
      for (path, x), label in zip(jax.tree_util.tree_leaves_with_path(tree), labels)
  ]


def freeze(
    tx: optax.GradientTransformation,
    optim: ml_collections.ConfigDict,
    model_config: dict[str, Any],
) -> optax.GradientTransformation:
  """`tx` for the parameters that train; the frozen ones get zero updates and keep no state."""
  labels = labeller(optim, model_config)
  if labels is None:
    return tx
  return optax.multi_transform({TRAINED: tx, FROZEN: optax.set_to_zero()}, labels)


def _check_regex(field: str, regex: Any, example: str) -> None:
  if not isinstance(regex, str):
    raise ValueError(f'config.{field}={regex!r} must be a regex string, e.g. {example}')
  try:
    re.compile(regex)
  except re.error as e:
    raise ValueError(
        f'config.{field}={regex!r} is not a valid regex ({e}): fix it, e.g. ' f'{example}'
    ) from None


def _check_groups(field: str, groups: Any, example: str, *, positive: bool) -> None:
  """(regex, multiplier) pairs; multipliers finite and >= 0 (> 0 if `positive`)."""
  bound = '> 0 (config.optim.frozen freezes parameters)' if positive else '>= 0'
  for i, entry in enumerate(groups):
    name = f'optim.{field}[{i}]'
    if not (
        isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[1], (int, float))
    ):
      raise ValueError(
          f'config.{name}={entry!r} must be a (regex, multiplier) pair, e.g. {example}'
      )
    _check_regex(name, entry[0], example)
    mult = entry[1]
    if not math.isfinite(mult) or mult < 0 or (positive and mult == 0):
      raise ValueError(
          f'config.{name}={tuple(entry)!r}: the multiplier must be {bound}, e.g. {example}'
      )


def check_config(optim: ml_collections.ConfigDict) -> None:
  """One-line errors for malformed lr_mults, wd_mults, frozen or layer_decay; needs no parameters."""
  _check_groups('lr_mults', optim.lr_mults, "(('head', 10.0),)", positive=True)
  _check_groups('wd_mults', optim.wd_mults, "(('head', 0.0),)", positive=False)
  for i, regex in enumerate(optim.frozen):
    if regex == '':  # pylint: disable=g-explicit-bool-comparison  # `--config.optim.frozen=`.
      raise ValueError(
          f"config.optim.frozen[{i}]='' matches every parameter, freezing them all: give "
          "patterns, e.g. ('^embedding/',), or leave it empty: --config.optim.frozen='()'"
      )
    _check_regex(f'optim.frozen[{i}]', regex, "('^embedding/', 'Transformer/posembed_input')")
  if optim.trained is not None:
    if isinstance(optim.trained, str):
      raise ValueError(
          f'config.optim.trained={optim.trained!r} must be a tuple of regexes, e.g. "(\'^head\',)"'
      )
    for i, regex in enumerate(optim.trained):
      _check_regex(f'optim.trained[{i}]', regex, "('^head', 'LayerNorm')")
  if optim.layer_decay is not None and not 0 < optim.layer_decay <= 1:
    raise ValueError(
        f'config.optim.layer_decay={optim.layer_decay} must be in (0, 1], e.g. 0.75 ' '(unset: off)'
    )


def names_parameters(optim: ml_collections.ConfigDict) -> bool:
  """Whether config.optim has regexes over parameter paths, which `check_param_groups` must see."""
  return bool(optim.lr_mults or optim.wd_mults or optim.frozen or optim.trained)


def check_param_groups(
    optim: ml_collections.ConfigDict, model_config: dict[str, Any], params: Any
) -> None:
  """One-line errors for parameter groups that do not fit the model: a regex of lr_mults, wd_mults or
  frozen that matches no parameter (a typo), or frozen blocks that a scanned model stacks with
  trained ones. `params`: the model's parameters, or their shapes (`jax.eval_shape` of its init)."""
  paths = [
      path
      for key_path, x in jax.tree_util.tree_leaves_with_path(params)
      for path in layer_ids.per_block_paths(path_str(key_path), x.shape)
  ]
  regexes = [('lr_mults', regex) for regex, _ in optim.lr_mults]
  regexes += [('wd_mults', regex) for regex, _ in optim.wd_mults]
  regexes += [('frozen', regex) for regex in optim.frozen]
  regexes += [('trained', regex) for regex in optim.trained or ()]
  for field, regex in regexes:
    if not any(re.search(regex, path) for path in paths):
      raise ValueError(
          f'config.optim.{field} regex {regex!r} matches no parameter: fix it (parameter '
          f'paths look like {", ".join(paths[::max(len(paths) // 3, 1)][:3])})'
      )
  if freezes(optim, model_config) and model_config.get('scan'):  # Only a ViT has the field.
    stack = functools.partial(scan_layout.stack_blocks, num_layers=model_config['num_layers'])
    frozen_labels(optim, jax.eval_shape(stack, params))
