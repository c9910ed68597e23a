"""A BiT ResNet-v2 pretrained on ImageNet-21k with the ViTs' recipe: the paper's ResNet baselines
(Sec. 4.1: all models, ResNets included, are trained with Adam; Table 3's rows for R50x{1,2}, R101x1,
R152x{1,2}: batch 4096, weight decay 0.1, linear decay, lr 1e-3 / 8e-4 / 6e-4 by depth).

  python -m vit_jax.main --config=configs/bit_i21k.py:BiT-R50x1 --workdir=gs://bucket/bit_r50x1_i21k
"""

from vit_jax import defaults

LR = {50: 1e-3, 101: 8e-4, 152: 6e-4}  # Table 3, by depth.


def get_config(variant: str = 'BiT-R50x1'):
  config = defaults.get_config()
  # As configs/vit_l16_i21k.py: the first 51200 images of 'full' are held out for evaluation.
  config.dataset = 'imagenet21k'
  config.train_split = 'full[51200:]'
  config.eval_split = 'full[:51200]'
  config.image_size = 224
  config.pp.crop = 'inception'
  config.pp.flip = True

  config.variant = variant
  config.dtype = 'bfloat16'

  config.batch_size = 4096
  config.num_epochs = 90.0
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.1
  depth = variant.removeprefix('BiT-R').split('x')[0]
  if not depth.isdigit() or int(depth) not in LR:
    raise ValueError(
        f'configs/bit_i21k.py:{variant}: use a BiT-R{{{",".join(map(str, LR))}}}x<width> '
        'variant, e.g. configs/bit_i21k.py:BiT-R50x1'
    )
  config.lr.base = LR[int(depth)]
  config.lr.warmup_steps = 10_000
  config.lr.decay = 'linear'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 100
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
