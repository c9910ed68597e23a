"""Device mesh and shardings: the mesh comes from `config.mesh`, the batch is split over data axes."""
import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

AXES = ('data', 'fsdp', 'tensor')
BATCH_AXES = ('data', 'fsdp')  # The global batch is split over these (FSDP is data parallel too).


def make_mesh(axes: Sequence[tuple[str, int]], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh from (name, size) pairs; one size may be -1 to take the devices left over."""
  devices = list(jax.devices() if devices is None else devices)
  names = [name for name, _ in axes]
  sizes = [size for _, size in axes]
  unknown = [name for name in names if name not in AXES]
  if unknown or len(set(names)) != len(names):
    raise ValueError(f'config.mesh axis names must be distinct, from {", ".join(AXES)}; got {names}')
  if sizes.count(-1) > 1:
    raise ValueError(f'config.mesh may leave only one size as -1; got {tuple(axes)}')
  known = math.prod(size for size in sizes if size != -1)
  if -1 in sizes:
    if known < 1 or len(devices) % known:
      raise ValueError(f'config.mesh {tuple(axes)} does not fit {len(devices)} devices: the fixed sizes '
                       f'must divide the device count')
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f'config.mesh sizes {dict(zip(names, sizes))} multiply to {math.prod(sizes)}, but '
                     f'there are {len(devices)} devices: make the product {len(devices)} or use -1 for one axis')
  return Mesh(np.asarray(devices).reshape(sizes), names)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  return tuple(name for name in BATCH_AXES if name in mesh.axis_names)


def num_batch_shards(mesh: Mesh) -> int:
  return math.prod(mesh.shape[name] for name in batch_axes(mesh))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each host's part of the batch into global arrays sharded over the batch axes."""
  sharding = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}
