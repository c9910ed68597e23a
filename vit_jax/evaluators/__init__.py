"""Evaluators: what the loop measures on the parameters while it trains.

Each is built and validated in setup (before anything is compiled) from a config dict and called by
the loop every `every_steps` steps and at the last step, on the raw parameters and, with Polyak
averaging, on their average too; its metrics are logged as `<name>_<metric>` and
`<name>_polyak_<metric>`. A run has
  eval           the task's metrics (top1, top5, loss; map for label sets) on config.eval_split every
                 config.eval_every_steps;
  fewshot        linear few-shot accuracy from config.fewshot, when config.fewshot.every_steps is set;
  knn            DINO's weighted k-NN accuracy from config.knn, when config.knn.every_steps is set;
  config.evals   any number more, name -> dict(type=<a key of EVALUATORS>, every_steps=N, ...), e.g.
                 config.evals.minival = dict(type='classification', split='train[98%:]', every_steps=500),
                 config.evals.real = dict(type='real', every_steps=500) (ImageNet-ReaL),
                 config.evals.teacher = dict(type='teacher', split='test', every_steps=500) (the
                 distillation teacher's, measured once); a name is
                 none of the built-in ones, nor train (the loop's train_loss), nor ends in _polyak.

Adding an evaluator is one module with a `build(name, settings, context)` and one entry in EVALUATORS.
"""

from typing import Callable

import ml_collections

from vit_jax import tasks
from vit_jax.evaluators import fewshot, knn, real, split, teacher
from vit_jax.evaluators.base import Context, Evaluator, measures_average

Builder = Callable[[str, ml_collections.ConfigDict, Context], Evaluator]
# The task's own metrics on a split, under the task's name; few-shot and k-NN on the backbone's
# features; ImageNet-ReaL's multi-label top-1; the distillation teacher's own metrics.
EVALUATORS: dict[str, Builder] = {
    **{name: split.build for name in tasks.TASKS},
    'fewshot': fewshot.build,
    'knn': knn.build,
    'real': real.build,
    'teacher': teacher.build,
}
_BUILT_IN = ('eval', 'fewshot', 'knn')
# Metric names are <name>_<metric>: an evaluator named 'train' would log train_loss over the loop's own
# train_loss, and one named '<other>_polyak' <other>_polyak_top1 over the Polyak average's metrics of
# evaluator <other>, in the events and in the metrics the run returns.
_LOOP_PREFIX = 'train'
_POLYAK = '_polyak'


def settings(config: ml_collections.ConfigDict) -> dict[str, ml_collections.ConfigDict]:
  """Every evaluator of the run by name: the built-in ones from their fields, then config.evals."""
  named = {
      'eval': ml_collections.ConfigDict(
          dict(type=config.task, split=config.eval_split, every_steps=config.eval_every_steps)
      )
  }
  for name in ('fewshot', 'knn'):
    if config[name].every_steps is not None:
      named[name] = ml_collections.ConfigDict({'type': name, **config[name].to_dict()})
  for name, extra in config.get('evals', {}).items():
    if name in _BUILT_IN:
      raise ValueError(
          f'config.evals.{name}: {name!r} is a built-in evaluator ({", ".join(_BUILT_IN)}): '
          'give yours another name'
      )
    if name == _LOOP_PREFIX:
      raise ValueError(
          f'config.evals.{name}: its {name}_loss would overwrite the training loss the loop '
          f'logs as {name}_loss: give it another name, e.g. {name}_subset'
      )
    if name.endswith(_POLYAK):
      raise ValueError(
          f'config.evals.{name}: names ending in {_POLYAK} are those of the metrics of the '
          f'Polyak average (<evaluator>{_POLYAK}_top1...): give it another name'
      )
    if not isinstance(extra, ml_collections.ConfigDict) or 'type' not in extra:
      raise ValueError(
          f'config.evals.{name} must be a dict with a type (one of '
          f'{", ".join(EVALUATORS)}), e.g. dict(type="classification", split="test", '
          'every_steps=1000)'
      )
    named[name] = extra
  return named


def check_values(config: ml_collections.ConfigDict) -> None:
  """config.fewshot's and config.knn's values, also where their every_steps is unset: the fewshot tool
  takes them as its defaults for the run's checkpoints."""
  run = config.fewshot
  fewshot.check_values(run.shots, run.seeds, run.l2_reg, 'config.fewshot')
  knn.check_ks(config.knn.ks, config.knn.temperature, 'config.knn')


def metric_name(evaluator: str, metric: str, polyak: bool) -> str:
  """What the loop logs `metric` of `evaluator` as: of the parameters, or of their Polyak average."""
  return f'{evaluator}{_POLYAK if polyak else ""}_{metric}'


def logged_metrics(built: list[Evaluator], polyak: bool) -> dict[str, tuple[Evaluator, bool]]:
  """Every metric the run's evaluators log -> the evaluator that logs it, and whether it measures the
  Polyak average (with `polyak`, a run that keeps one, each metric is logged of both)."""
  return {
      metric_name(evaluator.name, metric, averaged): (evaluator, averaged)
      for evaluator in built
      for averaged in ((False, True) if polyak and measures_average(evaluator) else (False,))
      for metric in evaluator.metrics
  }


def make_evaluators(context: Context) -> list[Evaluator]:
  """The run's evaluators; raises a one-line ValueError naming the config field to fix."""
  built = []
  for name, fields in settings(context.config).items():
    if fields.type not in EVALUATORS:
      raise ValueError(
          f'Unknown evaluator type {fields.type!r} of {name!r}: use one of '
          f'{", ".join(EVALUATORS)}'
      )
    built.append(EVALUATORS[fields.type](name, fields, context))
  return built
