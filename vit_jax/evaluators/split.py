"""The task's own metrics (top-1, top-5, loss) over every example of a split, e.g. the test split or a
minival held out of train."""
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh

from vit_jax import data, sharding
from vit_jax.evaluators.base import Context, check_fields


class SplitEvaluator:
  """Top-1, top-5 and loss of `eval_step`'s sums over one pass of `split` (eval preprocessing)."""

  def __init__(self, name: str, every_steps: int, *, config: ml_collections.ConfigDict, split: str,
               eval_step: Callable, model: Any, mesh: Mesh):
    self.name, self.every_steps = name, every_steps
    self._config, self._split, self._mesh = config, split, mesh
    self._eval_fn = jax.jit(functools.partial(eval_step, model=model))

  def __call__(self, params: Any) -> dict[str, float]:
    local_batch = self._config.eval_batch_size // jax.process_count()
    totals = None
    for batch in data.eval_iterator(self._config, self._split, local_batch_size=local_batch,
                                    process_index=jax.process_index(),
                                    process_count=jax.process_count()):
      sums = self._eval_fn(params, sharding.global_batch(batch, self._mesh))
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
    totals = jax.device_get(totals)
    count = max(float(totals['count']), 1.0)
    return {'top1': float(totals['correct']) / count, 'top5': float(totals['correct_top5']) / count,
            'loss': float(totals['loss_sum']) / count}


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> SplitEvaluator:
  check_fields(name, fields, ('split', 'every_steps'))
  if fields.type != context.config.task:
    raise ValueError(f'Evaluator {name!r} of type {fields.type!r} measures a {fields.type} model, but '
                     f'config.task={context.config.task!r}: use type={context.config.task!r}')
  context.count(fields.split)  # A split that does not exist fails here.
  return SplitEvaluator(name, fields.every_steps, config=context.config, split=fields.split,
                        eval_step=context.task.eval_step, model=context.model, mesh=context.mesh)
