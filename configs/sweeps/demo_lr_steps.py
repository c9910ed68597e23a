"""Learning rate x training steps for the demo: the grid the paper searched when fine-tuning
(Appendix B.1.1: lr in {0.001, 0.003, 0.01, 0.03} and a few step budgets per dataset).

  python launch/sweep.py --sweep=configs/sweeps/demo_lr_steps.py --workdir=workdirs/demo_sweep
"""

CONFIG = 'configs/demo.py'


def get_sweep():
  return [{'lr.base': [3e-4, 1e-3, 3e-3], 'total_steps': [1000, 2000]}]
