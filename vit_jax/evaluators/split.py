"""The task's own metrics (top-1, top-5, loss) over every example of a split, e.g. the test split, a
minival held out of train, or a split of another dataset with the same classes (ImageNet-V2).

    config.evals.minival = dict(type='classification', split='train[98%:]', every_steps=1000)

Optional fields: `image_size` (default the run's): the images prepared at that size, the position
embeddings resized to its grid as the model runs (resolution.py, by config.posemb_interpolation), as
a ViT fine-tuned at one resolution is measured at a higher one (FixRes, DeiT III); `patch_size`
(default the run's): a ViT cutting patches of that size, its patch embedding resampled to it as the
model runs (FlexiViT's pseudo-inverse resize, by config.patch_interpolation), the position embeddings
to the new grid;
`dataset` and `data_dir` (default the run's), and `label_feature`, the tfds feature
whose classes it measures (default the run's, config.label_feature); they must be the run's classes,
or some of them named as the run names them (ImageNet-R's and ImageNet-A's 200 of ImageNet's 1000,
by WordNet id): the metrics are then of the logits of those classes alone, as those datasets are
measured.
"""

import math
from typing import Any, Callable, Optional, Sequence

from absl import logging
import jax
import jax.numpy as jnp
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax import data, sharding
from vit_jax.runtime import dispatch
from vit_jax.evaluators import average_precision, resolution
from vit_jax.evaluators.base import Context, check_fields
from vit_jax.models import patch_embedding
from vit_jax.tasks import classification

# A metric -> the sum of `eval_step` it is the mean of, and the count of examples it is over (absent:
# 'count'); an eval step returns some of them, and 'count'. Label sets count top-1 / top-5 over the
# examples with a label ('labelled').
METRIC_SUMS = {
    'top1': ('correct', 'labelled'),
    'top5': ('correct_top5', 'labelled'),
    'loss': ('loss_sum', 'count'),
}


class SplitEvaluator:
  """Means of `eval_step`'s sums (METRIC_SUMS) over one pass of `split` (eval preprocessing), its labels
  those of `label_feature` (None: the run's, config.label_feature); NaN where nothing was counted.
  Where `eval_step` returns 'rows' (label sets: every row's logits, labels and mask), also 'map', the
  mean average precision over the classes (average_precision.py) of the split's rows: they stay on the
  devices that computed them (none is fetched to a host), which then sort the rows of their share of
  the classes.

  Each example is counted once, whatever the split's size against the batch and the devices (padding
  rows are masked out). Top-1 / top-5 come from jax.lax.top_k, which puts the lower class index first
  among equal logits: on a tie top-1 is np.argmax's class (as sklearn's accuracy_score of the argmax),
  so all-equal logits (a zero head) score the share of class 0. sklearn's top_k_accuracy_score breaks
  ties towards the higher index instead. With fewer than 5 classes top-5 is 1.
  """

  def __init__(
      self,
      name: str,
      every_steps: int,
      *,
      config: ml_collections.ConfigDict,
      split: str,
      eval_step: Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]],
      mesh: Mesh,
      metrics: tuple[str, ...],
      label_feature: str | None = None,
  ):
    self.name, self.every_steps, self.metrics = name, every_steps, metrics
    self._split, self._mesh = split, mesh
    self._passes = data.eval_passes(
        config,
        split,
        local_batch_size=config.eval_batch_size // jax.process_count(),
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        label_feature=label_feature,
    )

    def sums_and_rows(params: Any, batch: dict[str, jax.Array]) -> tuple[dict, dict]:
      sums = dict(eval_step(params, batch))
      return sums, sums.pop('rows', {})

    # The sums replicated (each host reads every host's); the rows where their batch rows are.
    self._eval_fn = jax.jit(
        sharding.with_activation_sharding(sums_and_rows, mesh),
        out_shardings=(sharding.replicated(mesh), sharding.batch_sharding(mesh)),
    )
    by_class = NamedSharding(mesh, P(None, mesh.axis_names))  # Each device sorts its classes.
    self._map_fn = jax.jit(
        lambda logits, labels, mask: average_precision.mean_average_precision(
            jax.lax.with_sharding_constraint(logits, by_class),
            jax.lax.with_sharding_constraint(labels, by_class),
            mask,
        ),
        out_shardings=sharding.replicated(mesh),
    )

  def __call__(self, params: Any) -> dict[str, float]:
    totals, rows, in_flight = None, [], dispatch.BoundedDispatch()
    for batch in self._passes():
      sums, batch_rows = self._eval_fn(params, sharding.global_batch(batch, self._mesh))
      if batch_rows:
        rows.append(batch_rows)
      totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
      in_flight.add(totals)
    totals = jax.device_get(totals)
    metrics = {}
    for metric, (key, count_key) in METRIC_SUMS.items():
      if key in totals:
        count = float(totals.get(count_key, totals['count']))
        # E.g. ReaL on a split whose images have no labels: a mean of nothing, not 0.
        metrics[metric] = float(totals[key]) / count if count else math.nan
    if rows:
      metrics['map'] = float(
          self._map_fn(
              *(
                  sharding.rows_on_devices([batch[name] for batch in rows], self._mesh)
                  for name in ('logits', 'labels', 'mask')
              )
          )
      )
    if any(math.isnan(value) for value in metrics.values()):
      logging.warning(
          '%s: no example of %r counted for %s (unlabelled or unreadable): NaN',
          self.name,
          self._split,
          ', '.join(metric for metric, value in metrics.items() if math.isnan(value)),
      )
    return metrics

  def close(self) -> None:
    self._passes.close()


def subset_indices(names: Sequence[str], of: Sequence[str]) -> Optional[tuple[int, ...]]:
  """Where each of `names` (distinct) is in `of`, in the order of `names`; None unless all are."""
  where = {name: k for k, name in enumerate(of)}
  if len(set(names)) != len(names) or not all(name in where for name in names):
    return None
  return tuple(where[name] for name in names)


def other_dataset(
    name: str,
    dataset: str,
    data_dir: str | None,
    context: Context,
    split: str,
    label_feature: str | None = None,
    subset: bool = False,
) -> tuple[ml_collections.ConfigDict, Optional[tuple[int, ...]]]:
  """The run's config reading `split` of `dataset` (in `data_dir`, default the run's) instead, e.g.
  ImageNet-V2 beside ImageNet, and None; the classes of its `label_feature` (None: the run's) must be
  the run's, in the same order, or with `subset` some of the run's classes, named as the run names
  them, in any order (ImageNet-R's 200 of ImageNet's 1000): then their indices among the run's, not
  None. An image folder's classes are those of `split` (a folder as ImageNet-R is downloaded: no
  train/ beside it)."""
  config = context.config.copy_and_resolve_references()
  config.dataset = dataset
  config.data_dir = data_dir or config.data_dir
  config.train_split = split  # Where a source takes its classes from: it is read for `split` alone.
  names = data.class_names(config, label_feature)
  if names == context.info.class_names:
    return config, None
  classes = subset_indices(names, context.info.class_names) if subset else None
  if classes is None:
    raise ValueError(
        f'Evaluator {name!r}: dataset {dataset!r} has {len(names)} classes '
        f'({", ".join(names[:3])}...), not the run\'s {context.info.num_classes} '
        f'({", ".join(context.info.class_names[:3])}...) in the same order: evaluate on '
        'a dataset with the same label set'
        + (' or some of its classes, named as the run names them' if subset else '')
    )
  logging.info(
      "Evaluator %r: dataset %r has %d of the run's %d classes: it measures the logits of those",
      name,
      dataset,
      len(classes),
      context.info.num_classes,
  )
  return config, classes


def require_examples(name: str, split: str, count: int) -> None:
  """An evaluator of an empty split would stop the run at its first evaluation: say so at the start."""
  if count < 1:
    field = '--config.eval_split' if name == 'eval' else f'config.evals.{name}.split'
    raise ValueError(
        f'Evaluator {name!r}: split {split!r} has no examples: set {field} to a split ' 'with some'
    )


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> SplitEvaluator:
  check_fields(
      name,
      fields,
      ('split', 'every_steps'),
      ('dataset', 'data_dir', 'label_feature', 'image_size', 'patch_size'),
  )
  if fields.type != context.config.task:
    raise ValueError(
        f'Evaluator {name!r} of type {fields.type!r} measures a {fields.type} model, but '
        f'config.task={context.config.task!r}: use type={context.config.task!r}'
    )
  label_feature = fields.get('label_feature')  # None: the run's.
  classes = None  # The run's classes that the split's labels are; None: all, in order.
  # Another dataset, copy or labels: their classes must be the run's.
  if fields.get('dataset') or fields.get('data_dir') or label_feature:
    config, classes = other_dataset(
        name,
        fields.get('dataset') or context.config.dataset,
        fields.get('data_dir'),
        context,
        fields.split,
        label_feature,
        subset=context.config.task == 'classification',
    )
    # A single-label run's eval step takes one class an image.
    if label_feature and data.is_label_set(config, label_feature) and not context.info.multi_label:
      raise ValueError(
          f'Evaluator {name!r}: label_feature={label_feature!r} is a set of classes an '
          "image: measure it with type='real' (a prediction in the set is right)"
      )
    # A split that does not exist fails here.
    count = data.num_examples(config, fields.split, label_feature)
  else:
    config = context.config
    count = context.count(fields.split)
  require_examples(name, fields.split, count)
  model = context.model
  if resolution.is_sized(fields):
    config, model = resolution.at_resolution(name, config, fields, context)
  label_sets = (
      data.is_label_set(config, label_feature) if label_feature else context.info.multi_label
  )
  eval_step = (
      context.task.make_eval_step(config, model)
      if classes is None
      else classification.make_eval_step(config, model, classes)
  )
  sized = config.image_size != context.config.image_size or model is not context.model
  if resolution.fits_as_it_runs(context, sized):
    eval_step = patch_embedding.fitted_to_images(
        eval_step, config.posemb_interpolation, config.patch_interpolation
    )
  return SplitEvaluator(
      name,
      fields.every_steps,
      config=config,
      split=fields.split,
      eval_step=eval_step,
      mesh=context.mesh,
      metrics=(*context.task.METRICS, *(('map',) if label_sets else ())),
      label_feature=label_feature,
  )
