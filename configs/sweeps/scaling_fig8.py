"""Figure 8 (Appendix D.2): one model dimension scaled at a time from the paper's base ViT, 8 layers of
width D 1024 with MLP 2048 on 32 x 32 patches: depth, width (heads of 64 dimensions), MLP width and
patch size. The paper plots 5-shot accuracy against compute and finds depth the best to scale,
width the least, and smaller patches a robust gain without parameters. The values are read off the
figure; the base's shape is the appendix's.

  python launch/sweep.py --sweep=configs/sweeps/scaling_fig8.py --workdir=gs://B/fig8 --print \\
      -- --config.fewshot.every_steps=5000 --config.fewshot.shots='(5,)'
  python -m vit_jax.tools.scaling gs://B/fig8 --out=reports/fig8 --metric=fewshot_5shot

JFT-300M is not public: this pre-trains on ImageNet-21k (configs/vit_l16_i21k.py's recipe) for 7
epochs, Figure 5's shorter length, and few-shot evaluates on its held-out images.
"""

CONFIG = 'configs/vit_l16_i21k.py'

BASE = {
    'variant': 'ViT-L_32',
    'model.num_layers': 8,
    'model.mlp_dim': 2048,
    'model.representation_size': 1024,
    'num_epochs': 7.0,
}


def get_sweep():
  return [
      {**BASE, 'model.num_layers': [1, 2, 4, 8, 16, 32, 64]},  # Depth; the base once, here.
      *(
          {
              **BASE,
              'model.hidden_size': width,
              'model.num_heads': width // 64,
              'model.representation_size': width,
          }
          for width in (256, 512, 2048)
      ),
      {**BASE, 'model.mlp_dim': [512, 1024, 4096, 8192]},
      {**BASE, 'variant': ['ViT-L_16', 'ViT-L_8']},  # Patch size 16 and 8.
  ]
