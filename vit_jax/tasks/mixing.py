"""Mixup and CutMix of a whole batch in the train step, as timm's `Mixup(mode='batch')`.

One draw per global batch: with probability `prob` the batch is mixed with itself reversed (row i with
row b-1-i), by CutMix (with probability `switch_prob` when both alphas are set) or else Mixup, with
lam ~ Beta(alpha, alpha) the weight of the batch itself; CutMix's lam is the share of the image outside
its box. The labels become the soft targets lam * y + (1 - lam) * y reversed, smoothed before mixing.
Everything is traced: the draws come from a key, the box is a mask, so one jit serves every step.
"""

import math
from typing import Callable, NamedTuple

import chex
import jax
import jax.numpy as jnp
import ml_collections
import optax

# mix(images, labels, key, step) -> (images, soft targets [b, classes]): the train step's batch transform.
MixFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], tuple[jax.Array, jax.Array]]


class Draw(NamedTuple):
  """The random choices of one batch."""

  lam: jax.Array  # float32 []: the weight of the batch itself; 1: unmixed.
  cutmix: jax.Array  # bool []: paste a box of the reversed batch (else blend, unless lam is 1).
  box: jax.Array  # int32 [4]: top, bottom, left, right (bottom and right exclusive).


def check(mix: ml_collections.ConfigDict) -> None:
  """Raises a one-line ValueError for a bad field of `config.mix`."""
  for name in ('mixup_alpha', 'cutmix_alpha'):
    # Beta(inf, inf) draws NaN: the first mixed step's loss would be NaN.
    if not 0 <= mix[name] < math.inf:
      raise ValueError(
          f'config.mix.{name}={mix[name]} must be at least 0 (0: off) and finite, e.g. 0.8'
      )
  for name in ('prob', 'switch_prob'):
    if not 0 <= mix[name] <= 1:
      raise ValueError(f'config.mix.{name}={mix[name]} must be in [0, 1], e.g. 0.5')
  if mix.until_step is not None and mix.until_step < 1:
    raise ValueError(
        f'config.mix.until_step={mix.until_step} must be at least 1 (or unset: mix '
        'for the whole run)'
    )
  if mix.until_step is not None and not enabled(mix):
    raise ValueError(
        f'config.mix.until_step={mix.until_step} ends a mixing that is off (mix.mixup_alpha '
        'and mix.cutmix_alpha are 0): unset it, or turn mixing on, e.g. '
        '--config.mix.mixup_alpha=0.8'
    )


def enabled(mix: ml_collections.ConfigDict) -> bool:
  """Whether `config.mix` mixes at all (either alpha set)."""
  return mix.mixup_alpha > 0 or mix.cutmix_alpha > 0


def one_hot_targets(labels: jax.Array, num_classes: int, smoothing: float = 0.0) -> jax.Array:
  """Integer `labels` [b] as one-hot rows [b, num_classes], or a label set's multi-hot bool rows [b,
  num_classes] as float32, label-smoothed (timm's on / off values, its BinaryCrossEntropy's too)."""
  if labels.dtype == jnp.bool_:
    chex.assert_shape(labels, (None, num_classes))
    targets = labels.astype(jnp.float32)
  else:
    targets = jax.nn.one_hot(labels, num_classes)
  return optax.smooth_labels(targets, smoothing) if smoothing else targets


def cutmix_box(
    lam: jax.Array, centre_y: jax.Array, centre_x: jax.Array, height: int, width: int
) -> jax.Array:
  """timm's `rand_bbox` given its centre: sides sqrt(1 - lam) of the image's, clipped to the image."""
  ratio = jnp.sqrt(1.0 - lam)
  cut_h = jnp.floor(height * ratio).astype(jnp.int32)
  cut_w = jnp.floor(width * ratio).astype(jnp.int32)
  return jnp.stack(
      [
          jnp.clip(centre_y - cut_h // 2, 0, height),
          jnp.clip(centre_y + (cut_h + 1) // 2, 0, height),
          jnp.clip(centre_x - cut_w // 2, 0, width),
          jnp.clip(centre_x + (cut_w + 1) // 2, 0, width),
      ]
  )


def box_lam(box: jax.Array, height: int, width: int) -> jax.Array:
  """The share of the image outside `box`: CutMix's lam corrected for clipping (timm's correct_lam)."""
  top, bottom, left, right = box
  return 1.0 - ((bottom - top) * (right - left)).astype(jnp.float32) / (height * width)


def draw(
    key: jax.Array, step: jax.Array, mix: ml_collections.ConfigDict, height: int, width: int
) -> Draw:
  """The choices of the batch of train step `step` (0-based) for `config.mix`."""
  mixed_key, cutmix_key, lam_key, y_key, x_key = jax.random.split(key, 5)
  mixed = jax.random.uniform(mixed_key) < mix.prob
  if mix.until_step is not None:
    mixed &= step < mix.until_step
  if mix.mixup_alpha > 0 and mix.cutmix_alpha > 0:
    cutmix = jax.random.uniform(cutmix_key) < mix.switch_prob
  else:
    cutmix = jnp.asarray(mix.cutmix_alpha > 0)
  alpha = jnp.where(cutmix, mix.cutmix_alpha, mix.mixup_alpha)
  lam = jax.random.beta(lam_key, alpha, alpha)
  box = cutmix_box(
      lam,
      jax.random.randint(y_key, (), 0, height),
      jax.random.randint(x_key, (), 0, width),
      height,
      width,
  )
  lam = jnp.where(cutmix, box_lam(box, height, width), lam)
  return Draw(lam=jnp.where(mixed, lam, 1.0), cutmix=mixed & cutmix, box=box)


def box_mask(box: jax.Array, height: int, width: int) -> jax.Array:
  """bool [height, width]: True inside `box`."""
  top, bottom, left, right = box
  rows = jnp.arange(height)[:, None]
  cols = jnp.arange(width)[None, :]
  return (rows >= top) & (rows < bottom) & (cols >= left) & (cols < right)


def mix_images(images: jax.Array, lam: jax.Array, cutmix: jax.Array, box: jax.Array) -> jax.Array:
  """Images [b, h, w, c] mixed with their reverse: the box pasted (CutMix) or blended by lam (Mixup).
  lam 1 without CutMix leaves them as they are."""
  flipped = images[::-1]
  pasted = jnp.where(box_mask(box, *images.shape[1:3])[None, :, :, None], flipped, images)
  lam = lam.astype(images.dtype)
  blended = images * lam + flipped * (1 - lam)
  return jnp.where(cutmix, pasted, blended)


def mix_targets(labels: jax.Array, num_classes: int, lam: jax.Array, smoothing: float) -> jax.Array:
  """timm's `mixup_target`: lam * smoothed one-hot (multi-hot) + (1 - lam) * the same reversed, float32
  [b, K]."""
  targets = one_hot_targets(labels, num_classes, smoothing)
  return targets * lam + targets[::-1] * (1 - lam)


def make(mix: ml_collections.ConfigDict, num_classes: int, smoothing: float) -> MixFn:
  """The batch transform of `config.mix` for integer labels of `num_classes` classes, or their
  multi-hot label sets."""
  mix = ml_collections.FrozenConfigDict(
      mix
  )  # Later edits of the config cannot change the traced step.

  def mix_batch(
      images: jax.Array, labels: jax.Array, key: jax.Array, step: jax.Array
  ) -> tuple[jax.Array, jax.Array]:
    chosen = draw(key, step, mix, *images.shape[1:3])
    return (
        mix_images(images, chosen.lam, chosen.cutmix, chosen.box),
        mix_targets(labels, num_classes, chosen.lam, smoothing),
    )

  return mix_batch
