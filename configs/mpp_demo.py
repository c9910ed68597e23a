"""Masked patch prediction (self-supervised) pretraining of the demo ViT on the bundled digits.

  python -m vit_jax.main --config=configs/mpp_demo.py --workdir=workdirs/mpp_demo
  python -m vit_jax.main --config=configs/demo.py --workdir=workdirs/demo_from_mpp \
      --config.init_from=workdirs/mpp_demo --config.total_steps=500

Labels are not used: the model predicts the 3-bit mean colour of corrupted patches (paper Sec. 4.6).
Its eval_top1 is the colour-class accuracy on corrupted patches of the test images.
"""

from configs import demo


def get_config():
  config = demo.get_config()
  config.task = 'mpp'
  # No head to drop the features of: the dropout acts inside the encoder, the original ViT's.
  config.model.head_dropout_rate = None
  config.model.dropout_rate = 0.1
  config.label_smoothing = 0.0
  config.total_steps = 1000
  return config
