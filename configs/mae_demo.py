"""Masked autoencoder (self-supervised) pretraining of the demo ViT on the bundled digits, then its
fine-tuning on the labels:

  python -m vit_jax.main --config=configs/mae_demo.py --workdir=workdirs/mae_demo
  python -m vit_jax.main --config=configs/demo.py --workdir=workdirs/demo_from_mae \
      --config.init_from=workdirs/mae_demo --config.total_steps=500

Labels are not used: the encoder sees a quarter of each image's 16 patches and the decoder predicts
the others' pixels (MAE, He et al. 2022). Its eval_loss is that error on the test images, each hiding
the patches its own pixels draw; a decoder that predicts nothing (zeros) scores about 1.
"""

from configs import demo


def get_config():
  config = demo.get_config()
  config.task = 'mae'
  config.model.head_dropout_rate = None  # No head: MAE pretrains without dropout.
  config.label_smoothing = 0.0
  # The decoder, MAE's shape made smaller: narrower and shallower than the encoder.
  config.mae.decoder_hidden_size = 32
  config.mae.decoder_num_layers = 2
  config.mae.decoder_num_heads = 4
  config.mae.decoder_mlp_dim = 64
  config.optim.b2 = 0.95  # MAE's AdamW betas (0.9, 0.95).
  config.total_steps = 2000
  return config
