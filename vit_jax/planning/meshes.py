"""The meshes a plan is made for (what `python -m vit_jax.tools.plan` prints): the config's own on N
chips, checked as training would check it, and the meshes x remat policies x accumulation steps
that fit a chip, fastest first. What one such choice costs in memory and time is footprint.py's.
"""

from typing import Any

import ml_collections
from jax.sharding import AbstractMesh

from vit_jax import sharding, tasks
from vit_jax.planning import chips, footprint
from vit_jax.train import optim
from vit_jax.models import variants

MESH_ORDER = ('data', 'fsdp', 'tensor')  # Simplest (least communication) first.
MAX_DEVICES = 2**20  # Many times the largest pods' chips.


def mesh_shape(axes: Any, devices: int) -> dict[str, int]:
  """The axis sizes `config.mesh` takes on `devices` chips, or the ValueError training would raise."""
  # The mesh below is an array of that many integers: a hundred million took minutes.
  if not 1 <= devices <= MAX_DEVICES:
    raise ValueError(f'--devices={devices} must be from 1 to {MAX_DEVICES}')
  # make_mesh only reshapes the device list: integers stand in for devices, so its checks and messages
  # serve any device count, not only this machine's.
  return dict(sharding.make_mesh(axes, devices=range(devices)).shape)


def check(
    config: ml_collections.ConfigDict, model_config: dict[str, Any], devices: int
) -> dict[str, int]:
  """The config's mesh on `devices` chips; a one-line ValueError for what training would refuse.
  `model_config`: the variant's resolved fields (variants.get_model_config)."""
  # An image size the patches do not divide is the model's error, in trace.
  task = tasks.get(config.task)
  variants.require_vit(
      config.variant, "vit_jax.tools.plan (it models the memory of a ViT's blocks)"
  )
  if config.batch_size < 1:  # suggest() would double accum_steps forever: 0 divides by any of them.
    raise ValueError(f'config.batch_size={config.batch_size} must be at least 1')
  if config.dtype not in ('float32', 'bfloat16', 'float16') or config.accum_steps < 1:
    raise ValueError(
        f'config.dtype={config.dtype!r} must be float32, bfloat16 or float16 and '
        f'config.accum_steps={config.accum_steps} at least 1'
    )
  optim.check_optim(config, model_config)
  mesh = mesh_shape(config.mesh, devices)
  sharding.check_model_fits(
      AbstractMesh(tuple(mesh.values()), tuple(mesh)),
      config.variant,
      variants.FAMILIES['ViT'].tensor_split(model_config) | task.tensor_split(config),
  )
  multiple = mesh.get('data', 1) * mesh.get('fsdp', 1) * config.accum_steps
  if config.batch_size % multiple:
    raise ValueError(
        f'config.batch_size={config.batch_size} is not divisible by the batch axes of '
        f'{mesh_name(mesh)} x accum_steps={config.accum_steps}: use a multiple of {multiple}'
    )
  return mesh


def mesh_name(mesh: dict[str, int]) -> str:
  return ' x '.join(f'{name}={size}' for name, size in mesh.items())


def suggest(
    config: ml_collections.ConfigDict, traced: footprint.Traced, target: chips.Target
) -> list[footprint.Estimate]:
  """Meshes (data, fsdp, fsdp x 2/4/8-way tensor where heads divide) x REMATS, each with the fewest
  accumulation steps that fit; fastest first, then fewer accumulation steps (larger matmuls), less
  remat, a simpler mesh (less communication), less memory."""
  n, heads, mlp = target.devices, traced.model['num_heads'], traced.model['mlp_dim']
  meshes = (
      [{'data': n}]
      + ([{'fsdp': n}] if n > 1 else [])
      + [{'fsdp': n // t, 'tensor': t} for t in (2, 4, 8) if not (n % t or heads % t or mlp % t)]
  )
  found = []
  for mesh in meshes:
    for remat in footprint.REMATS:
      accum = 1
      while config.batch_size % (mesh.get('data', 1) * mesh.get('fsdp', 1) * accum) == 0:
        if target.fits(e := footprint.estimate(config, traced, mesh, remat, accum, target)):
          found.append(e)
          break
        accum *= 2
  return sorted(
      found,
      key=lambda e: (
          round(e.step_s, 6),
          e.accum_steps,
          footprint.REMATS.index(e.remat),
          max(MESH_ORDER.index(axis) for axis in e.mesh),
          e.total,
      ),
  )
