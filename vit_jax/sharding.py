"""Device mesh, partition rules and shardings: data, FSDP and tensor parallelism from `config.mesh`.

The mesh has up to three named axes. `data`: the batch is split, parameters are replicated (the pmap
case). `fsdp`: the batch is split too, and every parameter and optimizer-state array is split along its
largest dimension that the axis divides. `tensor`: attention heads and MLP hidden units are split
(Megatron style, by the models' `TENSOR_RULES`: encoder.py's and, for ResNet units, resnet.py's). The strategies combine: a parameter's
tensor-parallel dimension is taken first, FSDP picks among the others.
"""

import functools
import math
import re
from typing import Any, Mapping, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from vit_jax.models import resnet
from vit_jax.models.encoder import TENSOR_RULES as ENCODER_TENSOR_RULES
from vit_jax.models.scanned import ACTIVATION_SHARDING
from vit_jax.models.scan_layout import STACKED_BLOCKS

AXES = ('data', 'fsdp', 'tensor')
# Which dimension of a parameter the mesh axis `tensor` splits, by its path (regexes; the first wins).
TENSOR_RULES = ENCODER_TENSOR_RULES + resnet.TENSOR_RULES
BATCH_AXES = ('data', 'fsdp')  # The global batch is split over these (FSDP is data parallel too).


def make_mesh(axes: Sequence[tuple[str, int]], devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A mesh from (name, size) pairs; one size may be -1 to take the devices left over."""
  devices = list(jax.devices() if devices is None else devices)
  if not axes or not all(isinstance(axis, (tuple, list)) and len(axis) == 2 for axis in axes):
    raise ValueError(
        f"config.mesh must be (name, size) pairs, e.g. \"(('data', 2), ('fsdp', -1))\"; "
        f'got {axes!r}'
    )
  names = [name for name, _ in axes]
  sizes = [size for _, size in axes]
  unknown = [name for name in names if name not in AXES]
  if unknown:
    raise ValueError(
        f'Unknown config.mesh axis {", ".join(map(repr, unknown))}: the axes are '
        f'{", ".join(AXES)}, e.g. "((\'data\', 2), (\'fsdp\', -1))"'
    )
  if len(set(names)) != len(names):
    raise ValueError(
        f'config.mesh names an axis twice ({names}): name each of {", ".join(AXES)} once'
    )
  # A bool, float or string size would multiply (or fail to) into a message about the device count.
  bad = [
      size
      for size in sizes
      if isinstance(size, bool)
      or not isinstance(size, (int, np.integer))
      or (size < 1 and size != -1)
  ]
  if bad:
    raise ValueError(
        f'config.mesh size {bad[0]!r} must be a positive integer or -1 (the devices left '
        f"over); got {tuple(axes)}, e.g. \"(('data', 2), ('fsdp', -1))\""
    )
  if sizes.count(-1) > 1:
    raise ValueError(f'config.mesh may leave only one size as -1; got {tuple(axes)}')
  known = math.prod(size for size in sizes if size != -1)
  if -1 in sizes:
    if known < 1 or len(devices) % known:
      raise ValueError(
          f'config.mesh {tuple(axes)} does not fit {len(devices)} devices: the fixed sizes '
          f'must divide the device count'
      )
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(
        f'config.mesh sizes {dict(zip(names, sizes))} multiply to {math.prod(sizes)}, but '
        f'there are {len(devices)} devices: make the product {len(devices)} or use -1 for one axis'
    )
  # Devices in the order jax lists them (process by process) laid out on the axes in AXES' order,
  # whatever order config.mesh lists them in: the batch axes span the hosts, data then fsdp as
  # batch_axes splits the batch, so a host's rows are one block of it, and tensor (the most
  # communication) stays inside a host.
  order = sorted(range(len(names)), key=lambda i: AXES.index(names[i]))
  grid = np.asarray(devices).reshape([sizes[i] for i in order])
  mesh = Mesh(grid.transpose(np.argsort(order)), names)
  _check_hosts_hold_their_own_rows(mesh)
  return mesh


def _batch_shard(mesh: Mesh, index: tuple[int, ...]) -> tuple[int, ...]:
  """The batch shard of the device at `index` of `mesh.devices`: its coordinates on the batch axes."""
  return tuple(index[mesh.axis_names.index(name)] for name in batch_axes(mesh))


@functools.cache
def _batch_shard_processes(mesh: Mesh) -> dict[tuple[int, ...], frozenset[int]]:
  """The processes whose devices hold each batch shard of `mesh` (the planner's stand-ins for
  devices, integers, are of process 0). Cached: global_batch asks for every batch."""
  owners = {}
  for index, device in np.ndenumerate(mesh.devices):
    owners.setdefault(_batch_shard(mesh, index), set()).add(getattr(device, 'process_index', 0))
  return {shard: frozenset(processes) for shard, processes in owners.items()}


def _check_hosts_hold_their_own_rows(mesh: Mesh) -> None:
  """Each process loads its own rows of the batch: two holding one batch shard would each take theirs
  for the other's copy."""
  owners = _batch_shard_processes(mesh)
  if any(len(processes) > 1 for processes in owners.values()):
    processes = len(set().union(*owners.values()))
    raise ValueError(
        f'config.mesh {dict(mesh.shape)} cuts the batch into {len(owners)} shards for {processes} '
        f"processes, each of which loads rows of its own: make the 'data' x 'fsdp' size a "
        f'multiple of {processes}'
    )


def axis_size(mesh: Mesh, name: str) -> int:
  return mesh.shape[name] if name in mesh.axis_names else 1


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
  return tuple(name for name in BATCH_AXES if name in mesh.axis_names)


def num_batch_shards(mesh: Mesh) -> int:
  return math.prod(mesh.shape[name] for name in batch_axes(mesh))


def with_activation_sharding(fn: Any, mesh: Mesh) -> Any:
  """`fn`, traced with scanned.ACTIVATION_SHARDING set to the batch split of `mesh`: the scanned
  blocks keep their activations split over the batch. For what jits a model over the mesh (the train
  and eval steps)."""

  @functools.wraps(fn)
  def traced(*args, **kwargs):
    token = ACTIVATION_SHARDING.set(batch_sharding(mesh))
    try:
      return fn(*args, **kwargs)
    finally:
      ACTIVATION_SHARDING.reset(token)

  return traced


def batch_sharding(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P(batch_axes(mesh)))


def rows_on_devices(batches: Sequence[jax.Array], mesh: Mesh) -> jax.Array:
  """Batches [b, ...] split over the batch axes of `mesh` as one array [sum of b, ...] split alike,
  left on the devices that hold them (nothing moves): shard s holds shard s of each batch in turn,
  so its rows are not in the batches' order."""
  pieces = {}
  for batch in batches:
    for shard in batch.addressable_shards:
      pieces.setdefault(shard.device, []).append(shard.data)
  return jax.make_array_from_single_device_arrays(
      (sum(len(batch) for batch in batches), *batches[0].shape[1:]),
      batch_sharding(mesh),
      [jnp.concatenate(device_pieces) for device_pieces in pieces.values()],
  )


def micro_batch_sharding(mesh: Mesh) -> NamedSharding:
  """Micro-batches stacked on a leading axis: each one split over the batch axes like a batch."""
  return NamedSharding(mesh, P(None, batch_axes(mesh)))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def check_model_fits(mesh: Mesh, variant: str, split: Mapping[str, int]) -> None:
  """Tensor parallelism splits the model's `split` (a ViT's heads and MLP units, a ResNet's unit widths:
  the variant family's `tensor_split`): the axis must divide each; a model with nothing to split
  refuses it."""
  tensor = axis_size(mesh, 'tensor')
  if tensor > 1 and not split:
    raise ValueError(
        f'the mesh axis tensor={tensor} splits attention heads, MLP units and ResNet '
        f"units' widths, which {variant} has none of: use only 'data' and 'fsdp' axes in "
        '--config.mesh'
    )
  # A value may be one per block (num_kv_heads).
  widths = {name: np.ravel(value).tolist() for name, value in split.items()}
  for name, values in widths.items():
    if any(value % tensor for value in values):
      divisor = math.gcd(*[value for each in widths.values() for value in each])
      raise ValueError(
          f"the mesh axis tensor={tensor} does not divide the model's {name}={split[name]}: use "
          f'a tensor size that divides {name} (e.g. a divisor of {divisor}) in --config.mesh'
      )


def _path_str(path: tuple[Any, ...]) -> str:
  return '/'.join(
      str(getattr(key, 'key', getattr(key, 'name', getattr(key, 'idx', key)))) for key in path
  )


def partition_spec(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
  """Where one parameter (or optimizer-state array) of `shape` at `path` lives on the mesh.

  The encoder blocks of a scanned model are stacked on a leading layer axis (`encoderblock/...`);
  that axis stays whole (each scan iteration reads one layer) and the rules apply to the rest.
  """
  layers = 1 if re.search(STACKED_BLOCKS, path) else 0
  shape = shape[layers:]
  spec: list[str | None] = [None] * len(shape)
  tensor = axis_size(mesh, 'tensor')
  if tensor > 1:
    for pattern, dim in TENSOR_RULES:
      if re.search(pattern, path) and dim < len(shape) and shape[dim] % tensor == 0:
        spec[dim] = 'tensor'
        break
  fsdp = axis_size(mesh, 'fsdp')
  if fsdp > 1:
    free = [d for d in range(len(shape)) if spec[d] is None and shape[d] % fsdp == 0]
    if free:
      spec[max(free, key=lambda d: (shape[d], -d))] = 'fsdp'
  return P(*[None] * layers, *spec)


def state_shardings(abstract_state: Any, mesh: Mesh) -> Any:
  """NamedShardings for every array of a (train-state) pytree of ShapeDtypeStructs."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: NamedSharding(mesh, partition_spec(_path_str(path), tuple(x.shape), mesh)),
      abstract_state,
  )


def global_batch(local_batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Assembles each host's part of the batch into global arrays sharded over the batch axes."""
  # Images, labels and masks must stay row-aligned: a short one would pair examples with other labels.
  chex.assert_equal_shape_prefix(list(local_batch.values()), 1)
  sharding = batch_sharding(mesh)
  owners = _batch_shard_processes(mesh)
  local_shards = sum(jax.process_index() in processes for processes in owners.values())
  rows = len(next(iter(local_batch.values()))) * len(owners) // local_shards
  return {
      k: jax.make_array_from_process_local_data(sharding, v, (rows, *v.shape[1:]))
      for k, v in local_batch.items()
  }
