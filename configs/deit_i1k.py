"""DeiT-S and DeiT-B on ImageNet-1k from scratch, without distillation: Touvron et al. 2021, "Training
data-efficient image transformers" (facebookresearch/deit main.py defaults, timm's training script).

Expected top-1 on ImageNet validation: DeiT-S 79.8%, DeiT-B 81.8% after 300 epochs (DeiT-B: about 3
days on 8 V100s). Recipe: batch 1024, AdamW lr 5e-4 x 1024 / 512 = 1e-3, weight decay 0.05, 5 warmup
epochs then cosine to 1e-5, no clipping, label smoothing 0.1, RandomResizedCrop + flip + RandAugment
(2 layers, magnitude 9), random erasing 0.25, Mixup 0.8 / CutMix 1.0 (switch 0.5) on every batch,
repeated augmentation (3 copies of each image in a batch), stochastic depth 0.1, class token, learned position embeddings, no pre-logits layer; evaluation at the
0.875 central crop.

  python -m vit_jax.main --config=configs/deit_i1k.py:S --workdir=W    # or :B

Differences from DeiT: RandAugment is the TF reference's op set (big_vision's) at a fixed magnitude,
not timm's rand-m9-mstd0.5-inc1 (magnitude noise, "increasing" ops); repeated augmentation shows each
image three times in a row, each pass over the split in three epochs (DeiT's RASampler draws a third
of the split anew each epoch); the crop is resized bilinearly (DeiT's bicubically); weights
initialised as the original ViT (xavier), not truncated normal.
"""

from vit_jax import defaults

# size -> (variant, published top-1 %).
SIZES = {'S': ('ViT-S_16', 79.8), 'B': ('ViT-B_16', 81.8)}
_TRAIN_IMAGES = 1_281_167


def get_config(size: str = 'S'):
  if size not in SIZES:
    raise ValueError(
        f'Unknown DeiT size {size!r}: use one of {", ".join(SIZES)} '
        '(e.g. --config=configs/deit_i1k.py:B)'
    )
  config = defaults.get_config()
  config.dataset = 'imagenet2012'
  config.train_split = 'train'
  config.eval_split = 'validation'
  # ImageNet-V2 (tfds imagenet_v2, prepared beside imagenet2012): the same classes, new images.
  config.evals.v2 = dict(
      type='classification', dataset='imagenet_v2', split='test', every_steps=2500
  )
  # ImageNet-ReaL (tfds imagenet2012_real): the validation images' reassessed label sets.
  config.evals.real = dict(
      type='real', dataset='imagenet2012_real', split='validation', every_steps=2500
  )
  config.image_size = 224
  config.pp.crop = 'random_resized'  # torchvision's RandomResizedCrop, as DeiT (timm) samples it.
  config.pp.min_area = 0.08
  config.pp.flip = True
  config.pp.randaug_layers, config.pp.randaug_magnitude = 2, 9
  config.pp.erase_prob = 0.25
  config.aug_repeats = 3  # DeiT's --repeated-aug (RASampler, 3 repeats).
  config.pp_eval.crop, config.pp_eval.crop_fraction = 'central', 0.875
  config.mix.mixup_alpha, config.mix.cutmix_alpha = 0.8, 1.0
  config.mix.prob, config.mix.switch_prob = 1.0, 0.5
  config.label_smoothing = 0.1

  config.variant = SIZES[size][0]
  config.model.classifier = 'token'
  config.model.drop_path_rate = 0.1
  config.dtype = 'bfloat16'

  config.batch_size = 1024
  config.num_epochs = 300.0
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.05
  config.lr.base = 1e-3
  config.lr.warmup_steps = round(5 * _TRAIN_IMAGES / config.batch_size)
  config.lr.decay = 'cosine'
  config.lr.end = 1e-5
  config.grad_clip_norm = 0.0

  config.log_every_steps = 100
  config.eval_every_steps = 2500
  config.checkpoint_every_steps = 1000
  return config
