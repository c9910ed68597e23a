"""Fine-tune a downloaded masked autoencoder (He et al. 2022, "Masked Autoencoders Are Scalable Vision
Learners": its pretrained encoder) on a downstream dataset at 224 px: the recipe of
configs/finetune_downloaded.py, pooled as MAE fine-tunes: the patches' mean with a new LayerNorm after
it (model.classifier='gap', fc_norm=True; the class token stays in the sequence, unpooled).

  hf download timm/vit_base_patch16_224.mae --local-dir checkpoints/mae   # ~86M params
  python -m vit_jax.main --config=configs/finetune_mae.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/mae

Reads timm's vit_*_patch16_224.mae (model.safetensors + config.json) and transformers'
ViTMAEForPreTraining directories (facebook/vit-mae-*; the pixel decoder is dropped). The paper's
ImageNet recipe differs from the shared one in its learning rate (5e-4 x batch / 256), layer decay
(0.75 for L and H) and augmentations (RandAugment, Mixup, CutMix, erasing): set them with
--config.* (docs/recipes.md). Datasets and steps: configs/finetune.py's. Cost:
`python -m vit_jax.tools.plan --config=configs/finetune_mae.py:cifar10 --chip=...
--config.init_from=checkpoints/mae` (the planner's estimate, not a measurement).
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('mae', dataset)
