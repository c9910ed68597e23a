"""ImageNet-ReaL (Beyer et al. 2020, "Are we done with ImageNet?"): a prediction is right when it is in
the image's set of reassessed labels; images the raters gave no label are skipped, as in the paper.

    config.evals.real = dict(type='real', every_steps=1000)  # tfds imagenet2012_real, validation

It reads any tfds dataset whose label feature has the run's classes: a Sequence of ClassLabel (label
sets), or a ClassLabel (sets of one, so top-1 is the usual one).
"""

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax import data
from vit_jax.data import on_device
from vit_jax.evaluators import resolution, split
from vit_jax.evaluators.base import Context, check_fields
from vit_jax.models import patch_embedding
from vit_jax.tasks import classification

DEFAULTS = {'dataset': 'imagenet2012_real', 'split': 'validation', 'label_feature': 'real_label'}


def eval_step(
    params: Any, batch: dict[str, jax.Array], *, model: nn.Module
) -> dict[str, jax.Array]:
  """Sums over the unmasked examples with a label: top-1 / any of top-5 in the label set, and their
  count ('labelled'); 'count', the unmasked examples."""
  logits = model.apply({'params': params}, on_device.model_input(batch['image']), train=False)
  labels = classification.label_sets(batch, logits.shape[-1])
  return {
      **classification.label_set_hits(logits, labels, batch['mask']),
      'count': jnp.sum(batch['mask']),
  }


def build(name: str, fields: ml_collections.ConfigDict, context: Context) -> split.SplitEvaluator:
  check_fields(name, fields, ('every_steps',), ('dataset', 'data_dir', 'split', 'label_feature'))
  if context.config.task != 'classification':
    raise ValueError(
        f'Evaluator {name!r} of type {fields.type!r} measures a classifier, but '
        f'config.task={context.config.task!r}: drop config.evals.{name}'
    )
  settings = {**DEFAULTS, **{k: v for k, v in fields.items() if v is not None}}
  config, _ = split.other_dataset(
      name,
      settings['dataset'],
      settings.get('data_dir'),
      context,
      settings['split'],
      settings['label_feature'],
  )
  split.require_examples(
      name,
      settings['split'],  # A split that does not exist fails here.
      data.num_examples(config, settings['split'], settings['label_feature']),
  )
  step = functools.partial(eval_step, model=context.model)
  if resolution.fits_as_it_runs(context, sized=False):
    step = patch_embedding.fitted_to_images(
        step, context.config.posemb_interpolation, context.config.patch_interpolation
    )
  return split.SplitEvaluator(
      name,
      fields.every_steps,
      config=config,
      split=settings['split'],
      eval_step=step,
      mesh=context.mesh,
      metrics=('top1', 'top5'),
      label_feature=settings['label_feature'],
  )
