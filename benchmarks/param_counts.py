"""Parameter counts of the variants at 224 px with a 1000-class head (paper Table 1, plus the hybrid and
the BiT baselines).

  python benchmarks/param_counts.py
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.models import variants  # pylint: disable=wrong-import-position

VARIANTS = (
    'ViT-Ti_16',
    'ViT-S_16',
    'ViT-B_16',
    'ViT-B_32',
    'ViT-L_16',
    'ViT-H_14',
    'R50+ViT-B_16',
    'BiT-R50x1',
    'BiT-R101x3',
    'BiT-R152x4',
)


def count(variant: str, num_classes: int = 1000, image_size: int = 224) -> int:
  model = variants.make_model(variant, num_classes=num_classes, dtype=jnp.float32)
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, image_size, image_size, 3)))
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(shapes)))


def main() -> None:
  print('| variant | parameters (1000 classes, 224 px) |')
  print('|---|---|')
  for variant in VARIANTS:
    print(f'| {variant} | {count(variant) / 1e6:.1f}M |')


if __name__ == '__main__':
  main()
