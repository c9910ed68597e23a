"""The paper's position-embedding ablation (Appendix D.4, Table 8) on the demo: rows none / 1-D / 2-D /
relative position embeddings x columns input / every layer / shared every layer (none and relative
only at the input: Table 8's N/A cells).

  python launch/sweep.py --sweep=configs/sweeps/posemb_table8.py --workdir=workdirs/posemb_table8
  python -m vit_jax.tools.report workdirs/posemb_table8 --pivot=model.posemb,model.posemb_where
"""

CONFIG = 'configs/demo.py'


def get_sweep():
  return [
      {'model.posemb': ['none', 'relative']},
      {
          'model.posemb': ['learn', 'learn2d'],
          'model.posemb_where': ['input', 'every_layer', 'shared_every_layer'],
      },
  ]
