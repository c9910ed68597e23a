"""The distillation teacher's own metrics on a split (config.distill.teacher; big_vision's distillation
configs evaluate theirs): the bar the student learns towards, and the check that the teacher was read
as it was trained (its input normalisation, its classes' order, its resolution), which a student
learning from a wrong teacher would not show until its own accuracy lags.

    config.evals.teacher = dict(type='teacher', split='validation', every_steps=10_000)

The teacher sees the split's eval crops (config.pp_eval) at its own size, distill.teacher_image_size.
It does not train: it is measured at its first evaluation, and each later one logs the same metrics,
of the parameters only (no _polyak twin).
"""

from typing import Any, Optional

import jax
import ml_collections

from vit_jax import sharding
from vit_jax.evaluators import split
from vit_jax.evaluators.base import Context, check_fields
from vit_jax.tasks import classification, distillation


class TeacherEvaluator:
  """`split`'s classification metrics of the teacher (`context.teacher()`: read once, for the run's
  step and this evaluator), measured at the first call and kept."""

  measures_average = False  # Its metrics do not depend on the parameters it is given.

  def __init__(
      self,
      name: str,
      every_steps: int,
      *,
      config: ml_collections.ConfigDict,
      split_name: str,
      context: Context,
  ):
    self.name, self.every_steps, self.metrics = name, every_steps, classification.METRICS
    self._config, self._split, self._context = config, split_name, context
    self._measured: Optional[dict[str, float]] = None

  def __call__(self, params: Any) -> dict[str, float]:
    del params  # The student's: the teacher's are fixed.
    if self._measured is None:
      teacher = self._context.teacher()
      mesh = self._context.mesh
      evaluator = split.SplitEvaluator(
          self.name,
          self.every_steps,
          config=self._config,
          split=self._split,
          eval_step=classification.make_eval_step(self._config, teacher.model),
          mesh=mesh,
          metrics=self.metrics,
      )
      shardings = sharding.state_shardings(jax.eval_shape(lambda: teacher.params), mesh)
      try:
        self._measured = evaluator(jax.device_put(teacher.params, shardings))
      finally:
        evaluator.close()
    return dict(self._measured)

  def close(self) -> None:
    pass  # Its data workers end with its one measurement.


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> TeacherEvaluator:
  check_fields(name, fields, ('split', 'every_steps'))
  if context.teacher is None:
    raise ValueError(
        f"Evaluator {name!r} of type 'teacher' measures config.distill.teacher, which is unset: "
        f'set --config.distill.teacher=WORKDIR (or a checkpoint) or drop config.evals.{name}'
    )
  split.require_examples(name, fields.split, context.count(fields.split))
  config = context.config.copy_and_resolve_references()
  config.image_size = distillation.teacher_image_size(config)
  return TeacherEvaluator(
      name, fields.every_steps, config=config, split_name=fields.split, context=context
  )
