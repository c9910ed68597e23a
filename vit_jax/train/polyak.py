"""The Polyak (exponential moving) average of the parameters (config.polyak_decay).

Only the parameters that train are averaged: a frozen one's average is itself, so the state keeps
`optax.MaskedNode()` in its place (as optax's masked optimizer states do) rather than a second copy of
a frozen backbone (a low-rank adaptation of ViT-g would otherwise hold 1B floats more for 3M that
move). `averaged` puts the frozen parameters back wherever the average is evaluated or exported.
"""

from typing import Any, Callable

import jax
import optax

from vit_jax.train import param_groups


def _left_out(x: Any) -> bool:
  return isinstance(x, optax.MaskedNode)


def init(params: Any, frozen_labels: Callable[[Any], Any] | None) -> Any:
  """The average before the first step: `params`, less those that `frozen_labels(params)`
  (`param_groups.labeller`'s; None: none frozen) labels FROZEN."""
  if frozen_labels is None:
    return params
  return jax.tree.map(
      lambda x, label: optax.MaskedNode() if label == param_groups.FROZEN else x,
      params,
      frozen_labels(params),
  )


def update(
    average: Any, params: Any, frozen_labels: Callable[[Any], Any] | None, decay: float
) -> Any:
  """The average after a step that gave `params`."""
  return optax.incremental_update(init(params, frozen_labels), average, step_size=1.0 - decay)


def averaged(average: Any, params: Any) -> Any:
  """The parameters the average stands for: its arrays, and `params`' where it keeps none."""
  return jax.tree.map(lambda a, x: x if _left_out(a) else a, average, params, is_leaf=_left_out)
