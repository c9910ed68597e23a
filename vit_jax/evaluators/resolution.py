"""An evaluator at another image size or patch size than the run's (`config.evals.X.image_size` /
`patch_size`: a classifier's split metrics, few-shot and k-NN of any task's features): its config and
model, whose steps fit the parameters to them as the model runs (patch_embedding.fitted_to_images),
as fine-tuning to that size fits them once on the host.
"""

from typing import Any

import ml_collections

from vit_jax.checkpoints import adapting
from vit_jax.evaluators.base import Context, whole_number
from vit_jax.models import variants


def is_sized(fields: ml_collections.ConfigDict) -> bool:
  """Whether an evaluator's fields set its own image or patch size."""
  return fields.get('image_size') is not None or fields.get('patch_size') is not None


def fits_as_it_runs(context: Context, sized: bool) -> bool:
  """Whether an evaluator's step must fit the run's parameters to its model as it runs
  (patch_embedding.fitted_to_images): it measures another image or patch size (`sized`), or the run
  keeps its parameters at other shapes than its model reads (adapting.keeps_own_shapes: FlexiViT's).
  """
  return sized or adapting.keeps_own_shapes(context.config)


def at_resolution(
    name: str,
    config: ml_collections.ConfigDict,
    fields: ml_collections.ConfigDict,
    context: Context,
) -> tuple[ml_collections.ConfigDict, Any]:
  """`config` and the run's model reading images of the evaluator's `image_size` cut into patches of
  its `patch_size` (a classifier's; the patches a ViT's), to which its eval step, wrapped in
  patch_embedding.fitted_to_images, fits the position embeddings and the patch embedding; a one-line
  ValueError for a size the patches do not divide."""
  given = 'image_size' if fields.get('image_size') is not None else 'patch_size'
  if context.config.task != 'classification':
    raise ValueError(
        f'Evaluator {name!r}: {given} evaluates a classifier at another resolution, and '
        f'config.task={context.config.task!r}: drop config.evals.{name}.{given}'
    )
  config, model_config = sized(name, config, fields, context)
  if model_config.get('patch_size') == context.model_config.get('patch_size'):
    return config, context.model
  return config, context.model.clone(patch_size=model_config['patch_size'])


def sized(
    name: str,
    config: ml_collections.ConfigDict,
    fields: ml_collections.ConfigDict,
    context: Context,
) -> tuple[ml_collections.ConfigDict, dict[str, Any]]:
  """`config` at the evaluator's `image_size` and the run's model fields with its `patch_size` (a
  ViT's), unset ones the run's: the model of any task that the parameters fit as it runs
  (patch_embedding.fitted_to_images); a one-line ValueError for a size the patches do not divide."""
  image_size, patch_size = fields.get('image_size'), fields.get('patch_size')
  model_config = dict(context.model_config)
  if patch_size is not None:
    if 'patch_size' not in model_config:
      raise ValueError(
          f'Evaluator {name!r}: patch_size is for a ViT, and {config.variant} has no patches: '
          f'drop config.evals.{name}.patch_size'
      )
    if not whole_number(patch_size):
      raise ValueError(
          f'Evaluator {name!r}: patch_size={patch_size!r} must be a whole number of pixels, e.g. '
          f'{2 * model_config["patch_size"]}'
      )
    model_config['patch_size'] = patch_size
  stride = variants.stride_of(config.variant, model_config)
  size = config.image_size if image_size is None else image_size
  if not whole_number(size, stride) or size % stride:
    patches = config.variant if patch_size is None else f'patch_size={patch_size}'
    example = (
        2 * context.config.image_size
        if patch_size is None
        else stride * max(1, config.image_size // stride)
    )
    raise ValueError(
        f'Evaluator {name!r}: image_size={size!r} must be a multiple of the patch size {stride} '
        f'(in input pixels) of {patches}, e.g. {example}'
    )
  config = config.copy_and_resolve_references()
  config.image_size = size
  return config, model_config
