"""VTAB-1k fine-tuning, the paper's protocol (Sec. 4.2, Appendix B.1.1, Table 4): one task a run.

  # Sweep phase: train on train800, val200 top-1 every 500 steps (val200_top1), test at the end.
  python -m vit_jax.main --config=configs/vtab.py:cifar100 --workdir=runs/vtab/cifar100 \\
      --config.init_from=ViT-B_16.npz
  # Final run at the chosen learning rate: train on train800val200 (1000 images), test at the end.
  python -m vit_jax.main --config=configs/vtab.py:cifar100,final --config.lr.base=0.01 \\
      --workdir=runs/vtab/cifar100_final --config.init_from=ViT-B_16.npz

The argument is a task of vit_jax/data/vtab.py, optionally followed by ',final'. Natural: caltech101,
cifar100, dtd, flowers102, pets, sun397, svhn; specialized: camelyon, eurosat, resisc45,
retinopathy; structured: clevr_count, clevr_dist, dmlab, dsprites_loc, dsprites_ori, kitti_dist,
smallnorb_azim, smallnorb_elev. eval_top1 is the test accuracy in both phases.

The recipe is the paper's for every task: SGD with momentum 0.9, batch 512, 2500 steps, cosine decay
after 500 warmup steps, no weight decay, clipping at global norm 1, lr 0.01 (the paper's one setting
for all tasks, chosen on the val200 sets; configs/sweeps/vtab_lr.py sweeps 0.001-0.03 per task),
384 px for every task, and the preprocessing of BiT (Kolesnikov et al. 2020) that the paper follows: a
random crop and flip where they keep the label, a plain resize where they do not and for evaluation.
`python -m vit_jax.tools.vtab ROOT` makes the table of a sweep's runs.
"""

import ml_collections

from vit_jax import defaults
from vit_jax.data import vtab

# BiT takes 480 px crops of 512 px images: shifts of up to 1/16 of the image, here by padding.
_CROP_PAD_FRACTION = 1 / 16


def get_config(arg: str = 'cifar100') -> ml_collections.ConfigDict:
  name, _, phase = arg.partition(',')
  task = vtab.get(name)
  if phase not in ('', 'final'):
    raise ValueError(
        f'Unknown VTAB phase {phase!r} in {arg!r}: use {name} (train800, val200, test) '
        f'or {name},final (train800val200, test)'
    )
  config = defaults.get_config()
  config.dataset = f'vtab/{name}'
  config.train_split = task.splits['train800val200' if phase == 'final' else 'train800']
  config.eval_split = task.splits['test']
  if phase != 'final':  # Its val200 images are the final run's training images.
    config.evals.val200 = dict(type='classification', split=task.splits['val200'], every_steps=500)
  config.image_size = 384
  config.pp.crop = 'random' if task.crop else 'resize'
  config.pp.pad = round(config.image_size * _CROP_PAD_FRACTION) if task.crop else 0  # Of the crop.
  config.pp.flip = task.flip

  config.variant = 'ViT-B_16'
  # Set it to the pretrained checkpoint: an .npz in the original layout or a vit_jax workdir.
  config.init_from = 'ViT-B_16.npz'
  config.dtype = 'bfloat16'

  config.batch_size = 512
  config.eval_batch_size = 512
  config.total_steps = 2500
  config.optim.name = 'sgd'
  config.optim.momentum = 0.9
  config.optim.weight_decay = 0.0
  config.lr.base = 0.01
  config.lr.warmup_steps = 500
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 50
  config.eval_every_steps = config.total_steps  # The test split once, at the end.
  config.checkpoint_every_steps = 500
  return config
