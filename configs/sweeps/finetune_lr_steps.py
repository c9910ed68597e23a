"""The paper's fine-tuning grid (Appendix B.1.1): learning rate x steps, here for ViT-B/16 on CIFAR-10.

  python launch/sweep.py --sweep=configs/sweeps/finetune_lr_steps.py --workdir=gs://B/sweep --print \\
      -- --config.init_from=/path/to/ViT-B_16.npz
"""

CONFIG = 'configs/vit_b16_finetune.py:cifar10'


def get_sweep():
  return [{'lr.base': [0.001, 0.003, 0.01, 0.03], 'total_steps': [2500, 10_000]}]
