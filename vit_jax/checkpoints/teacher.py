"""The teacher of knowledge distillation (`config.distill.teacher`, vit_jax/tasks/distillation.py):
any classifier vit_jax reads, a vit_jax run's workdir (a ViT or a BiT, as DeiT's RegNet teacher was a
CNN), a timm / Hugging Face / OpenCLIP ViT checkpoint (hf-hub:<repo> too) or a ViT's .npz (original
or big_vision layout), built for the run's images and classes."""

import dataclasses
import math
from typing import Any, Optional, Sequence

from absl import logging
import flax.linen as nn
import jax.numpy as jnp
import ml_collections
from etils import epath

from vit_jax.checkpoints import adapting, hub, label_order, run_dir, saved_state, state_dicts
from vit_jax.checkpoints import torch_files
from vit_jax.models import variants, vit_variants
from vit_jax.runtime import paths
from vit_jax.tasks import distillation


@dataclasses.dataclass(frozen=True)
class Teacher:
  model: nn.Module  # The teacher's classifier, for images of its size.
  params: Any  # numpy arrays, fitted to `model` (position embeddings resized).
  source: str  # For the log: what was loaded.


def architecture(config: ml_collections.ConfigDict) -> tuple[str, dict[str, Any]]:
  """The teacher's variant and resolved model fields, read without its parameters (a checkpoint's
  header and config.json, a workdir's config.json): what the planner counts. A one-line ValueError
  when config.distill.teacher cannot be read or its patches do not tile its images."""
  given, step = config.distill.teacher, config.distill.teacher_step
  if step is not None and not run_dir.is_workdir(hub.local(given)):
    raise ValueError(
        f'config.distill.teacher_step={step} picks a checkpoint of a vit_jax workdir, and '
        f'config.distill.teacher={given!r} is not one: unset it'
    )
  variant, model_config = _read_architecture(config)
  stride = variants.stride_of(variant, model_config)
  image_size = distillation.teacher_image_size(config)
  if image_size % stride:
    field = 'distill.teacher_image_size' if config.distill.teacher_image_size else 'image_size'
    raise ValueError(
        f'config.distill.teacher={config.distill.teacher!r} cuts {stride} px patches, which do not '
        f'tile its {image_size} px images (config.{field}): set --config.distill.teacher_image_size '
        f'to a multiple of {stride}, e.g. {max(stride, image_size // stride * stride)}'
    )
  return variant, model_config


def _trained_image_size(params: dict[str, Any], stride: int) -> Optional[int]:
  """The image size a ViT's learned position embeddings [1, tokens, width] were trained at: their
  square grid of patches times the patch stride; None for any other layout."""
  posemb = params.get('Transformer', {}).get('posembed_input', {}).get('pos_embedding')
  if posemb is None or posemb.ndim != 3:
    return None
  patches = posemb.shape[1] - adapting.num_prefix_tokens(params)
  side = math.isqrt(max(patches, 0))
  return side * stride if side and side * side == patches else None


def _read_architecture(config: ml_collections.ConfigDict) -> tuple[str, dict[str, Any]]:
  given = config.distill.teacher
  path = hub.local(given)
  paths.check_reachable(path, config.storage_timeout_s, 'config.distill.teacher')
  if torch_files.is_state_dict_path(path) or path.endswith('.npz'):
    try:
      fields = state_dicts.fill({}, path)
    except ValueError:
      if not (path.endswith('.npz') and epath.Path(path).is_file()):
        raise
      raise ValueError(
          f"config.distill.teacher={given!r}: an .npz that is not a plain ViT's does not say its "
          'model; pass the workdir of the vit_jax run that trained it, or a timm / Hugging Face '
          'checkpoint'
      ) from None
    return vit_variants.FROM_CHECKPOINT, variants.get_model_config(
        vit_variants.FROM_CHECKPOINT, fields
    )
  try:
    return run_dir.run_model(path)
  except (ValueError, FileNotFoundError) as e:
    raise ValueError(f'config.distill.teacher={given!r}: {e}') from None


def pin_step(
    config: ml_collections.ConfigDict, stored: Optional[ml_collections.ConfigDict]
) -> None:
  """Sets an unset config.distill.teacher_step of a teacher workdir: the step the run's first start
  distilled from (`stored`, its config: run_dir.resumed_config), else the teacher's latest. Stored
  with the run, it keeps a resume on the teacher it started with while the teacher's run saves more
  checkpoints."""
  distill = config.distill
  path = hub.local(distill.teacher) if distill.teacher else None
  if not path or distill.teacher_step is not None or not run_dir.is_workdir(path):
    return
  if stored is not None and stored.distill.teacher == distill.teacher:
    distill.teacher_step = stored.distill.teacher_step
    if distill.teacher_step is not None:
      return
  try:
    distill.teacher_step = saved_state.find_checkpoint(path)[1]
  except (ValueError, FileNotFoundError):  # load_teacher says why.
    pass


def load_teacher(
    config: ml_collections.ConfigDict, num_classes: int, class_names: Sequence[str] = ()
) -> Teacher:
  """The teacher of `config.distill.teacher`, for images of its size (`distillation.
  teacher_image_size`) in config.dtype, its outputs in the order of the run's `class_names` where it
  names the same classes in another (label_order.py); a one-line ValueError when it cannot be read or
  predicts other classes than the run's."""
  given = config.distill.teacher
  path = hub.local(given)
  variant, model_config = architecture(config)
  image_size = distillation.teacher_image_size(config)
  model = variants.build(
      variant, model_config, num_classes=num_classes, dtype=jnp.dtype(config.dtype)
  )
  if variant == vit_variants.FROM_CHECKPOINT:
    loaded, source = run_dir.load_params(path, model_config)
  else:
    try:
      trained = run_dir.load_trained(path, config.distill.teacher_step)
    except (ValueError, FileNotFoundError) as e:
      raise ValueError(f'config.distill.teacher={given!r}: {e}') from None
    loaded = trained.params
    source = f'{trained.parameters} parameters of step {trained.step} of {path}'
  head = loaded.get('head', {}).get('kernel')
  if head is None or head.shape[-1] != num_classes:
    predicts = (
        'has no classification head' if head is None else f'predicts {head.shape[-1]} classes'
    )
    raise ValueError(
        f'config.distill.teacher={given!r} {predicts}, and the run has {num_classes}: the '
        'teacher must be a classifier of the same classes, in the same order'
    )
  if class_names and not paths.is_url(path):
    loaded = label_order.aligned(
        loaded, label_order.checkpoint_classes(path), class_names, 'config.distill.teacher'
    )
  trained_at = _trained_image_size(loaded, variants.stride_of(variant, model_config))
  if trained_at and trained_at != image_size and not config.distill.teacher_image_size:
    logging.warning(
        "config.distill.teacher=%r was trained at %d px and runs at the run's %d px, its position "
        'embeddings resized: --config.distill.teacher_image_size=%d runs it at its own',
        given,
        trained_at,
        image_size,
        trained_at,
    )
  params, _ = adapting.adapt_params(
      loaded,
      adapting.param_shapes(model, image_size),
      keep_head=True,
      keep_pre_logits=bool(model_config.get('representation_size')),  # The teacher's, if any.
      posemb_method=config.posemb_interpolation,
  )
  logging.info('Distilling from %s at %d px: %s', given, image_size, source)
  return Teacher(model, params, source)
