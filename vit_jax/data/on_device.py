"""The batch's images as the model takes them, inside the jitted steps."""

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
