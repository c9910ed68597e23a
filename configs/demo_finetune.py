"""Fine-tunes the demo's checkpoint at a higher resolution, the paper's recipe in miniature, on CPU.

  make demo                                  # first: trains workdirs/demo at 16x16 (4x4 patches)
  python -m vit_jax.main --config=configs/demo_finetune.py --workdir=workdirs/demo_finetune

The 4x4 grid of position embeddings is interpolated to 6x6 for 24x24 inputs, the head is replaced by a
zero-initialised one, and SGD with momentum and cosine decay trains the whole model.
"""

from configs import demo


def get_config():
  config = demo.get_config()
  config.init_from = 'workdirs/demo'
  config.image_size = 24
  config.optim.name = 'sgd'
  config.optim.momentum = 0.9
  config.optim.weight_decay = 0.0
  config.lr.base = 0.03
  config.lr.warmup_steps = 20
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0
  config.total_steps = 500
  config.polyak_decay = 0.99
  config.log_every_steps = 50
  config.eval_every_steps = 100
  config.checkpoint_every_steps = 100
  return config
