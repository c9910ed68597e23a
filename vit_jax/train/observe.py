"""What a run shows of itself beside its metrics: the one line that describes it, a profiler trace of
a few steps, memory in use."""

from typing import Any

import jax
from absl import logging

from vit_jax.train import param_groups
from vit_jax.train.setup import Setup


class StepProfiler:
  """A jax.profiler trace of steps first .. first + num_steps - 1 into `logdir` (TensorBoard's
  Profile tab reads logdir/plugins/profile); nothing when num_steps is 0."""

  def __init__(self, logdir: str, first: int, num_steps: int):
    self._logdir, self._steps = logdir, range(first, first + num_steps)
    self._tracing = False

  def before(self, step: int) -> None:
    if step == self._steps.start and self._steps:
      jax.profiler.start_trace(self._logdir)
      self._tracing = True

  def after(self, step: int, outputs: Any) -> None:
    """Ends the trace after its last step (or the run's), once that step's work is done."""
    if self._tracing and step == self._steps[-1]:
      self.stop(outputs)

  def stop(self, outputs: Any = None) -> None:
    if self._tracing:
      jax.block_until_ready(outputs)
      jax.profiler.stop_trace()
      self._tracing = False
      logging.info(
          'Profiled steps %d-%d into %s/plugins/profile (TensorBoard: Profile)',
          self._steps.start,
          self._steps[-1],
          self._logdir,
      )


def memory_in_use() -> tuple[str, dict[str, int]]:
  """Bytes in use on each of this host's devices, and what counted them: the allocator where the
  device keeps a count (GPU, TPU), else the bytes of the live arrays on it (CPU)."""
  stats = {d: d.memory_stats() for d in jax.local_devices()}
  if all(s and 'bytes_in_use' in s for s in stats.values()):
    return 'allocator', {str(d): s['bytes_in_use'] for d, s in stats.items()}
  in_use = dict.fromkeys(stats, 0)
  for array in jax.live_arrays():
    for shard in array.addressable_shards:
      in_use[shard.device] = in_use.get(shard.device, 0) + shard.data.nbytes
  return 'live arrays', {str(d): b for d, b in in_use.items()}


def _size(num_bytes: int) -> str:
  return f'{num_bytes / 2**30:.2f} GiB' if num_bytes >= 2**30 else f'{num_bytes / 2**20:.1f} MiB'


def log_memory(step: int) -> None:
  counted_by, in_use = memory_in_use()
  logging.info(
      'Memory in use after step %d (%s): %s',
      step,
      counted_by,
      ', '.join(f'{d} {_size(b)}' for d, b in in_use.items()),
  )


def parameter_count(setup: Setup, params: Any) -> str:
  """'N.NM parameters', and how many of them train when some are frozen (config.optim.frozen,
  trained, low-rank adapters)."""
  count = f'{sum(x.size for x in jax.tree.leaves(params)) / 1e6:.1f}M parameters'
  if not param_groups.freezes(setup.config.optim, setup.model_config):
    return count
  trained = sum(
      x.size for _, x, trains in param_groups.labelled(setup.config.optim, params) if trains
  )
  return f'{count} ({trained:,} trained)'


def run_header(setup: Setup, params: Any) -> str:
  """The run in one line: model, data, batch and mesh, workdir. The config's every field is in the
  workdir's config.json (and at --verbosity=1 in the log)."""
  config, info = setup.config, setup.info
  mesh = ' x '.join(f'{name}={size}' for name, size in setup.mesh.shape.items())
  data_dir = (
      f' {config.data_dir}'
      if config.data_dir and config.dataset in ('folder', 'huggingface')
      else ''
  )
  devices = jax.device_count()
  sets = ' (a set of them an image)' if info.multi_label else ''
  return (
      f'{config.variant}, {parameter_count(setup, params)}, {config.dtype}, '
      f'{config.image_size} px; {config.dataset}{data_dir}: {info.num_train} train / '
      f'{info.num_eval} eval examples, {info.num_classes} classes{sets}; batch {config.batch_size} on '
      f'{devices} device{"s" * (devices > 1)} (mesh {mesh}); workdir {setup.workdir} (every '
      'field in its config.json; --verbosity=1 logs them)'
  )
