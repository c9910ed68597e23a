"""ViT-B/16 pretrained on ImageNet-21k with AugReg's "medium2" augmentation: Steiner et al. 2021, "How
to train your ViT? Data, Augmentation, and Regularization in Vision Transformers", as big_vision's
configs/vit_i21k.py (its aug='medium2' setting).

Expected: the AugReg ViT-B/16 ImageNet-21k checkpoints (B_16-i21k-300ep-lr_0.001-aug_medium2-...npz);
their fine-tuned ImageNet-1k accuracy is in the paper's Table and Fig. 4 (not reproduced here: it
needs ImageNet-21k and a pod, ~a few TPU v3-core-months for 300 epochs). Recipe: batch 4096, sigmoid
cross-entropy, inception crop + flip + RandAugment(2, 15), Mixup Beta(0.5, 0.5) on every batch,
global average pooling, learned position embeddings, Adam with a bfloat16 first moment, lr 1e-3, 10k
warmup, cosine, decoupled weight decay 1e-4 (0.1 x lr), clipping at 1.0; no dropout and no stochastic
depth (big_vision: they did not help ImageNet-21k pretraining). 51,200 images of 'full' are held out.

  python -m vit_jax.main --config=configs/augreg_b16_i21k.py --workdir=gs://bucket/augreg_b16

The head starts at a bias of -10 (big_vision's init_head_bias), so the sigmoid loss over ~21k
classes starts near each class's rarity. Difference from big_vision: Mixup pairs each image with the
batch reversed (big_vision: rolled by one).
"""

from vit_jax import defaults


def get_config():
  config = defaults.get_config()
  config.dataset = 'imagenet21k'
  config.train_split = 'full[51200:]'
  config.eval_split = 'full[:25600]'
  config.evals.val = dict(type='classification', split='full[25600:51200]', every_steps=10_000)
  config.image_size = 224
  config.pp.crop = 'inception'
  config.pp.flip = True
  config.pp.randaug_layers, config.pp.randaug_magnitude = 2, 15
  config.pp_eval.crop, config.pp_eval.crop_fraction = 'central', 224 / 256
  config.mix.mixup_alpha = 0.5

  config.variant = 'ViT-B_16'
  config.model.classifier = 'gap'
  config.dtype = 'bfloat16'
  config.loss = 'sigmoid_xent'
  config.model.head_bias_init = -10.0

  config.batch_size = 4096
  config.num_epochs = 300.0
  config.optim.name = 'adamw'
  config.optim.mu_dtype = 'bfloat16'
  config.optim.weight_decay = 0.1
  config.lr.base = 1e-3
  config.lr.warmup_steps = 10_000
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 100
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  config.fewshot.every_steps = 25_000
  return config
