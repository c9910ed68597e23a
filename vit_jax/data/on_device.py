"""The batch's images and labels as the jitted steps take them."""

import jax
import jax.numpy as jnp

from vit_jax.data import images as data_images


def model_input(images: jax.Array) -> jax.Array:
  """Images of a batch (`train_iterator`, `eval_iterator`) as the model takes them, float32 in
  [-1, 1]: uint8 pixels normalised on the device, each level looked up in `images.LEVELS` (so to the
  bit what `images.normalize` makes on the host); float32 batches are normalised already."""
  if images.dtype != jnp.uint8:
    return images
  return jnp.asarray(data_images.LEVELS)[images]


def labels(batch: dict[str, jax.Array]) -> jax.Array:
  """A batch's labels: 'labels' (label sets, multi-hot bool [b, classes]) where it has them, else
  'label' (int32 [b])."""
  return batch['labels'] if 'labels' in batch else batch['label']
