"""The GPUs each SLURM task drives, for the layouts sbatch makes (jax.distributed's own choice gives
every task the one GPU of its node rank)."""

import os
import subprocess
import sys

import pytest

import helpers
from vit_jax.runtime import slurm_gpus

_EIGHT = '0,1,2,3,4,5,6,7'


def _task(local_id: int, tasks_per_node: str, node: int = 0, **environ) -> dict[str, str]:
  return {
      'SLURM_JOB_ID': '7',
      'SLURM_LOCALID': str(local_id),
      'SLURM_NODEID': str(node),
      'SLURM_STEP_TASKS_PER_NODE': tasks_per_node,
      **environ,
  }


@pytest.mark.parametrize(
    'environ, want',
    [
        # launch/slurm.sbatch: one task per node drives all 8 (jax alone: GPU 0).
        (_task(0, '1(x2)', node=1, CUDA_VISIBLE_DEVICES=_EIGHT), list(range(8))),
        # --ntasks-per-node=8 --gpus-per-task=1: each task sees its own GPU only, as 0.
        (_task(5, '8(x2)', CUDA_VISIBLE_DEVICES='5'), [0]),
        # Eight tasks that see the node's eight GPUs: one each, by rank (jax's own choice).
        (_task(3, '8', CUDA_VISIBLE_DEVICES=_EIGHT), [3]),
        # --ntasks-per-node=2 --gpus-per-task=4: each sees its own four (it drove two of them).
        (_task(1, '2', CUDA_VISIBLE_DEVICES='4,5,6,7', SLURM_GPUS_PER_TASK='4'), [0, 1, 2, 3]),
        (_task(0, '2', CUDA_VISIBLE_DEVICES='0,1,2,3', SLURM_GPUS_PER_TASK='h100:4'), [0, 1, 2, 3]),
        # The same, every task seeing the node's eight (--gpu-bind=none): four each.
        (_task(1, '2', CUDA_VISIBLE_DEVICES=_EIGHT, SLURM_GPUS_PER_TASK='4'), [4, 5, 6, 7]),
        # Two tasks sharing eight: four each.
        (_task(1, '2', CUDA_VISIBLE_DEVICES=_EIGHT), [4, 5, 6, 7]),
        # Nodes with different task counts: this one (the third) has 1.
        (_task(0, '2(x2),1', node=2, CUDA_VISIBLE_DEVICES='0,1'), [0, 1]),
        # Left to jax: not SLURM; the user's JAX_LOCAL_DEVICE_IDS; no GPU; a split it cannot tell.
        ({'CUDA_VISIBLE_DEVICES': _EIGHT}, None),
        (_task(0, '1', CUDA_VISIBLE_DEVICES=_EIGHT, JAX_LOCAL_DEVICE_IDS='0,1'), None),
        (_task(0, '1', CUDA_VISIBLE_DEVICES=''), None),
        (_task(1, '2', CUDA_VISIBLE_DEVICES='0,1,2'), None),
        (_task(0, '1', CUDA_VISIBLE_DEVICES=_EIGHT) | {'SLURM_STEP_TASKS_PER_NODE': 'x'}, None),
    ],
)
def test_each_task_drives_the_gpus_its_layout_gives_it(environ, want, tmp_path):
  assert slurm_gpus.local_device_ids(environ, str(tmp_path)) == want


def test_without_cuda_visible_devices_the_nodes_nvidia_devices_are_counted(tmp_path):
  for name in ('nvidia0', 'nvidia1', 'nvidia2', 'nvidia3', 'nvidiactl', 'nvidia-uvm', 'null'):
    (tmp_path / name).touch()
  assert slurm_gpus.local_device_ids(_task(0, '1'), str(tmp_path)) == [0, 1, 2, 3]
  assert slurm_gpus.local_device_ids(_task(0, '1'), str(tmp_path / 'none')) is None  # A CPU node.


def test_the_entry_point_joins_the_run_with_them(tmp_path):
  """`vit_jax.main --distributed=on` in launch/slurm.sbatch's task hands them to jax.distributed."""
  code = (
      'import jax\n'
      'from absl import flags\n'
      'from vit_jax import main\n'
      'seen = {}\n'
      'jax.distributed.initialize = lambda **kwargs: seen.update(kwargs)\n'
      "flags.FLAGS(['main', '--distributed=on', '--config=configs/demo.py', '--workdir=w'])\n"
      'main.init_distributed()\n'
      "print(seen['local_device_ids'])\n"
  )
  environ = {**os.environ, **_task(0, '1', CUDA_VISIBLE_DEVICES='0,1,2,3')}
  environ.update(SLURM_NTASKS='1', SLURM_PROCID='0', SLURM_STEP_NODELIST='node1')
  result = subprocess.run(
      [sys.executable, '-c', code],
      env=environ,
      capture_output=True,
      text=True,
      check=True,
      cwd=helpers.REPO,
  )
  assert result.stdout.splitlines()[-1] == '[0, 1, 2, 3]'
