"""The demo as a FlexiViT (Beyer et al. 2023): each step cuts the 16 px digits into patches of 2, 4
or 8 px (8x8, 4x4 or 2x2 tokens), so that one model serves all three; the parameters are kept at
patch 4 (configs/demo.py's) and resampled to each step's size (vit_jax/train/flexi.py).

python -m vit_jax.main --config=configs/demo_flexi.py --workdir=workdirs/demo_flexi

`eval` measures patch 4; `p2` and `p8` the other two (benchmarks/RESULTS.md compares them with the
demo's, trained at 4 alone).
"""

from configs import demo


def get_config():
  config = demo.get_config()
  config.flexi.patch_sizes = (2, 4, 8)
  for size in (2, 8):
    config.evals[f'p{size}'] = dict(
        type='classification', split='test', patch_size=size, every_steps=config.eval_every_steps
    )
  return config
