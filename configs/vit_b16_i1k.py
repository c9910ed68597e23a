"""ViT-B/16 pretrained from scratch on ImageNet-1k, the paper's recipe (Sec. 4.1, Appendix B.1).

Adam (b1 0.9, b2 0.999), weight decay 0.1, batch 4096, 10k steps of linear warmup then linear decay,
224 px, inception crop + flip, tanh pre-logits layer, dropout 0.1, 300 epochs. For TPU/GPU hardware:
  python -m vit_jax.main --config=configs/vit_b16_i1k.py --workdir=gs://bucket/vit_b16_i1k
"""

from vit_jax import defaults


def get_config():
  config = defaults.get_config()
  config.dataset = 'imagenet2012'
  config.train_split = 'train[:99%]'  # The paper holds out 1% of train for model selection.
  config.eval_split = 'validation'
  config.image_size = 224
  config.pp.crop = 'inception'
  config.pp.flip = True

  config.variant = 'ViT-B_16'
  config.model.representation_size = 768
  config.model.dropout_rate = 0.1
  config.dtype = 'bfloat16'

  config.batch_size = 4096
  config.num_epochs = 300.0
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.1
  config.lr.base = 3e-3
  config.lr.warmup_steps = 10_000
  config.lr.decay = 'linear'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2000
  return config
