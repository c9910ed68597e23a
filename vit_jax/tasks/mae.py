"""Masked autoencoding (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners"): the
encoder sees a random `config.mae.mask_ratio` share of each image's patches hidden, and the decoder
predicts the hidden ones' pixels (models/mae.py).

The loss is MAE's (and Hugging Face's `ViTMAEForPreTraining`'s): the squared error of the predicted
pixels of each hidden patch, averaged over its pixels, then over the hidden patches of the batch; with
`norm_pix_loss` the targets are each patch's pixels less their mean, over their standard deviation
(the unbiased one, + 1e-6 under the root, as MAE's). The pixels are the model's input, vit_jax's
[-1, 1], or with config.mae.target_mean / target_std those of pixels u in [0, 1] normalised as
(u - mean) / std: a checkpoint's, whose pretraining a run continues (its decoder predicts them).
"""

from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from vit_jax.data import on_device
from vit_jax.models import encoder, posemb
from vit_jax.models.mae import MaskedAutoencoder, patch_pixels, pixels_image, visible_patches
from vit_jax.models.mpp import backbone_fields
from vit_jax.tasks import classification, mpp, self_supervised

# Its targets are the images' pixels, not the labels: an unlabelled folder (one class) will do.
MIN_CLASSES = 1
METRICS = ('loss',)

# The position embeddings the decoder may add at its input.
DECODER_POSEMBS = ('sincos2d', 'sincos2d_mae', 'learn')
_DECODER_SIZES = (
    'decoder_hidden_size',
    'decoder_num_layers',
    'decoder_num_heads',
    'decoder_mlp_dim',
)


def check(config: ml_collections.ConfigDict) -> None:
  mae = config.mae
  if not 0.0 < mae.mask_ratio < 1.0:
    raise ValueError(f'config.mae.mask_ratio={mae.mask_ratio} must be in (0, 1), e.g. 0.75')
  for name in _DECODER_SIZES:
    if isinstance(mae[name], bool) or not mae[name] >= 1:
      raise ValueError(f'config.mae.{name}={mae[name]!r} must be a positive whole number')
  if mae.decoder_hidden_size % mae.decoder_num_heads:
    raise ValueError(
        f'config.mae.decoder_hidden_size={mae.decoder_hidden_size} does not divide into '
        f'config.mae.decoder_num_heads={mae.decoder_num_heads} heads: use a multiple of it'
    )
  said = (mae.target_mean, mae.target_std)
  if (
      (said[0] is None) != (said[1] is None)
      or said[0] is not None
      and not (len(said[0]) == len(said[1]) == 3 and all(s > 0 for s in said[1]))
  ):
    raise ValueError(
        f'config.mae.target_mean={said[0]!r} and target_std={said[1]!r} go together: 3 means and 3 '
        'positive stds (of pixels in [0, 1]), e.g. (0.485, 0.456, 0.406) and (0.229, 0.224, '
        "0.225), or both unset: vit_jax's [-1, 1]"
    )
  if mae.decoder_posemb not in DECODER_POSEMBS:
    raise ValueError(
        f'Unknown config.mae.decoder_posemb {mae.decoder_posemb!r}: use one of '
        f'{", ".join(DECODER_POSEMBS)}'
    )
  if mae.decoder_posemb in posemb.SINCOS and (
      mae.decoder_hidden_size % 4 or mae.decoder_hidden_size < 8
  ):
    raise ValueError(
        f"config.mae.decoder_posemb='{mae.decoder_posemb}' needs a config.mae.decoder_hidden_size "
        f'that is a multiple of 4 (at least 8), got {mae.decoder_hidden_size}'
    )
  # Every task checks every config; the rest is for this task's runs.
  if not self_supervised.check(config, 'mae', 'the masked autoencoder'):
    return
  if config.loss != mpp.LOSS or config.label_smoothing:
    raise ValueError(
        "config.task=mae trains on the squared error of the hidden patches' pixels: leave "
        f'config.loss at {mpp.LOSS!r} and config.label_smoothing at 0'
    )


# What masking needs of the backbone (encoder.keep_refused_by), by the field that refuses it.
_POSEMB_FIX = (
    'a kept patch says where it was by position embeddings added at the input: set '
    "config.model.posemb_where='input' and a config.model.posemb other than 'relative'"
)
_KEEP_FIXES = {
    'posemb_where': _POSEMB_FIX,
    'posemb': _POSEMB_FIX,
    'rope': 'RoPE of a masked grid is not supported: set config.model.rope=False',
    'block': 'axial blocks attend over the whole grid: use a ViT-* variant, not an Axial-ViT',
}


def _check_model(config: ml_collections.ConfigDict, model: Mapping[str, Any]) -> None:
  """The backbone fields masking cannot run with, by their config names."""
  self_supervised.check_backbone('mae', model)
  if model['resnet_layers']:
    raise ValueError(
        "config.task=mae: a hybrid's ResNet stem would see the hidden patches' pixels: use a pure "
        'ViT'
    )
  refused = encoder.keep_refused_by(model)
  if refused:
    raise ValueError(f'config.task=mae: {_KEEP_FIXES[refused]}')
  patches = (config.image_size // model['patch_size']) ** 2
  if visible_patches(patches, config.mae.mask_ratio) < 1:
    raise ValueError(
        f'config.mae.mask_ratio={config.mae.mask_ratio} hides all {patches} patches of an image: '
        'lower it, or use more patches'
    )


def features_model(config: ml_collections.ConfigDict, model_config: Mapping[str, Any]) -> nn.Module:
  """The ViT backbone of the run: its parameters are the classifier's plus the decoder."""
  return classification.features_model(config, model_config)


def make_model(
    config: ml_collections.ConfigDict, model_config: Mapping[str, Any], num_classes: int | None
) -> nn.Module:
  """The masked autoencoder (it has no classes: `num_classes` is not used)."""
  del num_classes
  _check_model(config, model_config)
  mae = config.mae
  return MaskedAutoencoder(
      mask_ratio=mae.mask_ratio,
      decoder_hidden_size=mae.decoder_hidden_size,
      decoder_num_layers=mae.decoder_num_layers,
      decoder_num_heads=mae.decoder_num_heads,
      decoder_mlp_dim=mae.decoder_mlp_dim,
      decoder_posemb=mae.decoder_posemb,
      dtype=jnp.dtype(config.dtype),
      **backbone_fields(model_config),
  )


Normalization = Optional[tuple[Sequence[float], Sequence[float]]]


def normalization(config: ml_collections.ConfigDict) -> Normalization:
  """The (mean, std) of the pixels the decoder predicts (config.mae.target_mean / target_std), None
  for vit_jax's own [-1, 1]."""
  mae = config.mae
  return None if mae.target_mean is None else (mae.target_mean, mae.target_std)


def _affine(said: Normalization) -> tuple[jax.Array, jax.Array]:
  """(scale, offset) per channel taking images x in [-1, 1] to (u - mean) / std of u = (x + 1) / 2."""
  if said is None:
    return jnp.ones(3), jnp.zeros(3)
  mean, std = (jnp.asarray(v, jnp.float32) for v in said)
  return 1 / (2 * std), (0.5 - mean) / std


def pixel_targets(
    images: jax.Array, stride: int, norm_pix_loss: bool, said: Normalization = None
) -> jax.Array:
  """The decoder's targets [b, patches, stride^2 * 3]: each patch's pixels (`patch_pixels`, of the
  images normalised as `said`, a `normalization`), with `norm_pix_loss` less their mean, over
  sqrt(their unbiased variance + 1e-6)."""
  scale, offset = _affine(said)
  targets = patch_pixels(images.astype(jnp.float32) * scale + offset, stride)
  if not norm_pix_loss:
    return targets
  mean, scale = _standardisation(targets)
  return (targets - mean) / scale


def _standardisation(patches: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Each patch's mean and MAE's scale of it, sqrt(unbiased variance + 1e-6): [b, patches, 1] each."""
  variance = patches.var(axis=-1, ddof=1, keepdims=True)
  return patches.mean(axis=-1, keepdims=True), jnp.sqrt(variance + 1e-6)


def patch_errors(
    model: nn.Module,
    pixels: jax.Array,
    images: jax.Array,
    norm_pix_loss: bool,
    said: Normalization = None,
) -> jax.Array:
  """The mean squared error of each patch's predicted pixels [b, patches]."""
  targets = pixel_targets(images, model.input_stride, norm_pix_loss, said)
  return jnp.mean(jnp.square(pixels - targets), axis=-1)


def reconstruction(
    model: nn.Module,
    params: Any,
    images: jax.Array,
    norm_pix_loss: bool,
    said: Normalization = None,
) -> tuple[jax.Array, jax.Array]:
  """The images (in [-1, 1]) with their hidden patches (those the evaluation hides) drawn by the
  decoder, and the hidden mask [b, patches]. With `norm_pix_loss` the decoder predicts standardised
  pixels: they are scaled back by each hidden patch's own mean and standard deviation (MAE's
  figures); pixels normalised as `said` are taken back to [-1, 1]. The visible patches are the
  images' own."""
  stride = model.input_stride
  pixels, hidden = model.apply(
      {'params': params}, images, train=False, noise=_evaluation_noise(model, images)
  )
  scale, offset = _affine(said)
  original = patch_pixels(images.astype(jnp.float32) * scale + offset, stride)
  if norm_pix_loss:
    mean, spread = _standardisation(original)
    pixels = pixels * spread + mean
  drawn = jnp.where(hidden[..., None] > 0, pixels, original)
  grid = (images.shape[1] // stride, images.shape[2] // stride)
  return (pixels_image(drawn, grid, stride) - offset) / scale, hidden


def _noise(images: jax.Array, stride: int, key: jax.Array) -> jax.Array:
  """Uniform noise [b, patches] drawn by `key`, or by each image's key of `key` [b]."""
  shape = (images.shape[1] // stride) * (images.shape[2] // stride)
  if key.ndim == 0:
    return jax.random.uniform(key, (images.shape[0], shape))
  return jax.vmap(lambda k: jax.random.uniform(k, (shape,)))(key)


def _evaluation_noise(model: nn.Module, images: jax.Array) -> jax.Array:
  """The noise each image's own pixels draw (`mpp.example_keys`): the same patches hidden in every
  evaluation, whatever the batch and mesh."""
  return _noise(images, model.input_stride, mpp.example_keys(images))


def make_loss(
    config: ml_collections.ConfigDict, model: nn.Module, teacher: nn.Module | None = None
) -> Callable[..., jax.Array]:
  """loss(params, images, labels, key): the squared error of the hidden patches' pixels (labels are
  not used). No teacher: `check` refuses config.distill for this task."""
  del teacher
  norm_pix_loss, said = config.mae.norm_pix_loss, normalization(config)

  def loss_fn(params: Any, images: jax.Array, labels: jax.Array, key: jax.Array) -> jax.Array:
    del labels
    dropout_key, noise_key = jax.random.split(key)
    pixels, hidden = model.apply(
        {'params': params},
        images,
        train=True,
        noise=_noise(images, model.input_stride, noise_key),
        rngs={'dropout': dropout_key},
    )
    errors = patch_errors(model, pixels, images, norm_pix_loss, said)
    return jnp.sum(errors * hidden) / jnp.maximum(jnp.sum(hidden), 1)

  return loss_fn


def tensor_split(config: ml_collections.ConfigDict) -> dict[str, int]:
  """The decoder's blocks split as the encoder's (encoder.TENSOR_RULES): by heads and MLP units."""
  return {
      'mae.decoder_num_heads': config.mae.decoder_num_heads,
      'mae.decoder_mlp_dim': config.mae.decoder_mlp_dim,
  }


def mix(config: ml_collections.ConfigDict, num_classes: int) -> None:
  """No batch mixing (`check` refuses config.mix for this task)."""
  del config, num_classes


def make_eval_step(
    config: ml_collections.ConfigDict, model: nn.Module
) -> Callable[[Any, dict[str, jax.Array]], dict[str, jax.Array]]:
  """eval_step(params, batch) -> the sum of the real examples' losses (each the mean error of its
  hidden patches) and their count. Each image hides the patches its own pixels draw
  (`mpp.example_keys`): every evaluation of a run scores the same task, whatever the batch and mesh.
  """
  norm_pix_loss, said = config.mae.norm_pix_loss, normalization(config)

  def eval_step(params: Any, batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    images = on_device.model_input(batch['image'])
    pixels, hidden = model.apply(
        {'params': params}, images, train=False, noise=_evaluation_noise(model, images)
    )
    errors = patch_errors(model, pixels, images, norm_pix_loss, said)
    losses = jnp.sum(errors * hidden, axis=1) / jnp.maximum(jnp.sum(hidden, axis=1), 1)
    real = batch['mask'].astype(jnp.float32)
    return {'loss_sum': jnp.sum(losses * real), 'count': jnp.sum(real)}

  return eval_step
