"""ViT-L/16 pretrained on ImageNet-21k, the paper's recipe (Sec. 4.1, Appendix B.1).

Adam (b1 0.9, b2 0.999), weight decay 0.1, batch 4096, 10k steps of linear warmup then linear decay,
lr 1e-3, 224 px, inception crop + flip, tanh pre-logits layer, dropout 0.1, 90 epochs. For a pod slice:
  python -m vit_jax.main --config=configs/vit_l16_i21k.py --workdir=gs://bucket/vit_l16_i21k
Without TensorFlow, from the hub's WebDataset copy of ImageNet-21k (fall11's 21841 classes, with a
validation split; download it once, `hf download --repo-type dataset timm/imagenet-22k-wds
--local-dir DIR`, or copy it to a bucket; docs/data.md), add
  --config.dataset=huggingface --config.data_dir=DIR --config.label_feature=cls
  --config.train_split=train --config.eval_split=validation
"""

from vit_jax import defaults


def get_config():
  config = defaults.get_config()
  # big_vision's tfds ImageNet-21k: tfds has no public builder for it, so set config.data_dir to
  # where it was prepared (or use the hub's copy, above). The first 51200 images of 'full' are held
  # out for evaluation, as big_vision does.
  config.dataset = 'imagenet21k'
  config.train_split = 'full[51200:]'
  config.eval_split = 'full[:51200]'
  config.image_size = 224
  config.pp.crop = 'inception'
  config.pp.flip = True

  config.variant = 'ViT-L_16'
  config.model.representation_size = 1024
  config.model.dropout_rate = 0.1
  config.dtype = 'bfloat16'

  config.batch_size = 4096
  config.num_epochs = 90.0
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.1
  config.lr.base = 1e-3
  config.lr.warmup_steps = 10_000
  config.lr.decay = 'linear'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 100
  config.eval_every_steps = 10_000
  config.checkpoint_every_steps = 2000
  return config
