"""What the self-supervised tasks (mpp.py, mae.py) check alike: each has a config section of its own,
which another task would ignore, and learns a ViT backbone, without a classifier's parts, from the
images alone."""

from typing import Any, Mapping

import ml_collections

from vit_jax import defaults
from vit_jax.models import variants
from vit_jax.tasks import mixing


def check(config: ml_collections.ConfigDict, task: str, what: str) -> bool:
  """One-line ValueErrors for a run of another task that sets config.<task> (`what` it shapes), and
  for a run of `task` with a BiT, a distillation teacher or batch mixing. Returns whether the run is
  one of `task`'s (its own checks follow)."""
  if config.task != task:
    changed = defaults.changed(config, task)
    if changed:
      raise ValueError(
          f'config.{task}.{changed[0]}={config[task][changed[0]]!r} shapes {what}, and '
          f'config.task={config.task!r}: set --config.task={task}, or leave config.{task} as it is'
      )
    return False
  variants.require_vit(config.variant, f"config.task={task!r} (masked patches of a ViT's tokens)")
  if config.distill.teacher:
    raise ValueError(
        "config.distill.teacher distils a classifier's predictions, which "
        f'config.task={task!r} has not: unset it, or set --config.task=classification'
    )
  if mixing.enabled(config.mix):
    raise ValueError(
        f'config.task={task} has no labels to mix: set config.mix.mixup_alpha and '
        'config.mix.cutmix_alpha to 0'
    )
  return True


def check_backbone(task: str, model: Mapping[str, Any]) -> None:
  """One-line ValueErrors for the classifier's parts beyond the backbone in the resolved model fields
  `model` (mpp.CLASSIFIER_FIELDS), which the task's model has not."""
  if model['representation_size'] is not None:
    raise ValueError(
        f'config.task={task} predicts from patch tokens and has no pre-logits layer: unset '
        'config.model.representation_size'
    )
  if model['classifier'] == 'map':
    raise ValueError(
        f'config.task={task} pools no tokens as it trains, so a MAP head would stay untrained (and '
        'missing from the features few-shot and k-NN read): set config.model.classifier to token, '
        'gap or token_gap'
    )
  if model['head_dropout_rate']:
    raise ValueError(
        f'config.task={task} has no classifier head to drop the features of: set '
        'config.model.head_dropout_rate=0 (or use model.dropout_rate)'
    )
  if model['distilled']:
    raise ValueError(
        f'config.task={task} has no teacher, so a distillation token would learn nothing: set '
        'config.model.distilled=False'
    )
  if model['head_bias_init']:
    raise ValueError(
        f'config.task={task} has no classifier head to start the bias of: set '
        'config.model.head_bias_init=0'
    )
  if model['patch_dropout']:
    chosen = 'hides (config.mae.mask_ratio)' if task == 'mae' else 'corrupts (config.mpp)'
    raise ValueError(
        f'config.task={task} chooses the patches it {chosen} itself: set '
        'config.model.patch_dropout=0'
    )
