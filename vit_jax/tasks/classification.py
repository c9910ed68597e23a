"""Image classification: the variant's classifier (a ViT or a BiT), softmax or sigmoid cross-entropy
or the asymmetric loss, top-1 / top-5."""

import functools
import math
from typing import Any, Callable, Mapping, Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.data import on_device
from vit_jax.models import variants
from vit_jax.tasks import distillation, mixing

# One class would train to a loss of 0 and a top-1 of 100% and learn nothing.
MIN_CLASSES = 2
METRICS = ('top1', 'top5', 'loss')  # Label sets' add 'map' (evaluators/split.py).


def _sigmoid_xent(logits: jax.Array, targets: jax.Array) -> jax.Array:
  return optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1)


# config.asl's fields where unset: the ASL paper's and timm's.
ASL_DEFAULTS = {'gamma_neg': 4.0, 'gamma_pos': 1.0, 'clip': 0.05}
# timm's: probabilities are clamped to it before their log.
_ASL_EPS = 1e-8


def asl_settings(config: ml_collections.ConfigDict) -> dict[str, float]:
  """config.asl with ASL_DEFAULTS where unset."""
  return {
      k: default if config.asl[k] is None else config.asl[k] for k, default in ASL_DEFAULTS.items()
  }


def _asl(
    logits: jax.Array, targets: jax.Array, *, gamma_neg: float, gamma_pos: float, clip: float
) -> jax.Array:
  """The asymmetric loss (Ridnik et al. 2021, timm's AsymmetricLossMultiLabel) summed over the
  classes: the sigmoid cross-entropy of each class, a negative's probability 1 - p shifted up by `clip`
  (to at most 1), weighed by (1 - p_t)^gamma (gamma_pos for a positive, gamma_neg for a negative),
  gradients through the weights too (timm's default). 1 - p is sigmoid(-logits) and the logs are
  log-sigmoids, not 1 - sigmoid(logits) and its log as timm's (which computes in float32 whatever
  its input): a confident logit keeps its loss (timm's float32 1 - sigmoid(17) is 0, clamped to its
  eps: 18.42 where the loss is 17)."""
  p = jax.nn.sigmoid(logits)
  log_eps = math.log(_ASL_EPS)
  if clip > 0:
    p_neg = jnp.minimum(jax.nn.sigmoid(-logits) + clip, 1.0)
    log_neg = jnp.log(p_neg)  # At least log(clip).
  else:
    log_neg = jnp.maximum(jax.nn.log_sigmoid(-logits), log_eps)
  log_pos = jnp.maximum(jax.nn.log_sigmoid(logits), log_eps)
  loss = targets * log_pos + (1 - targets) * log_neg
  if gamma_neg > 0 or gamma_pos > 0:
    gamma = gamma_pos * targets + gamma_neg * (1 - targets)
    # 1 - p_t: a positive's 1 - p, a negative's 1 - p_neg.
    miss = targets * jax.nn.sigmoid(-logits) + (1 - targets) * jnp.maximum(p - clip, 0.0)
    # x^0 is 1 with a gradient of 0 (torch's pow), also at x = 0 where jnp.power's is NaN.
    loss = loss * jnp.where(gamma == 0, 1.0, miss) ** gamma
  return -loss.sum(-1)


PerExampleLoss = Callable[[jax.Array, jax.Array], jax.Array]
# config.loss -> (config -> the loss of each example [b] from logits and targets [b, classes]); the
# sigmoid ones are summed over the classes, as big_vision's (timm's BinaryCrossEntropy with
# sum_classes=True; its default is their mean, 1 / classes of ours).
LOSSES: dict[str, Callable[[ml_collections.ConfigDict], PerExampleLoss]] = {
    'softmax_xent': lambda config: optax.softmax_cross_entropy,
    'sigmoid_xent': lambda config: _sigmoid_xent,
    'asl': lambda config: functools.partial(_asl, **asl_settings(config)),
}
# The losses that score each class on its own: their probabilities are each class's sigmoid, and they
# train on label sets.
SIGMOID_LOSSES = ('sigmoid_xent', 'asl')


def loss_of_examples(config: ml_collections.ConfigDict) -> PerExampleLoss:
  """config.loss's loss of each example."""
  return LOSSES[config.loss](config)


def check(config: ml_collections.ConfigDict) -> None:
  if config.loss not in LOSSES:
    raise ValueError(f'Unknown config.loss {config.loss!r}: use one of {", ".join(LOSSES)}')
  _check_asl(config)
  if not 0.0 <= config.label_smoothing < 1.0:
    raise ValueError(f'config.label_smoothing={config.label_smoothing} must be in [0, 1), e.g. 0.1')
  mixing.check(config.mix)
  distillation.check(config)


def _check_asl(config: ml_collections.ConfigDict) -> None:
  for field, value in config.asl.items():
    if value is None:
      continue
    if config.loss != 'asl':
      raise ValueError(
          f'config.asl.{field}={value} shapes the asymmetric loss, and config.loss='
          f'{config.loss!r} is another: set --config.loss=asl, or unset config.asl.{field}'
      )
    upper = 1.0 if field == 'clip' else math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < upper:
      raise ValueError(
          f'config.asl.{field}={value} must be a number >= 0'
          + (' and < 1' if field == 'clip' else '')
          + f' (unset: {ASL_DEFAULTS[field]})'
      )


def features_model(config: ml_collections.ConfigDict, model_config: Mapping[str, Any]) -> nn.Module:
  """The classifier without its head: images -> pre-logits features (few-shot, pictures)."""
  return make_model(config, model_config, None)


def make_model(
    config: ml_collections.ConfigDict, model_config: Mapping[str, Any], num_classes: int | None
) -> nn.Module:
  """The classifier of `config.variant` with its resolved fields `model_config`
  (`variants.get_model_config`); `num_classes=None`: pre-logits features instead of logits."""
  return variants.build(
      config.variant, model_config, num_classes=num_classes, dtype=jnp.dtype(config.dtype)
  )


def compute_loss(
    logits: jax.Array, labels: jax.Array, *, loss: PerExampleLoss, label_smoothing: float = 0.0
) -> jax.Array:
  """Mean loss over the batch of float32 `logits` [b, classes] against integer `labels` [b] or label
  sets (multi-hot bool [b, classes]), smoothed by `label_smoothing`, or float targets [b, classes]
  taken as they are (mixing smooths the one-hots before it mixes them, as timm does)."""
  chex.assert_rank(logits, 2)
  if jnp.issubdtype(labels.dtype, jnp.integer) or labels.dtype == jnp.bool_:
    targets = mixing.one_hot_targets(labels, logits.shape[-1], label_smoothing)
    chex.assert_equal_shape([targets, logits])
  else:
    chex.assert_shape(labels, logits.shape)
    targets = labels
  return loss(logits, targets).mean()


def make_loss(
    config: ml_collections.ConfigDict, model: nn.Module, teacher: nn.Module | None = None
) -> Callable[..., jax.Array]:
  """loss(params, images, labels, key[, teacher_params]) -> the mean loss of the batch, for the train
  step; labels are integers, or the soft targets of `mix`. With a `teacher` (config.distill), DeiT's
  distillation loss (distillation.py) of the student's two heads, the teacher's parameters last."""

  def loss_fn(
      params: Any,
      images: jax.Array,
      labels: jax.Array,
      key: jax.Array,
      teacher_params: Any = None,
  ) -> jax.Array:
    apply = functools.partial(
        model.apply, {'params': params}, images, train=True, rngs={'dropout': key}
    )
    if teacher is None:
      return compute_loss(
          apply(), labels, loss=loss_of_examples(config), label_smoothing=config.label_smoothing
      )
    # A ViT returns its class and distillation heads' logits (the class head's twice without a
    # distillation token); a BiT has one head.
    logits, distilled = apply(both_heads=True) if hasattr(model, 'distilled') else (apply(),) * 2
    teacher_images = distillation.teacher_input(images, distillation.teacher_image_size(config))
    teacher_logits = teacher.apply({'params': teacher_params}, teacher_images, train=False)
    base = compute_loss(
        logits, labels, loss=loss_of_examples(config), label_smoothing=config.label_smoothing
    )
    return distillation.combine(config.distill, base, distilled, teacher_logits)

  return loss_fn


def tensor_split(config: ml_collections.ConfigDict) -> dict[str, int]:
  """Nothing beyond the variant's: its head stays whole on every device."""
  del config
  return {}


def mix(config: ml_collections.ConfigDict, num_classes: int) -> mixing.MixFn | None:
  """The train step's Mixup / CutMix of `config.mix` (None: off)."""
  if not mixing.enabled(config.mix):
    return None
  return mixing.make(config.mix, num_classes, config.label_smoothing)


def label_sets(batch: dict[str, jax.Array], num_classes: int) -> jax.Array:
  """A batch's label sets, multi-hot bool [b, num_classes]: its 'labels', or its single 'label's as
  sets of one."""
  if 'labels' in batch:
    return batch['labels']
  chex.assert_rank(batch['label'], 1)
  return batch['label'][:, None] == jnp.arange(num_classes)


def label_set_hits(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
  """Sums over the examples of `mask` with a label in their set (multi-hot bool `labels` [b, classes]):
  top-1 / any of top-5 in the set, and 'labelled', their count; an empty set counts nowhere (ReaL's
  unlabelled images)."""
  chex.assert_equal_shape([logits, labels])
  labelled = mask & jnp.any(labels, axis=-1)
  top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
  hits = jnp.take_along_axis(labels, top5, axis=-1) & labelled[:, None]
  return {
      'correct': jnp.sum(hits[:, 0]),
      'correct_top5': jnp.sum(jnp.any(hits, axis=-1)),
      'labelled': jnp.sum(labelled),
  }


def make_eval_step(
    config: ml_collections.ConfigDict,
    model: nn.Module,
    classes: Optional[Sequence[int]] = None,
) -> Callable[[Any, dict[str, jax.Array]], dict[str, Any]]:
  """eval_step(params, batch) -> sums over the real (unmasked) examples of a batch: correct top-1 /
  top-5, the run's loss (config.loss, unsmoothed), count. For label sets ('labels', multi-hot), top-1 /
  top-5 is a class of the set, over the examples with one ('labelled'), and 'rows' holds every row's
  logits, labels and mask, for the mean average precision.

  `classes`: the model's classes that the batch's labels 0, 1, ... are (a dataset of some of the run's
  classes, as ImageNet-R and -A of ImageNet's 1000): every metric is of the logits of those alone.
  """
  class_ids = None if classes is None else jnp.asarray(classes, jnp.int32)

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, Any]:
    logits = model.apply({'params': params}, on_device.model_input(batch['image']), train=False)
    if class_ids is not None:
      logits = logits[:, class_ids]
    mask = batch['mask']
    sets = label_sets(batch, logits.shape[-1])
    sums = {
        **label_set_hits(logits, sets, mask),
        'loss_sum': jnp.sum(loss_of_examples(config)(logits, sets.astype(jnp.float32)) * mask),
        'count': jnp.sum(mask),
    }
    if 'labels' in batch:
      sums['rows'] = {'logits': logits, 'labels': sets, 'mask': mask}
    return sums

  return eval_step
