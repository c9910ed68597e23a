"""Fine-tune a downloaded EVA-02 (Fang et al. 2024: SwiGLU MLPs, 2-D rotary position embeddings, no
key bias) on a downstream dataset at 224 px: the recipe of configs/finetune_downloaded.py.

  hf download timm/eva02_small_patch14_224.mim_in22k --local-dir checkpoints/eva02   # 88 MB
  python -m vit_jax.main --config=configs/finetune_eva02.py:cifar10 --workdir=W \\
      --config.init_from=checkpoints/eva02

Reads timm's eva02_* models (model.safetensors + config.json; the EVA-02 CLIP image towers too, with
the LayerNorm inside their attention: model.attn_norm) and timm's vit_*_patch16_rope_* ViTs. The
rotary embeddings are measured on the 16x16 grid they were pretrained on at any resolution, as
timm's.
Datasets and steps: configs/finetune.py's. Cost (the planner's estimate for EVA-02 S/14, 22M
parameters, 256 patches an image, not a measurement): 0.048 s a step on one H100 at 40% MFU, 8 minutes
for CIFAR's 10,000 steps, 41 GiB without remat; `python -m vit_jax.tools.plan --config=...
--chip=... --config.init_from=checkpoints/eva02` for another chip or size.
"""

from configs import finetune_downloaded


def get_config(dataset: str = 'cifar10'):
  return finetune_downloaded.get_config('eva02', dataset)
