"""Patch dropout (`model.patch_dropout`; Liu et al. 2022, "PatchDropout: Economizing Vision
Transformers Using Patch Dropout", and FLIP's masking; timm's `patch_drop_rate`): at train time the
blocks of a ViT classifier see a random share of each image's patches, once they have their position
embeddings; the tokens before them (class token, registers) all. A step then costs about what that
share of the tokens costs. Evaluation sees every patch.

timm's draw: each image keeps the `kept(patches, rate)` patches of the smallest standard normal noise,
in that order (attention and the poolings do not depend on it).
"""

from typing import Any, Mapping, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import encoder


def kept(num_patches: int, rate: float) -> int:
  """The patches an image keeps: timm's max(1, int(patches * (1 - rate)))."""
  return max(1, int(num_patches * (1.0 - rate)))


def kept_patches(noise: jax.Array, rate: float) -> jax.Array:
  """int32 [b, kept] indices of the patches each image keeps, for `noise` [b, patches]."""
  chex.assert_rank(noise, 2)
  return jnp.argsort(noise, axis=1)[:, : kept(noise.shape[1], rate)]


def drawn(
    module: nn.Module, patches: jax.Array, rate: float, noise: Optional[jax.Array] = None
) -> jax.Array:
  """`kept_patches` of `module`'s patch embeddings [b, patches, D] for `noise` [b, patches] (timm's
  randn), or where None for noise drawn from the module's 'dropout' stream."""
  if noise is None:
    noise = jax.random.normal(module.make_rng('dropout'), patches.shape[:2])
  chex.assert_shape(noise, patches.shape[:2])
  return kept_patches(noise, rate)


def check(model: Mapping[str, Any]) -> None:
  """One-line ValueErrors for a `patch_dropout` of a resolved ViT model config that the model would
  refuse (or misuse) as it runs."""
  rate = model['patch_dropout']
  if not 0.0 <= rate < 1.0:
    raise ValueError(
        f'model.patch_dropout={rate} must be in [0, 1): the share of the patches dropped at train '
        'time, e.g. 0.5 (0: none)'
    )
  if not rate:
    return
  field = encoder.keep_refused_by(model)
  if field:
    # model.block is no config field: the variant's name sets it.
    has = 'is an Axial-ViT' if field == 'block' else f'has model.{field}={model[field]!r}'
    raise ValueError(
        f'model.patch_dropout={rate} keeps a random share of the patches, which only position '
        f'embeddings added at the input locate, and the model {has}: set '
        "--config.model.patch_dropout=0, or posemb_where='input', a posemb other than 'relative', "
        'rope=False and a ViT-* variant'
    )
