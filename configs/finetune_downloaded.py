"""Fine-tuning a ViT downloaded from the Hugging Face hub (timm's or transformers' weights), shared
by configs/finetune_dinov2.py, finetune_dinov3.py, finetune_siglip.py, finetune_clip.py,
finetune_eva02.py and finetune_mae.py.

The model is `variant='checkpoint'`: every architecture field (sizes, heads, layer scale, registers,
pooling, activation, LayerNorm epsilon, rotary embeddings, SwiGLU) is read from the downloaded
directory's tensors and config.json, so none is spelt here. The recipe is today's for fine-tuning such backbones (BEiT / MAE
style, as timm and FT-CLIP use): AdamW with layer-wise learning-rate decay, weight decay 0.05,
stochastic depth 0.1, label smoothing 0.1, cosine decay after a warmup, 224 px, Polyak averaging.
The position embeddings are resized to 224 px's patch grid (DINOv2's 518 px grid of 37x37 to 16x16)
bicubically, as timm resizes them for these checkpoints (and a patch embedding resampled to another
patch size), and the head is a new zero-initialised one for the dataset's classes. The checkpoint's input
normalisation (ImageNet's mean and std for DINOv2, OpenAI's for CLIP) is folded into its patch
embedding, so it reads vit_jax's images in [-1, 1] as it read its own. Instead of a downloaded
directory, `--config.init_from=hf-hub:<repository>` (e.g.
hf-hub:timm/vit_small_patch14_dinov2.lvd142m) downloads it into the Hugging Face cache
(docs/finetuning.md).
"""

import ml_collections

from configs import finetune

# family: (hub checkpoints it was written for, the directory init_from names until set)
FAMILIES = {
    'dinov2': (
        'timm/vit_small_patch14_dinov2.lvd142m, timm/vit_base_patch14_dinov2.lvd142m, '
        'timm/vit_small_patch14_reg4_dinov2.lvd142m (registers), facebook/dinov2-small, '
        'facebook/dinov2-base, facebook/dinov2-with-registers-small',
        'checkpoints/dinov2',
    ),
    'dinov3': (
        'timm/vit_small_patch16_dinov3.lvd1689m, timm/vit_base_patch16_dinov3.lvd1689m, '
        'facebook/dinov3-vits16-pretrain-lvd1689m, facebook/dinov3-vitb16-pretrain-lvd1689m',
        'checkpoints/dinov3',
    ),
    'siglip': (
        'timm/vit_base_patch16_siglip_224.webli, google/siglip-base-patch16-224, '
        'google/siglip2-base-patch16-224 (their image towers)',
        'checkpoints/siglip',
    ),
    'clip': (
        'timm/vit_base_patch16_clip_224.openai, timm/vit_base_patch16_clip_quickgelu_224.openai, '
        'openai/clip-vit-base-patch16 (its CLIPVisionModel)',
        'checkpoints/clip',
    ),
    'eva02': (
        'timm/eva02_small_patch14_224.mim_in22k, timm/eva02_base_patch14_224.mim_in22k, '
        'timm/eva02_tiny_patch14_224.mim_in22k',
        'checkpoints/eva02',
    ),
    'mae': (
        'timm/vit_base_patch16_224.mae, timm/vit_large_patch16_224.mae, facebook/vit-mae-base, '
        'facebook/vit-mae-large (ViTMAEForPreTraining: its pixel decoder dropped)',
        'checkpoints/mae',
    ),
}


def get_config(family: str = 'dinov2', dataset: str = 'cifar10') -> ml_collections.ConfigDict:
  if family not in FAMILIES:
    raise ValueError(f'Unknown family {family!r}: use one of {", ".join(FAMILIES)}')
  config = finetune.get_config('checkpoint', dataset)
  config.init_from = FAMILIES[family][1]  # Set it: --config.init_from=/path/to/downloaded/dir.
  config.image_size = 224
  config.posemb_interpolation = config.patch_interpolation = 'bicubic'  # timm's.
  config.model.drop_path_rate = 0.1
  config.label_smoothing = 0.1
  config.optim.name = 'adamw'
  config.optim.weight_decay = 0.05
  config.optim.layer_decay = 0.65
  config.lr.base = 1e-4  # Batch 512 (configs/finetune.py); the peak after warmup.
  config.lr.end = 1e-6
  config.polyak_decay = 0.9999 if config.total_steps > 1000 else 0.999
  if family == 'mae':
    # MAE's fine-tuning (He et al. 2022, A.2): the patches' mean instead of the class token, the final
    # LayerNorm after the pooling, starting afresh (the checkpoint's is dropped, as timm's avg pool
    # does); the class token stays in the sequence.
    config.model.classifier = 'gap'
    config.model.fc_norm = True
  return config
