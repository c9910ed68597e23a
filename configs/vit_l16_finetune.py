"""Fine-tune ViT-L/16 on a downstream dataset: 384px, and 512px on ImageNet as in the paper's Table 2.

  python -m vit_jax.main --config=configs/vit_l16_finetune.py:imagenet2012 --workdir=W \\
      --config.init_from=/path/to/ViT-L_16.npz
"""

from configs import finetune


def get_config(dataset: str = 'cifar10'):
  return finetune.get_config('ViT-L_16', dataset, imagenet_resolution=512)
