"""Fine-tune ViT-B/16 (e.g. the published ImageNet-21k ViT-B_16.npz) on a downstream dataset at 384px.

  python -m vit_jax.main --config=configs/vit_b16_finetune.py:cifar10 --workdir=W \\
      --config.init_from=/path/to/ViT-B_16.npz

Datasets: cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012 (see configs/finetune.py).
"""

from configs import finetune


def get_config(dataset: str = 'cifar10'):
  return finetune.get_config('ViT-B_16', dataset)
