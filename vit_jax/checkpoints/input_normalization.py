"""A checkpoint's input normalisation folded into its patch embedding (`fold`), so that it reads
vit_jax's images in [-1, 1] (state_dicts.load, for the readers whose checkpoints say theirs).
"""

from typing import Any, Sequence

import numpy as np

from vit_jax.checkpoints import adapting


def fold(tree: dict[str, Any], mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
  """`tree` with its patch embedding reading vit_jax's images x = 2u - 1 (pixels u in [0, 1]) as it
  read the checkpoint's (u - mean) / std = x / (2 std) + (0.5 - mean) / std, exactly: the kernel is
  divided by 2 std per input channel, and the constant term's projection added to the patch
  embedding's bias, or, without one (CLIP's), to every patch's position embedding."""
  mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  embedding = dict(tree['embedding'])
  kernel = embedding['kernel'].astype(np.float64)  # (p, p, 3, D)
  offset = np.einsum('ijcd,c->d', kernel, (0.5 - mean) / std)
  embedding['kernel'] = (kernel / (2 * std)[:, None]).astype(np.float32)
  folded = {**tree, 'embedding': embedding}
  if 'bias' in embedding:
    embedding['bias'] = (embedding['bias'] + offset).astype(np.float32)
    return folded
  posemb = tree['Transformer']['posembed_input']['pos_embedding'].astype(np.float64)
  posemb[:, adapting.num_prefix_tokens(tree) :] += offset
  folded['Transformer'] = {
      **tree['Transformer'],
      'posembed_input': {'pos_embedding': posemb.astype(np.float32)},
  }
  return folded
