"""Fine-tune a downloaded SigLIP image tower (Zhai et al. 2023: no class token, attention pooling)
on a downstream dataset at 224 px: the recipe of configs/finetune_downloaded.py.

  hf download timm/vit_base_patch16_siglip_224.webli --local-dir checkpoints/siglip   # 370 MB
  python -m vit_jax.main --config=configs/finetune_siglip.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/siglip

Reads timm's vit_*_siglip_* (its attn_pool is our MAP head; SigLIP 2's too) and the image towers of
transformers' SiglipModel and Siglip2Model directories. Datasets and steps: configs/finetune.py's. Cost (the planner's estimate for ViT-B/16,
94M parameters, not a measurement): 0.136 s a step on one H100 at 40% MFU, 23 minutes for CIFAR's
10,000 steps, 63 GiB without remat; `python -m vit_jax.tools.plan --config=... --chip=...` for
another.
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('siglip', dataset)
