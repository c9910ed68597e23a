"""Out of memory as one line naming the fix: before the first train step, where XLA's count of the
compiled step's buffers exceeds the memory its devices have free (on CPU, where the kernel's
out-of-memory killer would end the process without a word), and where a device's allocator reports
RESOURCE_EXHAUSTED mid-run."""

import os
from typing import Any

import jax
import ml_collections
from absl import logging

from vit_jax.runtime import hosts

_MEMINFO = '/proc/meminfo'


class OutOfMemory(Exception):
  """The run needs more device memory than there is; its message names the config fields to change."""


def _size(num_bytes: float) -> str:
  return f'{num_bytes / 2**30:.2f} GiB' if num_bytes >= 2**30 else f'{num_bytes / 2**20:.1f} MiB'


def advice(config: ml_collections.ConfigDict, evaluating: bool = False) -> str:
  """The config fields that lower a step's memory."""
  if evaluating:
    return f'lower --config.eval_batch_size (now {config.eval_batch_size})'
  remat = (
      ', set --config.model.remat=True (activations recomputed in the backward pass)'
      if 'remat' in config.model and not config.model.remat
      else ''
  )
  return (
      f'lower --config.batch_size (now {config.batch_size}), or keep it and raise '
      f'--config.accum_steps (now {config.accum_steps}; each step in that many micro-batches)'
      f"{remat}, or spread the step over more devices (--config.mesh's fsdp axis shards the state)"
  )


def free_bytes(device: jax.Device) -> int | None:
  """The bytes `device` can still allocate: its allocator's limit less what it holds, or on CPU this
  host's available memory shared by its CPU devices, which run their programs at once; None where
  neither is known."""
  stats = device.memory_stats()
  if stats and 'bytes_limit' in stats:
    return stats['bytes_limit'] - stats.get('bytes_in_use', 0)
  if device.platform != 'cpu' or not os.path.exists(_MEMINFO):
    return None
  with open(_MEMINFO) as f:
    fields = dict(line.split(':', 1) for line in f)
  if 'MemAvailable' not in fields:
    return None
  available = int(fields['MemAvailable'].split()[0]) * 1024
  return available // len([d for d in jax.local_devices() if d.platform == 'cpu'])


def check_train_step(
    step_fn: Any, state: Any, batch: Any, config: ml_collections.ConfigDict
) -> None:
  """Raises OutOfMemory where the compiled step's buffers beyond its arguments (the state and batch,
  already placed) need more than a device has free. The program is SPMD: its sizes are one device's.
  The step is compiled here, once: its first call finds it in JAX's cache."""
  stats = step_fn.lower(state, batch).compile().memory_analysis()
  if stats is None:
    return
  # The donated state's outputs alias its arguments: only the temporaries and the other outputs are new.
  needed = stats.temp_size_in_bytes + stats.output_size_in_bytes - stats.alias_size_in_bytes
  device = jax.local_devices()[0]
  free = free_bytes(device)
  logging.debug(
      'The train step needs %s a device beyond its arguments (%s); %s free',
      _size(needed),
      _size(stats.argument_size_in_bytes),
      'unknown' if free is None else _size(free),
  )
  short = free is not None and needed > free
  # Every process stops, also where its own devices have room: the others would wait for it.
  if hosts.any_of(short):
    where = (
        f'{device.device_kind} {device.id} has {_size(free)} free'
        if short
        else 'another process of the run has less free'
    )
    raise OutOfMemory(
        f'the train step needs {_size(needed)} of memory a device beyond its state and batch '
        f"({_size(stats.argument_size_in_bytes)}), XLA's count, where {where}: {advice(config)}"
    )


def out_of_memory(error: Exception) -> bool:
  return isinstance(error, jax.errors.JaxRuntimeError) and 'RESOURCE_EXHAUSTED' in str(error)


def ran_out(error: Exception, phase: str, config: ml_collections.ConfigDict) -> OutOfMemory:
  """The one-line error for a device allocator's RESOURCE_EXHAUSTED during `phase`."""
  said = str(error).strip().splitlines()[0][:300]
  return OutOfMemory(
      f'{phase} ran out of device memory ({said}): '
      f'{advice(config, evaluating=phase.startswith("evaluation"))}'
  )
