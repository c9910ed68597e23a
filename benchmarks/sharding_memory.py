"""Per-device bytes of parameters + optimizer state under each sharding strategy, without allocating.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python benchmarks/sharding_memory.py --variant=ViT-B_16

Prints one row per mesh: the train state (float32 parameters and AdamW moments) that the largest-loaded
device holds, and its fraction of the replicated (pure data-parallel) figure.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates: the train step's memory stays mapped on CPU.

import argparse
import functools

import jax
import ml_collections
import numpy as np

from vit_jax import defaults, sharding  # pylint: disable=wrong-import-position
from vit_jax.train import optim  # pylint: disable=wrong-import-position
from vit_jax.models import variants  # pylint: disable=wrong-import-position
from vit_jax.tasks import classification  # pylint: disable=wrong-import-position
from vit_jax.train import state as train_state  # pylint: disable=wrong-import-position

MESHES = {
    'data': (('data', -1),),
    'fsdp': (('fsdp', -1),),
    'tensor': (('data', -1), ('tensor', 2)),
    'data+fsdp': (('data', 2), ('fsdp', -1)),
    'fsdp+tensor': (('fsdp', -1), ('tensor', 2)),
}


def per_device_bytes(config: ml_collections.ConfigDict, num_classes: int = 1000) -> int:
  """Bytes of the train state on the most loaded device for `config.mesh`."""
  mesh = sharding.make_mesh(config.mesh)
  model_config = variants.get_model_config(config.variant, config.model.to_dict())
  model = classification.make_model(config, model_config, num_classes)
  tx, _ = optim.make_optimizer(config, 1000, model_config)
  init = functools.partial(
      train_state.init_state,
      model=model,
      tx=tx,
      image_size=config.image_size,
      polyak=config.polyak_decay is not None,
  )
  abstract = jax.eval_shape(init, jax.random.key(0))
  shardings = sharding.state_shardings(abstract, mesh)
  per_device = np.zeros(len(mesh.devices.flat))
  for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
    shard_bytes = np.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
    for device in s.addressable_devices:  # Every device of the mesh holds one shard (maybe a copy).
      per_device[device.id] += shard_bytes
  return int(per_device.max())


def table(variant: str, image_size: int) -> dict[str, int]:
  results = {}
  for name, axes in MESHES.items():
    config = defaults.get_config()
    config.variant, config.image_size, config.mesh = variant, image_size, axes
    results[name] = per_device_bytes(config)
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--variant', default='ViT-B_16')
  parser.add_argument('--image_size', type=int, default=224)
  args = parser.parse_args()
  results = table(args.variant, args.image_size)
  print(
      f'{args.variant} at {args.image_size}px, {jax.device_count()} devices, AdamW state in float32'
  )
  print('| mesh | per-device MiB | fraction of replicated |')
  print('|---|---|---|')
  for name, size in results.items():
    print(f'| {name} {MESHES[name]} | {size / 2**20:.1f} | {size / results["data"]:.3f} |')


if __name__ == '__main__':
  main()
