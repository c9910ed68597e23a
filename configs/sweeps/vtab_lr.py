"""The VTAB-1k sweep: each of the 19 tasks (configs/vtab.py:TASK) at learning rates {0.001, 0.003, 0.01,
0.03} (Appendix B.1.1's fine-tuning grid), trained on train800 and compared on val200; 76 runs.

  python launch/sweep.py --sweep=configs/sweeps/vtab_lr.py --workdir=gs://B/vtab --print \\
      -- --config.init_from=/path/to/ViT-B_16.npz --config.data_dir=/path/to/tfds
  python -m vit_jax.tools.vtab gs://B/vtab --out=reports/vtab   # best val200 lr per task -> its test top-1

The paper then used one setting for every task (lr 0.01, 2500 steps, the best mean val200 of a
smaller sweep). For the final numbers, train each task at its rate on train800val200 under the same
root: configs/vtab.py:TASK,final with --config.lr.base=LR.
"""

# vit_jax/data/vtab.py's TASKS, written out: importing it would load TensorFlow to print commands.
TASKS = (
    'caltech101',
    'cifar100',
    'dtd',
    'flowers102',
    'pets',
    'sun397',
    'svhn',  # Natural.
    'camelyon',
    'eurosat',
    'resisc45',
    'retinopathy',  # Specialized.
    'clevr_count',
    'clevr_dist',
    'dmlab',
    'dsprites_loc',
    'dsprites_ori',
    'kitti_dist',  # Structured.
    'smallnorb_azim',
    'smallnorb_elev',
)


def get_sweep():
  return [
      {
          'config': [f'configs/vtab.py:{task}' for task in TASKS],
          'lr.base': [0.001, 0.003, 0.01, 0.03],
      }
  ]
