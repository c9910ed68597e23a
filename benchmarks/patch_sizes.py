"""The demo's checkpoint (16 px digits, patches of 4 px: a 4x4 grid) measured at other patch sizes
with no step, its patch embedding resampled by each config.patch_interpolation (FlexiViT's
pseudo-inverse resize) against the plain resize FlexiViT compares it with (the kernel resized as an
image, bilinear), and that resize scaled by the ratio of patch areas (a constant patch keeps its
token); the position embeddings are fitted to each grid (bilinear) in every case. FlexiViT's
Figure 3.

  .venv/bin/python benchmarks/patch_sizes.py [WORKDIR]     # default workdirs/demo

Prints a Markdown table of test top-1 for RESULTS.md.
"""

import sys

import jax
import numpy as np

from vit_jax.checkpoints import patch_resizing, run_dir
from vit_jax.models import patch_embedding, posemb
from vit_jax.tools import classifiers

# (image size, patch size): the same grid at twice the pixels, then other grids.
CASES = ((16, 4), (32, 8), (8, 2), (16, 2), (16, 8), (24, 6), (24, 4))


def _plain(kernel: np.ndarray, size: int, scaled: bool) -> np.ndarray:
  resized = np.asarray(jax.image.resize(kernel, (size, size, *kernel.shape[2:]), 'linear'))
  return resized * (kernel.shape[0] / size) ** 2 if scaled else resized


def main(workdir: str) -> None:
  trained = run_dir.load_trained(workdir)
  stored = trained.params['embedding']['kernel']
  plain = {'plain resize': False, 'plain resize x area ratio': True}
  methods = (*patch_resizing.PATCH_METHODS, *plain)
  print('| image px, patch px (grid) | ' + ' | '.join(methods) + ' |')
  print('|---|' + '---|' * len(methods))
  for image_size, patch_size in CASES:
    config = trained.config.copy_and_resolve_references()
    config.image_size = image_size
    model = trained.model.clone(patch_size=patch_size)
    row = []
    for method in methods:
      params = trained.params
      if method in plain:
        params = {**params, 'embedding': {**params['embedding']}}
        params['embedding']['kernel'] = _plain(stored, patch_size, plain[method])
        method = patch_resizing.PATCH_METHODS[0]  # Nothing left to resample.

      @jax.jit
      def logits(images, params=params, method=method):
        with posemb.fitted_to_grid('bilinear'), patch_embedding.resampled_patches(method):
          return model.apply({'params': params}, images)

      scores, labels, _ = classifiers.split_logits(config, config.eval_split, logits)
      row.append(f'{np.mean(scores.argmax(-1) == labels):.4f}')
    grid = image_size // patch_size
    print(f'| {image_size}, {patch_size} ({grid}x{grid}) | ' + ' | '.join(row) + ' |')


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else 'workdirs/demo')
