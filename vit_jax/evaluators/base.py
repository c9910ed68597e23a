"""What every evaluator shares: its interface, what it is built from, the check of its fields."""

import dataclasses
from types import ModuleType
from typing import Any, Callable, Mapping, Optional, Protocol

import flax.linen as nn
import ml_collections
import numpy as np
from jax.sharding import Mesh

from vit_jax import data


class Evaluator(Protocol):
  name: str  # The prefix of its metrics.
  every_steps: int
  metrics: tuple[str, ...]  # The names of the metrics it returns, known when it is built.
  # Whether the loop measures the parameters' Polyak average too (an evaluator whose metrics do not
  # depend on the parameters sets it False); `measures_average` reads it, True where unset.

  def __call__(self, params: Any) -> dict[str, float]:
    """Metrics of `params` (in any layout the model applies), names without the prefix."""

  def close(self) -> None:
    """Ends the data worker processes it keeps between evaluations; a later call starts them."""


@dataclasses.dataclass(frozen=True)
class Context:
  """What evaluators are built from: the run's config, dataset, task, model, mesh and the model's
  resolved fields (`variants.get_model_config`); `teacher`, with config.distill.teacher, loads it
  (checkpoints/teacher.py's Teacher, once for the run)."""

  config: ml_collections.ConfigDict
  info: data.DatasetInfo
  task: ModuleType
  model: nn.Module
  mesh: Mesh
  model_config: Mapping[str, Any]
  teacher: Optional[Callable[[], Any]] = None

  def count(self, split: str) -> int:
    """Examples in `split`; the run's train and eval splits are already counted in `info`. A split
    that does not exist is a one-line ValueError."""
    counted = {
        self.config.train_split: self.info.num_train,
        self.config.eval_split: self.info.num_eval,
    }
    return counted[split] if split in counted else data.num_examples(self.config, split)


def check_fields(
    name: str,
    fields: ml_collections.ConfigDict,
    required: tuple[str, ...],
    optional: tuple[str, ...] = (),
) -> None:
  """Unknown fields of an evaluator's settings (typos) are errors, not silently ignored; so are missing
  required ones, which would otherwise surface as a bare AttributeError naming only the field."""
  unknown = sorted(set(fields) - {'type', *required, *optional})
  if unknown:
    raise ValueError(
        f'Evaluator {name!r} has no field {", ".join(unknown)}: its fields are type, '
        f'{", ".join((*required, *optional))}'
    )
  missing = [field for field in required if field not in fields]
  if missing:
    raise ValueError(
        f'Evaluator {name!r} needs {", ".join(missing)}: its required fields are '
        f'type, {", ".join(required)}' + (f' (optional: {", ".join(optional)})' if optional else '')
    )
  if not whole_number(fields.every_steps):
    raise ValueError(
        f'Evaluator {name!r}: every_steps={fields.every_steps} must be a number of steps '
        '>= 1' + (' (--config.eval_every_steps)' if name == 'eval' else '')
    )


def whole_number(value: Any, least: int = 1) -> bool:
  """Whether `value` is an integer (not a bool: True would count as 1) of at least `least`."""
  return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and value >= least


def measures_average(evaluator: Evaluator) -> bool:
  """Whether the loop also measures `evaluator` on the parameters' Polyak average, where it keeps one."""
  return getattr(evaluator, 'measures_average', True)
