"""Fine-tune a downloaded DINOv2 (Oquab et al. 2023; with registers: Darcet et al. 2024) on a
downstream dataset at 224 px: the recipe of configs/finetune_downloaded.py.

  hf download timm/vit_small_patch14_dinov2.lvd142m --local-dir checkpoints/dinov2   # 88 MB
  python -m vit_jax.main --config=configs/finetune_dinov2.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/dinov2

Reads timm's vit_*_patch14_dinov2 and vit_*_patch14_reg4_dinov2 (model.safetensors + config.json),
and transformers' Dinov2Model / Dinov2WithRegistersModel directories (facebook/dinov2-*). Datasets:
cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012 (configs/finetune.py's steps:
10,000 of batch 512 for CIFAR, 500 for the pets and flowers). Cost (the planner's estimate for
ViT-S/14, 22M parameters, 256 patches an image, not a measurement): 0.048 s a step on one H100 at
40% MFU, 8 minutes for CIFAR's 10,000 steps, 44 GiB without remat; `python -m vit_jax.tools.plan
--config=... --chip=... --config.init_from=checkpoints/dinov2` for another chip or size.
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('dinov2', dataset)
