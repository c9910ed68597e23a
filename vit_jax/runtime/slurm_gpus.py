"""The GPUs a SLURM task drives. Left to itself, jax.distributed gives each SLURM task one GPU, the
one numbered by its rank on the node (SLURM_LOCALID): right for one task per GPU where every task
sees all of the node's GPUs, wrong for launch/slurm.sbatch's one task per node (GPU 0 of its 8) and
for tasks bound to their own GPUs (`--gpus-per-task=1`: task k asks for GPU k of the one it sees).
"""

import os
import re
from typing import Mapping

_NVIDIA_DEVICE = re.compile(r'nvidia\d+')


def _visible_gpus(environ: Mapping[str, str], dev: str) -> int | None:
  """How many GPUs the process sees: CUDA_VISIBLE_DEVICES' entries (SLURM sets it to the task's), else
  the node's NVIDIA devices; None where neither says."""
  visible = environ.get('CUDA_VISIBLE_DEVICES')
  if visible is not None:
    return len([entry for entry in visible.split(',') if entry.strip()])
  try:
    found = sum(1 for name in os.listdir(dev) if _NVIDIA_DEVICE.fullmatch(name))
  except OSError:
    return None
  return found or None


def _gpus_per_task(environ: Mapping[str, str]) -> int | None:
  """SLURM_GPUS_PER_TASK, which `--gpus-per-task=[type:]n` sets: n; None where unset."""
  count = environ.get('SLURM_GPUS_PER_TASK', '').rsplit(':', 1)[-1]
  return int(count) if count.isdigit() else None


def _tasks_on_node(environ: Mapping[str, str]) -> int | None:
  """The step's tasks on this node: SLURM_STEP_TASKS_PER_NODE ('2(x3),1': 2 on each of the first
  three nodes, 1 on the fourth) at SLURM_NODEID."""
  spec, node = environ.get('SLURM_STEP_TASKS_PER_NODE'), environ.get('SLURM_NODEID')
  if spec is None or node is None:
    return None
  counts = []
  for part in spec.split(','):
    match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', part.strip())
    if not match:
      return None
    counts += [int(match[1])] * int(match[2] or 1)
  return counts[int(node)] if int(node) < len(counts) else None


def local_device_ids(
    environ: Mapping[str, str] = os.environ, dev: str = '/dev'
) -> list[int] | None:
  """The ordinals, among the GPUs the process sees, that a SLURM task drives; None to leave the choice
  to jax.distributed (not SLURM, JAX_LOCAL_DEVICE_IDS set, no GPU, or a layout this cannot tell).

  The only task on its node, a task that sees fewer GPUs than its node has tasks, or as many as
  `--gpus-per-task` gave it (SLURM_GPUS_PER_TASK; bound to its own): every GPU it sees. Tasks that see
  the same n GPUs: n / tasks each, in rank order (jax's one each where n equals the tasks)."""
  if 'SLURM_LOCALID' not in environ or environ.get('JAX_LOCAL_DEVICE_IDS'):
    return None
  gpus, tasks = _visible_gpus(environ, dev), _tasks_on_node(environ)
  if not gpus or tasks is None:
    return None
  if tasks == 1 or gpus < tasks or gpus == _gpus_per_task(environ):
    return list(range(gpus))
  if gpus % tasks:
    return None
  share, rank = gpus // tasks, int(environ['SLURM_LOCALID'])
  return list(range(rank * share, (rank + 1) * share))
