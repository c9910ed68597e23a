"""A checkpoint's input normalisation folded into its patch embedding (`fold`), so that it reads
vit_jax's images in [-1, 1] (state_dicts.load, for the readers whose checkpoints say theirs), and
refolded where its patch embedding is resampled to another patch size (`refold`).

The checkpoint reads (u - mean) / std = a (x + s) of vit_jax's x = 2u - 1 (pixels u in [0, 1]), with
a = 1 / (2 std) and the shift s = 1 - 2 mean per input channel: the folded kernel is a w, and the
constant its bias adds is the folded kernel's response to a patch of s.
"""

from typing import Any, Optional, Sequence

import numpy as np

from vit_jax.checkpoints import adapting


def _response(kernel: np.ndarray, shift: np.ndarray) -> np.ndarray:
  """(D,) float64: the patch embedding `kernel` (p, p, 3, D) of a patch of the constant `shift`."""
  return np.einsum('ijcd,c->d', np.asarray(kernel, np.float64), shift)


def _added_to_tokens(tree: dict[str, Any], constant: np.ndarray) -> dict[str, Any]:
  """`tree` with `constant` added to every patch token: to the patch embedding's bias, or, without
  one (CLIP's), to the patches' position embeddings."""
  embedding = dict(tree['embedding'])
  if 'bias' in embedding:
    embedding['bias'] = (embedding['bias'] + constant).astype(np.float32)
    return {**tree, 'embedding': embedding}
  posemb = np.array(tree['Transformer']['posembed_input']['pos_embedding'], np.float64)
  posemb[:, adapting.num_prefix_tokens(tree) :] += constant
  return {
      **tree,
      'Transformer': {
          **tree['Transformer'],
          'posembed_input': {'pos_embedding': posemb.astype(np.float32)},
      },
  }


def fold(tree: dict[str, Any], mean: Sequence[float], std: Sequence[float]) -> dict[str, Any]:
  """`tree` with its patch embedding reading vit_jax's images as it read the checkpoint's
  (u - mean) / std, exactly: the kernel scaled by 1 / (2 std) per input channel, and its response to
  the shift added to the patch tokens."""
  mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  kernel = tree['embedding']['kernel'].astype(np.float64) / (2 * std)[:, None]
  folded = {**tree, 'embedding': {**tree['embedding'], 'kernel': kernel.astype(np.float32)}}
  return _added_to_tokens(folded, _response(kernel, 1 - 2 * mean))


def refold(
    loaded: dict[str, Any],
    fitted: dict[str, Any],
    normalization: Optional[tuple[Sequence[float], Sequence[float]]],
) -> dict[str, Any]:
  """`fitted`, the parameters adapting.adapt_params fitted from `loaded` (folded with
  `normalization` at the checkpoint's patch size), with the folded constant made by its resampled
  patch kernel, as the checkpoint's model resampled to that patch size (timm's
  resample_patch_embed) computes it: a smaller kernel's least-squares fit responds otherwise to a
  constant patch. Unchanged where nothing was folded."""
  if normalization is None:
    return fitted
  shift = 1 - 2 * np.asarray(normalization[0], np.float64)
  old, new = loaded['embedding']['kernel'], fitted['embedding']['kernel']
  return _added_to_tokens(fitted, _response(new, shift) - _response(old, shift))
