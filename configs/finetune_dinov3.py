"""Fine-tune a downloaded DINOv3 (Siméoni et al. 2025: rotary position embeddings over [-1, 1] at any
resolution, 4 registers, layer scale, no key bias) on a downstream dataset at 224 px: the recipe of
configs/finetune_downloaded.py.

  hf download timm/vit_small_patch16_dinov3.lvd1689m --local-dir checkpoints/dinov3   # ~22M params
  python -m vit_jax.main --config=configs/finetune_dinov3.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/dinov3

Reads timm's vit_*_patch16_dinov3 and vit_*_patch16_dinov3_qkvb (model.safetensors + config.json)
and transformers' DINOv3ViTModel directories (facebook/dinov3-vit*, their gated MLPs too); its
rotary embeddings need no resizing at another resolution. Datasets and steps: configs/finetune.py's.
Cost: `python -m vit_jax.tools.plan --config=configs/finetune_dinov3.py:cifar10 --chip=...
--config.init_from=checkpoints/dinov3` (the planner's estimate, not a measurement).
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('dinov3', dataset)
