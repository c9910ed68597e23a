"""Knowledge distillation (`config.distill`, DeiT's: Touvron et al. 2021, "Training data-efficient image
transformers & distillation through attention"): the student learns from a frozen teacher's
predictions on the same (mixed, augmented) images, as well as from the labels.

The loss is DeiT's `DistillationLoss`: (1 - alpha) * the run's loss on the labels (its label smoothing
and mixing included) of the class token's head, plus alpha * the distillation loss of the distillation
token's head (`model.distilled`; a student without one distils through its single head):
  'hard': cross-entropy with the teacher's top class (DeiT's best, alpha 0.5);
  'soft': KL(teacher || student) of the softmaxes at `temperature`, times temperature^2, summed over
          the batch and classes and divided by their product (DeiT's `reduction='sum' / numel`);
  'kl':   the same KL summed over the classes and averaged over the batch (Hinton's, PyTorch's
          `reduction='batchmean'`, big_vision's `kl` distance of FunMatch and FlexiViT): 'soft' times
          the number of classes, which sets its weight against the labels' loss and gradient clipping.
The teacher (vit_jax/checkpoints/teacher.py) runs in the train step on the same mesh, its parameters
sharded as the student's, without gradients or optimizer state (vit_jax/train/step.py), on the
student's images or, with `teacher_image_size`, on them resized on the device (`teacher_input`): the
same crop, flip and mix at the teacher's resolution, as FlexiViT's 384 px teacher saw its 240 px
student's (big_vision resizes the crop twice on the host; here the student's image is resized, which
keeps one image a batch example on the host and in the transfer).
"""

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import ml_collections
import optax


def hard_loss(student: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
  del temperature  # The top class has none.
  labels = jnp.argmax(teacher, axis=-1)
  return optax.softmax_cross_entropy_with_integer_labels(student, labels).mean()


def _kl_sum(student: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
  """KL(teacher || student) at `temperature` summed over the batch, times temperature^2."""
  log_student = jax.nn.log_softmax(student / temperature, axis=-1)
  log_teacher = jax.nn.log_softmax(teacher / temperature, axis=-1)
  return jnp.sum(jnp.exp(log_teacher) * (log_teacher - log_student)) * temperature**2


def soft_loss(student: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
  return _kl_sum(student, teacher, temperature) / student.size


def kl_loss(student: jax.Array, teacher: jax.Array, temperature: float) -> jax.Array:
  return _kl_sum(student, teacher, temperature) / student.shape[0]


def teacher_image_size(config: ml_collections.ConfigDict) -> int:
  """The side of the teacher's input images: config.distill.teacher_image_size, else the run's."""
  return config.distill.teacher_image_size or config.image_size


def teacher_input(images: jax.Array, image_size: int) -> jax.Array:
  """The student's float images [b, h, w, c] as the teacher sees them: resized to `image_size` by
  antialiased bilinear interpolation (PIL's BILINEAR: its triangle filter widened by the factor when it
  shrinks, the image edge's weights renormalised), as they are where the sizes agree."""
  chex.assert_rank(images, 4)
  if images.shape[1:3] == (image_size, image_size):
    return images
  shape = (images.shape[0], image_size, image_size, images.shape[3])
  return jax.image.resize(images, shape, method='linear', antialias=True)


# config.distill.kind -> (the distillation head's logits, the teacher's, temperature) -> the loss.
LOSSES: dict[str, Callable[[jax.Array, jax.Array, float], jax.Array]] = {
    'hard': hard_loss,
    'soft': soft_loss,
    'kl': kl_loss,
}


def combine(
    distill: ml_collections.ConfigDict,
    base: jax.Array,
    student: jax.Array,
    teacher: jax.Array,
) -> jax.Array:
  """DeiT's total: (1 - alpha) * `base` (the labels' loss) + alpha * the distillation loss of the
  `student`'s distillation logits against the `teacher`'s (no gradient flows into the teacher)."""
  teacher = jax.lax.stop_gradient(teacher.astype(jnp.float32))
  distilled = LOSSES[distill.kind](student, teacher, distill.temperature)
  return (1.0 - distill.alpha) * base + distill.alpha * distilled


def check(config: ml_collections.ConfigDict) -> None:
  distill = config.distill
  if distill.teacher == '':  # pylint: disable=g-explicit-bool-comparison
    # As from `--config.distill.teacher=$TEACHER` with TEACHER unset: not a run without one.
    raise ValueError(
        "config.distill.teacher is empty: set it to the teacher run's WORKDIR (or a timm / Hugging "
        'Face checkpoint), or leave it unset to train without one'
    )
  if distill.teacher is None:
    # Without a teacher these would change nothing.
    changed = [
        f'{name}={distill[name]!r}'
        for name, default in (
            ('kind', 'hard'),
            ('alpha', 0.5),
            ('temperature', 1.0),
            ('teacher_image_size', None),
            ('teacher_step', None),
        )
        if distill[name] != default
    ]
    if changed:
      raise ValueError(
          f'config.distill.{changed[0]} has no teacher to distil from: set '
          '--config.distill.teacher=WORKDIR (or a timm / Hugging Face checkpoint), or leave it'
      )
    return
  if distill.kind not in LOSSES:
    raise ValueError(
        f'Unknown config.distill.kind {distill.kind!r}: use one of {", ".join(LOSSES)}'
    )
  if not 0.0 <= distill.alpha <= 1.0:
    raise ValueError(f'config.distill.alpha={distill.alpha} must be in [0, 1], e.g. 0.5')
  if not distill.temperature > 0:
    raise ValueError(f'config.distill.temperature={distill.temperature} must be positive, e.g. 1.0')
  if distill.kind == 'hard' and distill.temperature != 1.0:  # The top class has no temperature.
    raise ValueError(
        f"config.distill.temperature={distill.temperature} softens the teacher's probabilities, "
        "and distill.kind='hard' takes its top class: set --config.distill.kind=soft, or leave "
        'the temperature at 1.0'
    )
  if distill.alpha == 1.0 and config.label_smoothing:  # The labels' loss is weighed 0.
    raise ValueError(
        f"config.label_smoothing={config.label_smoothing} smooths the labels' loss, which "
        'config.distill.alpha=1.0 weighs 0: set --config.label_smoothing=0, or an alpha below 1'
    )
  if distill.teacher_step is not None and distill.teacher_step < 0:
    raise ValueError(
        f'config.distill.teacher_step={distill.teacher_step} must be a checkpoint step of the '
        'teacher workdir (>= 0), or unset: its latest'
    )
  if distill.teacher_image_size is not None and distill.teacher_image_size <= 0:
    raise ValueError(
        f'config.distill.teacher_image_size={distill.teacher_image_size} must be positive, e.g. '
        "384 (the teacher's own resolution), or unset: the run's config.image_size"
    )
