"""Continue the pretraining of a downloaded masked autoencoder on your own images: transformers'
ViTMAEForPreTraining (the hub's facebook/vit-mae-base, -large, -huge: MAE's published encoder and
pixel decoder), its architecture read from the files (`variant='checkpoint'`), trained on as
configs/mae_vit_b16_i1k.py trains (config.task='mae').

  hf download facebook/vit-mae-base --local-dir checkpoints/vit-mae-base
  python -m vit_jax.main --config=configs/mae_continue.py --workdir=W \\
      --config.init_from=checkpoints/vit-mae-base --config.dataset=folder \\
      --config.data_dir=/path/to/images --config.num_epochs=100 --config.lr.warmup_steps=2000

The checkpoint's position embeddings (MAE's fixed sin-cos values, tensors of the file) are kept
fixed, as MAE keeps them: `optim.frozen`. Its decoder's shape (8 blocks of width 512, 16 heads, MLP 2048 for
all three sizes) is config.mae's default; another is a one-line error naming the field to set. The
schedule is MAE's (batch 4096, lr 2.4e-3, 40 ImageNet epochs of warmup): set num_epochs and
lr.warmup_steps for your data. Fine-tune the result as configs/mae_vit_b16_i1k.py's runs
(docs/recipes.md).

From an encoder alone (timm's vit_*_patch16_224.mae, another ViT's checkpoint, a vit_jax run's
workdir), the decoder starts as a run from scratch with config.seed draws it: add
--config.mae.decoder_posemb=sincos2d_mae for fixed position embeddings there too (a learned one would
start random and stay frozen).
"""

from configs import mae_vit_b16_i1k


def get_config():
  config = mae_vit_b16_i1k.get_config()
  config.variant = 'checkpoint'
  config.init_from = (
      'checkpoints/vit-mae-base'  # Set it: --config.init_from=/path/to/downloaded/dir.
  )
  config.model.posemb = None  # The checkpoint's: learned-layout tensors holding MAE's fixed values.
  config.mae.decoder_posemb = 'learn'
  config.optim.frozen = ('(^|/)posembed_input/',)  # The encoder's and the decoder's.
  return config
