"""ViT-B/16 pretrained as a masked autoencoder on ImageNet-1k's images (He et al. 2022, "Masked
Autoencoders Are Scalable Vision Learners", Appendix A.1, Table 8): no labels are used.

75% of each image's 196 patches hidden; a decoder of 8 blocks of width 512 (16 heads) predicts their
pixels, each patch normalised by its own mean and standard deviation (norm_pix_loss). AdamW (0.9, 0.95),
weight decay 0.05, batch 4096, learning rate 1.5e-4 x 4096 / 256 = 2.4e-3 after 40 warmup epochs, cosine
decay, 1600 epochs (800 for the paper's ablations), random resized crops of 20-100% of the area and
flips, no dropout, no gradient clipping, MAE's fixed 2-D sin-cos position embeddings in the encoder
and the decoder ('sincos2d_mae'). Ours differ in the initialisation (model.weight_init='original':
Xavier-uniform matrices, as MAE's, but a LeCun-normal patch embedding).

  python -m vit_jax.main --config=configs/mae_vit_b16_i1k.py --workdir=gs://bucket/mae_b16
  python -m vit_jax.main --config=configs/finetune_layer_decay.py:mae --workdir=W \\
      --config.init_from=gs://bucket/mae_b16

The fine-tuning (MAE's Table 9, 83.6% top-1 in 100 epochs from the paper's weights) keeps the
encoder, whose model its variant='checkpoint' reads from the run, and drops the decoder. Its
eval_loss is the reconstruction error of the validation images.
"""

from vit_jax import defaults

_TRAIN_IMAGES = 1_281_167
_BATCH = 4096


def get_config():
  config = defaults.get_config()
  config.task = 'mae'
  config.dataset = 'imagenet2012'
  config.train_split = 'train'
  config.eval_split = 'validation'
  config.image_size = 224
  config.pp.crop = 'random_resized'
  config.pp.min_area = 0.2
  config.pp.flip = True

  config.variant = 'ViT-B_16'
  config.model.posemb = 'sincos2d_mae'
  config.dtype = 'bfloat16'
  config.label_smoothing = 0.0
  config.mae.mask_ratio = 0.75
  config.mae.norm_pix_loss = True
  config.mae.decoder_hidden_size = 512
  config.mae.decoder_num_layers = 8
  config.mae.decoder_num_heads = 16
  config.mae.decoder_mlp_dim = 2048
  config.mae.decoder_posemb = 'sincos2d_mae'

  config.batch_size = _BATCH
  config.num_epochs = 1600.0
  config.optim.name = 'adamw'
  config.optim.b2 = 0.95
  config.optim.weight_decay = 0.05
  config.lr.base = 1.5e-4 * _BATCH / 256
  config.lr.warmup_steps = 40 * _TRAIN_IMAGES // _BATCH
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 0.0

  config.log_every_steps = 100
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 2000
  return config
