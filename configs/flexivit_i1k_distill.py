"""FlexiViT-B distilled on ImageNet-1k: Beyer et al. 2023, "FlexiViT: One Model for All Patch Sizes"
(big_vision's configs/proj/flexivit/i1k_deit3_distill.py). A ViT-B/16 initialised from DeiT III B/16
learns, at 240 px and at each step's patch size drawn from ten (48 to 8 px: 5x5 to 30x30 tokens), to
predict what the same DeiT III predicts of the same crop at its own 384 px.

  hf download timm/deit3_base_patch16_384.fb_in1k --local-dir checkpoints/deit3_b384   # 350 MB
  python -m vit_jax.main --config=configs/flexivit_i1k_distill.py --workdir=W \\
      --config.init_from=checkpoints/deit3_b384 --config.distill.teacher=checkpoints/deit3_b384

(or :300, :1200 for the paper's longer schedules; `hf-hub:timm/deit3_base_patch16_384.fb_in1k` for
both paths downloads it into the Hugging Face cache). Recipe: batch 1024, 90 epochs of 99% of train
(the last 1% is the minival), inception crop + flip at 240 px, Mixup with Beta(1, 1) on every batch,
the loss the teacher's KL alone (no labels: distill.alpha 1, big_vision's `kl`: distill.kind='kl'),
Adam with a bfloat16 first moment, lr 1e-4, 5,000 warmup steps, cosine decay, decoupled weight decay
1e-5 (big_vision's is not multiplied by the learning rate: here 0.1 x lr 1e-4), clipping at 1.0; the
teacher sees the student's crop at 384 px (distill.teacher_image_size), its position embeddings
resized from DeiT III's 24x24 once. The student keeps DeiT III's 16 px kernel and, as big_vision's
FlexiViT, its position embeddings on a 7x7 grid (flexi.posemb_grid), both resampled to each step's
size (the grid bilinearly, antialiased when it shrinks: jax.image.resize's 'linear', big_vision's).
Evaluation resizes to 274 and takes the
central 240: `eval` measures patch 16, `p8`..`p48` the other sizes, `teacher` the teacher at 384 px
(the shorter side resized to 438, the central 384, as big_vision measures it; once).

Differences from big_vision: the teacher's image is the student's 240 px crop resized on the device
(big_vision resizes the decoded crop to both sizes on the host); DeiT III's 24x24 position
embeddings are resized to the 7x7 grid by the same antialiased bilinear (big_vision's loader: scipy's
linear zoom); Mixup pairs each image with the batch reversed (big_vision: rolled by one).
"""

from vit_jax import defaults

# FlexiViT's ImageNet-1k sizes: the divisors of 240 from 8 to 48 px (30x30 to 5x5 tokens).
PATCH_SIZES = (48, 40, 30, 24, 20, 16, 15, 12, 10, 8)
SCHEDULES = (90, 300, 1200)  # Epochs: the paper's.


def get_config(epochs: str = '90'):
  if not epochs.isdigit() or int(epochs) not in SCHEDULES:
    raise ValueError(
        f'Unknown schedule {epochs!r}: use one of {", ".join(map(str, SCHEDULES))} '
        '(e.g. --config=configs/flexivit_i1k_distill.py:300)'
    )
  config = defaults.get_config()
  config.dataset = 'imagenet2012'
  config.train_split = 'train[:99%]'
  config.eval_split = 'validation'
  config.evals.minival = dict(type='classification', split='train[99%:]', every_steps=5000)
  for size in PATCH_SIZES:
    if size != 16:
      config.evals[f'p{size}'] = dict(
          type='classification', split='validation', patch_size=size, every_steps=10_000
      )
  config.evals.teacher = dict(type='teacher', split='validation', every_steps=10_000)  # Once.
  config.image_size = 240
  config.pp.crop = 'inception'
  config.pp.min_area = 0.05  # big_vision's inception_crop.
  config.pp.flip = True
  config.pp_eval.crop, config.pp_eval.crop_fraction = 'central', 240 / 274
  config.mix.mixup_alpha = 1.0
  config.label_smoothing = 0.0

  # The student: DeiT III B/16's model and weights (its head too: the same 1000 classes).
  config.variant = 'checkpoint'
  config.init_from = 'hf-hub:timm/deit3_base_patch16_384.fb_in1k'
  config.keep_head = True
  config.flexi.patch_sizes = PATCH_SIZES
  config.flexi.posemb_grid = 7  # big_vision's proj/flexi/vit.py posemb_size.
  config.posemb_interpolation = 'bilinear_antialiased'
  config.dtype = 'bfloat16'

  config.distill.teacher = 'hf-hub:timm/deit3_base_patch16_384.fb_in1k'
  config.distill.teacher_image_size = 384
  config.distill.kind = 'kl'
  config.distill.alpha = 1.0  # The teacher's predictions alone: big_vision's distill trainer.

  config.batch_size = 1024
  config.num_epochs = float(epochs)
  config.optim.name = 'adamw'
  config.optim.mu_dtype = 'bfloat16'
  config.optim.weight_decay = 0.1
  config.lr.base = 1e-4
  config.lr.warmup_steps = 5000
  config.lr.decay = 'cosine'
  config.grad_clip_norm = 1.0

  config.log_every_steps = 50
  config.eval_every_steps = 5000
  config.checkpoint_every_steps = 1000
  return config
