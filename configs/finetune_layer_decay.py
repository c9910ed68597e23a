"""Fine-tune a pretrained ViT-B/16 on ImageNet-1k at 224 px with layer-wise learning-rate decay: the
BEiT / MAE fine-tuning recipe (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners",
Table 9 / main_finetune.py).

`:npz` (default): the original ImageNet-21k ViT-B_16.npz, class-token pooled; not measured here.
`:mae`: MAE's own weights (timm/vit_base_patch16_224.mae or facebook/vit-mae-base, downloaded as in
configs/finetune_mae.py), pooled as MAE fine-tunes them: the patches' mean and a new LayerNorm after
it (model.classifier='gap', fc_norm=True); MAE reports 83.6% top-1 in 100 epochs. Recipe: batch 1024,
AdamW (0.9, 0.999) lr 5e-4 x 1024 / 256 = 2e-3, layer decay 0.65 (block i of 12 learns at
0.65^(12 - i) of the rate, the embeddings at 0.65^13, the head at 1), weight decay 0.05, 5 warmup
epochs then cosine, label smoothing 0.1, RandomResizedCrop, RandAugment(2, 9), random erasing 0.25,
Mixup 0.8 / CutMix 1.0, stochastic depth 0.1, central 0.875 crop for evaluation. Differences from
MAE's: RandAugment is the TF reference's op set at a fixed magnitude (timm's rand-m9-mstd0.5-inc1
in MAE), and crops are resized bilinearly (bicubically in MAE).

  python -m vit_jax.main --config=configs/finetune_layer_decay.py --workdir=W \\
      --config.init_from=/path/to/ViT-B_16.npz
  python -m vit_jax.main --config=configs/finetune_layer_decay.py:mae --workdir=W \\
      --config.init_from=checkpoints/mae
"""

from vit_jax import defaults

_TRAIN_IMAGES = 1_281_167 * 99 // 100


def get_config(weights: str = 'npz'):
  if weights not in ('npz', 'mae'):
    raise ValueError(f'Unknown weights {weights!r}: use npz (ViT-B_16.npz) or mae')
  config = defaults.get_config()
  config.dataset = 'imagenet2012'
  config.train_split = 'train[:99%]'
  config.eval_split = 'validation'
  config.evals.minival = dict(type='classification', split='train[99%:]', every_steps=2500)
  # ImageNet-V2 (tfds imagenet_v2, prepared beside imagenet2012): the same classes, new images.
  config.evals.v2 = dict(
      type='classification', dataset='imagenet_v2', split='test', every_steps=2500
  )
  # ImageNet-ReaL (tfds imagenet2012_real): the validation images' reassessed label sets.
  config.evals.real = dict(
      type='real', dataset='imagenet2012_real', split='validation', every_steps=2500
  )
  config.image_size = 224
  config.pp.crop = 'random_resized'  # MAE's RandomResizedCrop (timm's), at its scale (0.08, 1).
  config.pp.min_area = 0.08
  config.pp.flip = True
  config.pp.randaug_layers, config.pp.randaug_magnitude = 2, 9
  config.pp.erase_prob = 0.25
  config.pp_eval.crop, config.pp_eval.crop_fraction = 'central', 0.875
  config.mix.mixup_alpha, config.mix.cutmix_alpha = 0.8, 1.0
  config.label_smoothing = 0.1

  if weights == 'mae':
    config.variant = 'checkpoint'  # ViT-B/16 as the checkpoint says (vit_variants.FROM_CHECKPOINT).
    config.init_from = 'checkpoints/mae'  # Set it: --config.init_from=/path/to/downloaded/dir.
    config.model.classifier = 'gap'
    config.model.class_token = True  # MAE's, kept in the sequence and not pooled.
    config.model.fc_norm = True
  else:
    config.variant = 'ViT-B_16'
    config.init_from = 'ViT-B_16.npz'  # Set it to the pretrained checkpoint: an .npz or a workdir.
  config.model.drop_path_rate = 0.1
  config.dtype = 'bfloat16'

  config.batch_size = 1024
  config.num_epochs = 100.0
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.05
  config.optim.layer_decay = 0.65
  config.lr.base = 2e-3
  config.lr.warmup_steps = round(5 * _TRAIN_IMAGES / config.batch_size)
  config.lr.decay = 'cosine'
  config.lr.end = 1e-6
  config.grad_clip_norm = 0.0
  config.polyak_decay = None

  config.log_every_steps = 100
  config.eval_every_steps = 2500
  config.checkpoint_every_steps = 1000
  return config
