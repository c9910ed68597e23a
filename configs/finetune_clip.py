"""Fine-tune a downloaded CLIP image tower (Radford et al. 2021: a LayerNorm before the blocks,
quick GELU in OpenAI's) on a downstream dataset at 224 px: the recipe of
configs/finetune_downloaded.py, FT-CLIP's in its main lines (AdamW, layer decay, weight decay 0.05).

  hf download timm/vit_base_patch16_clip_224.openai --local-dir checkpoints/clip   # 350 MB
  python -m vit_jax.main --config=configs/finetune_clip.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/clip

Reads timm's vit_*_clip_* and *_clip_quickgelu_* and transformers' CLIPVisionModel directories.
Datasets and steps: configs/finetune.py's. Cost (the planner's estimate for ViT-B/16, 87M
parameters, not a measurement): 0.136 s a step on one H100 at 40% MFU, 23 minutes for CIFAR's 10,000
steps, 63 GiB without remat; `python -m vit_jax.tools.plan --config=... --chip=...` for another.
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('clip', dataset)
