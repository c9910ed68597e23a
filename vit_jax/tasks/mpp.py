"""Masked patch prediction (paper Sec. 4.6): predict the mean colour of corrupted patches."""

from typing import Any, Callable, Mapping

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import optax

from vit_jax.data import on_device
from vit_jax.models.mpp import MaskedPatchPredictor, backbone_fields, colour_targets
from vit_jax.tasks import classification, mixing, self_supervised

# Its targets are the patches' colours, not the labels: an unlabelled folder (one class) will do.
MIN_CLASSES = 1
METRICS = ('top1', 'top5', 'loss')  # Of the colour classes.


# The loss of the colour classes: the only config.loss this task takes.
LOSS = 'softmax_xent'


def check(config: ml_collections.ConfigDict) -> None:
  if not 0.0 < config.mpp.mask_rate <= 1.0:
    raise ValueError(f'config.mpp.mask_rate={config.mpp.mask_rate} must be in (0, 1], e.g. 0.5')
  if not 1 <= config.mpp.num_bits <= 8:
    raise ValueError(
        f'config.mpp.num_bits={config.mpp.num_bits} must be in 1..8 bits per colour '
        'channel, e.g. 3'
    )
  # Every task checks every config; the rest is for this task's runs.
  if not self_supervised.check(config, 'mpp', 'masked patch prediction'):
    return
  if (
      config.loss != LOSS
  ):  # One colour class of many per patch: a softmax, never a multi-label loss.
    raise ValueError(
        f"config.task=mpp trains on the {LOSS} of the patches' colour classes, not "
        f'config.loss={config.loss!r}: set --config.loss={LOSS}'
    )


def features_model(config: ml_collections.ConfigDict, model_config: Mapping[str, Any]) -> nn.Module:
  """The ViT backbone of the run: its parameters are the classifier's plus the MPP ones."""
  return classification.features_model(config, model_config)


def make_model(
    config: ml_collections.ConfigDict, model_config: Mapping[str, Any], num_classes: int | None
) -> nn.Module:
  """The masked-patch-prediction model (it has no classes: `num_classes` is not used)."""
  del num_classes
  self_supervised.check_backbone('mpp', model_config)
  return MaskedPatchPredictor(
      mask_rate=config.mpp.mask_rate,
      num_bits=config.mpp.num_bits,
      dtype=jnp.dtype(config.dtype),
      **backbone_fields(model_config),
  )


def _targets(model: nn.Module, images: jax.Array, logits: jax.Array) -> jax.Array:
  targets = colour_targets(images, model.input_stride, model.num_bits)
  chex.assert_shape(targets, logits.shape[:-1])  # One colour class per patch token.
  return targets


def make_loss(
    config: ml_collections.ConfigDict, model: nn.Module, teacher: nn.Module | None = None
) -> Callable[..., jax.Array]:
  """loss(params, images, labels, key): cross-entropy of the colour classes of the corrupted patches,
  their one-hots smoothed by config.label_smoothing as classification's (labels are not used). No
  teacher: `check` refuses config.distill for this task."""
  del teacher
  smoothing = config.label_smoothing

  def loss_fn(params: Any, images: jax.Array, labels: jax.Array, key: jax.Array) -> jax.Array:
    del labels
    dropout_key, mpp_key = jax.random.split(key)
    logits, corrupted = model.apply(
        {'params': params}, images, train=True, rngs={'dropout': dropout_key, 'mpp': mpp_key}
    )
    targets = _targets(model, images, logits)
    if smoothing:
      xent = optax.softmax_cross_entropy(
          logits, mixing.one_hot_targets(targets, logits.shape[-1], smoothing)
      )
    else:  # The integer form: unsmoothed runs stay bit for bit what they were.
      xent = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return jnp.sum(xent * corrupted) / jnp.maximum(jnp.sum(corrupted), 1)

  return loss_fn


def tensor_split(config: ml_collections.ConfigDict) -> dict[str, int]:
  """Nothing beyond the variant's: its head stays whole on every device."""
  del config
  return {}


def mix(config: ml_collections.ConfigDict, num_classes: int) -> None:
  """No batch mixing (`check` refuses config.mix for this task)."""
  del config, num_classes


def example_keys(images: jax.Array) -> jax.Array:
  """A key per image [b], a function of its pixels alone: its corruption pattern in evaluations.

  The hash is a weighted sum of the 8-bit pixel values in wrapping uint32 arithmetic, exact in any
  order of summation, so any mesh gives the same keys."""
  levels = jnp.round((images.astype(jnp.float32) + 1) * 127.5).astype(
      jnp.uint32
  )  # normalize's inverse.
  weights = jax.random.bits(jax.random.key(0), images.shape[1:], jnp.uint32) | 1
  hashes = jnp.sum(levels * weights, axis=(1, 2, 3), dtype=jnp.uint32)
  return jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(0), hashes)


def make_eval_step(
    config: ml_collections.ConfigDict, model: nn.Module
) -> Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]:
  """eval_step(params, batch) -> the classification sums over the corrupted patches of real examples:
  colour-class accuracy."""
  del config

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    # Every evaluation of a run scores the same task, whatever the eval batch size and mesh.
    images = on_device.model_input(batch['image'])
    logits, corrupted = model.apply(
        {'params': params}, images, train=False, corruption_keys=example_keys(images)
    )
    targets = _targets(model, images, logits)
    weight = corrupted * batch['mask'][:, None].astype(jnp.float32)
    top5 = jax.lax.top_k(logits, 5)[1]
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return {
        'correct': jnp.sum((top5[..., 0] == targets) * weight),
        'correct_top5': jnp.sum(jnp.any(top5 == targets[..., None], axis=-1) * weight),
        'loss_sum': jnp.sum(loss * weight),
        'count': jnp.sum(weight),
    }

  return eval_step
