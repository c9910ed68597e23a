"""Fine-tune a downloaded ViT with low-rank adapters (LoRA, Hu et al. 2021): `:FAMILY,DATASET`, the
families and datasets of configs/finetune_downloaded.py (dinov2, dinov3, siglip, clip, eva02, mae;
cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012).

  hf download timm/vit_small_patch14_dinov2.lvd142m --local-dir checkpoints/dinov2
  python -m vit_jax.main --config=configs/finetune_lora.py:dinov2,cifar10 --workdir=W \\
      --config.init_from=checkpoints/dinov2

The pretrained weights stay as downloaded: every block's query and value projections learn a
rank-16 update (alpha 16, dropout 0.1 of its input) and the new head trains, as Hugging Face
peft's ViT image-classification example and the adapters shared on the hub for it do
(LoraConfig(r=16, lora_alpha=16, target_modules=['query', 'value'], lora_dropout=0.1,
modules_to_save=['classifier'])). A ViT-B/16 then trains 0.6M parameters of its 86M (the head's
too), its AdamW state is theirs alone, and each step computes no gradient of the frozen weights
(0.68x full fine-tuning's FLOPs). The rest is configs/finetune_downloaded.py's recipe without
layer-wise decay or Polyak averaging, at peft's example's learning rate, 5e-3. Export folds the
adapters into the kernels: a plain ViT for timm, predict and a later run; from a timm checkpoint it
also writes them as peft's adapters over it, E/peft (docs/finetuning.md).
"""

import ml_collections

from configs import finetune_downloaded


def get_config(family_and_dataset: str = 'dinov2,cifar10') -> ml_collections.ConfigDict:
  family, _, dataset = family_and_dataset.partition(',')
  config = finetune_downloaded.get_config(family, dataset or 'cifar10')
  config.model.lora_rank = 16
  config.model.lora_alpha = 16.0
  config.model.lora_dropout = 0.1
  config.model.lora_targets = ('query', 'value')
  config.optim.layer_decay = None
  config.lr.base = 5e-3
  # None, as peft's recipe. One (--config.polyak_decay=0.999) would average what trains alone.
  config.polyak_decay = None
  return config
