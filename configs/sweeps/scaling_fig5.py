"""Figure 5 (Sec. 4.4, Table 6): transfer accuracy against pre-training compute for ViT and hybrid
models of each size, pre-trained for 7 and 14 epochs (Table 6 ran B/32, B/16, L/32, L/16 for 7, and
L/16, H/14 for 14; this grid has both lengths for every model, pre-logits of the model's width).

  python launch/sweep.py --sweep=configs/sweeps/scaling_fig5.py --workdir=gs://B/fig5 --print
  python -m vit_jax.tools.scaling gs://B/fig5 --out=reports/fig5   # --metric=fewshot_5shot with few-shot on

The paper pre-trained on JFT-300M, which is not public; this pre-trains on ImageNet-21k
(configs/vit_l16_i21k.py's recipe; the ResNets configs/bit_i21k.py's, the same but Table 3's rates),
whose epochs are 1/23 of JFT's images. The ResNets are Figure 5's BiT points up to R152x2 (its R200x3
is no BiT variant here).
"""

CONFIG = 'configs/vit_l16_i21k.py'

# variant: the width of its pre-logits layer.
VARIANTS = {
    'ViT-B_32': 768,
    'ViT-B_16': 768,
    'ViT-L_32': 1024,
    'ViT-L_16': 1024,
    'ViT-H_14': 1280,
    'R50+ViT-B_32': 768,
    'R50+ViT-B_16': 768,
    'R50+ViT-L_32': 1024,
    'R50+ViT-L_16': 1024,
}


RESNETS = ('BiT-R50x1', 'BiT-R50x2', 'BiT-R101x1', 'BiT-R152x1', 'BiT-R152x2')


def get_sweep():
  return [
      {'variant': variant, 'model.representation_size': width, 'num_epochs': [7.0, 14.0]}
      for variant, width in VARIANTS.items()
  ] + [
      {
          'config': [f'configs/bit_i21k.py:{variant}' for variant in RESNETS],
          'num_epochs': [7.0, 14.0],
      }
  ]
