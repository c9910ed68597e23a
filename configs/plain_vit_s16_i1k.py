"""Plain ViT-S/16 on ImageNet-1k from scratch: "Better plain ViT baselines for ImageNet-1k" (Beyer,
Zhai, Kolesnikov 2022), big_vision's configs/vit_s16_i1k.py.

Expected top-1 on ImageNet validation: 76.5% after 90 epochs (6-7 h on a TPU v3-8), 78.5% after 150,
80.0% after 300. Recipe: batch 1024, inception crop + flip + RandAugment(2, 10), Mixup with
Beta(0.2, 0.2) on every batch, global average pooling, fixed 2-D sin-cos position embeddings, a tanh
pre-logits layer, Adam with a bfloat16 first moment, lr 1e-3, 10k warmup steps, cosine decay, decoupled
weight decay 1e-4 (big_vision's wd is not multiplied by the learning rate: here 0.1 x lr 1e-3),
clipping at 1.0; evaluation resizes to 256 and takes the central 224. 1% of train is the minival.

  python -m vit_jax.main --config=configs/plain_vit_s16_i1k.py:90 --workdir=W    # or :150, :300

Differences from big_vision: Mixup pairs each image with the batch reversed (big_vision: rolled by one)
and draws lambda from Beta(0.2, 0.2) without folding it to >= 0.5 (the same distribution of mixes).
"""

from vit_jax import defaults

# epochs -> the published top-1 (%), for the log and the README table.
EXPECTED_TOP1 = {90: 76.5, 150: 78.5, 300: 80.0}


def get_config(epochs: str = '90'):
  if not epochs.isdigit() or int(epochs) not in EXPECTED_TOP1:
    raise ValueError(
        f'Unknown schedule {epochs!r}: use one of {", ".join(map(str, EXPECTED_TOP1))} '
        '(e.g. --config=configs/plain_vit_s16_i1k.py:300)'
    )
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
  config.pp.crop = 'inception'
  config.pp.flip = True
  config.pp.randaug_layers, config.pp.randaug_magnitude = 2, 10
  config.pp_eval.crop, config.pp_eval.crop_fraction = 'central', 224 / 256
  config.mix.mixup_alpha = 0.2

  config.variant = 'ViT-S_16'
  config.model.classifier = 'gap'
  config.model.posemb = 'sincos2d'
  config.model.representation_size = 384
  config.dtype = 'bfloat16'
  config.loss = 'softmax_xent'

  config.batch_size = 1024
  config.num_epochs = float(epochs)
  config.optim.name = 'adamw'
  config.optim.mu_dtype = 'bfloat16'
  config.optim.weight_decay = 0.1
  config.lr.base = 1e-3
  config.lr.warmup_steps = 10_000
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 50
  config.eval_every_steps = 2500
  config.checkpoint_every_steps = 1000
  return config
