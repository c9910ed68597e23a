"""The checks of config fields that only the set-up reads: names, numbers, batch sizes. Each bad
value is a one-line ValueError that names the fix."""

import difflib
import math
import threading
from typing import Any

import jax
import ml_collections
from jax.sharding import Mesh

from vit_jax import defaults, sharding
from vit_jax.checkpoints import patch_resizing, posemb_resizing

DTYPES = ('float32', 'bfloat16', 'float16')
# The shortest watchdog limit (config.hang_timeout_s) a run takes.
MIN_HANG_TIMEOUT_S = 10.0
MAX_DEVICE_PREFETCH = 32  # Batches on the devices ahead of their step: a few overlap the copies.
# Steps between the loop's periodic actions, and checkpoints kept: each at least 1.
_POSITIVE_COUNTS = ('log_every_steps', 'checkpoint_every_steps', 'keep_checkpoints')
# Dicts of the config whose keys are names the user picks, not fields (evaluators checks config.evals).
_OPEN_DICTS = ('evals',)
# jax.random.key takes a signed 64-bit integer (the input pipeline hashes it as an unsigned word).
_SEEDS = range(-(2**63), 2**63)


def check_field_names(
    config: ml_collections.ConfigDict,
    reference: ml_collections.ConfigDict | None = None,
    prefix: str = '',
) -> None:
  """The config has the fields of defaults.get_config(), nested dicts included. A config file may add
  fields (only the command line is locked), so a misspelt one (config.lr.warmup) would change nothing,
  and a dict it replaces whole (config.pp = dict(crop='resize')) would lack fields the modules read.
  """
  reference = defaults.get_config() if reference is None else reference
  for name in config.keys():
    if name not in reference:
      close = difflib.get_close_matches(name, list(reference.keys()), n=1)
      hint = (
          f'did you mean config.{prefix}{close[0]}?' if close else 'vit_jax/defaults.py lists them.'
      )
      raise ValueError(
          f'config.{prefix}{name} is not a field of the config, so it would change nothing: '
          f'fix its name in the config file; {hint}'
      )
  for name, default in reference.items():
    if name not in config:
      # Nested: the config file replaced the dict `prefix` names; top level: it did not start from
      # the defaults.
      fix = (
          f'set the fields of config.{prefix[:-1]} one by one instead of replacing the dict'
          if prefix
          else 'start the config file from vit_jax.defaults.get_config()'
      )
      example = (
          f'defaults.get_config().{prefix}{name}'
          if isinstance(default, ml_collections.ConfigDict)
          else repr(default)
      )
      raise ValueError(
          f'config.{prefix}{name} is missing: {fix}, e.g. config.{prefix}{name} = {example}'
      )
    if isinstance(default, ml_collections.ConfigDict) and prefix + name not in _OPEN_DICTS:
      if not isinstance(config[name], ml_collections.ConfigDict):
        raise ValueError(
            f'config.{prefix}{name}={config[name]!r} must be the dict of fields that '
            'vit_jax/defaults.py gives it: set its fields one by one (e.g. '
            f'--config.{prefix}{name}.{next(iter(default.keys()))}=...)'
        )
      check_field_names(config[name], default, f'{prefix}{name}.')


def check_batch(name: str, batch_size: int, mesh: Mesh, accum_steps: int = 1) -> None:
  """The batch must split evenly over the devices of the batch axes, micro-batches and processes."""
  shards = sharding.num_batch_shards(mesh)
  multiple = math.lcm(shards * accum_steps, jax.process_count())
  if batch_size < 1:
    raise ValueError(
        f'config.{name}={batch_size} must be at least 1 image: use a multiple of '
        f'{multiple}, e.g. --config.{name}={multiple}'
    )
  if batch_size % multiple:
    suggestion = max(multiple, batch_size // multiple * multiple)
    accum = f' x accum_steps={accum_steps}' if accum_steps > 1 else ''
    raise ValueError(
        f'config.{name}={batch_size} is not divisible by the {shards} devices on the batch axes '
        f'{sharding.batch_axes(mesh)}{accum} (and {jax.process_count()} processes): use a multiple '
        f'of {multiple}, e.g. --config.{name}={suggestion}'
    )


def _whole_number(value: Any, least: int = 1) -> bool:
  """Whether `value` is an int (not a bool) of at least `least`."""
  return not isinstance(value, bool) and isinstance(value, int) and value >= least


def _check_flexi(flexi: ml_collections.ConfigDict) -> None:
  sizes, weights = tuple(flexi.patch_sizes), tuple(flexi.weights)
  if not all(_whole_number(size) for size in sizes) or len(set(sizes)) != len(sizes):
    raise ValueError(
        f'config.flexi.patch_sizes={sizes!r} must be distinct whole numbers of pixels, e.g. '
        "--config.flexi.patch_sizes='(8, 10, 12, 15, 16, 20, 24, 30, 40, 48)' (FlexiViT's at 240 px)"
    )
  if weights and (
      len(weights) != len(sizes)
      or not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights)
      or not all(w > 0 for w in weights)
  ):
    raise ValueError(
        f'config.flexi.weights={weights!r} must be one positive number per patch size '
        f'({len(sizes)}), or empty for equal ones'
    )


def check_numbers(config: ml_collections.ConfigDict) -> None:
  """The fields that no other module reads before the loop does."""
  if config.seed not in _SEEDS:
    raise ValueError(
        f'config.seed={config.seed} must be a signed 64-bit integer, e.g. --config.seed=0'
    )
  if config.dtype not in DTYPES:
    raise ValueError(f'Unknown config.dtype {config.dtype!r}: use one of {", ".join(DTYPES)}')
  for name in ('init_from', 'data_dir'):  # '' read as unset: a fine-tune trained from scratch.
    if config[name] == '':  # pylint: disable=g-explicit-bool-comparison
      raise ValueError(
          f'config.{name} is empty (--config.{name}=$VAR of an unset variable?): give it a '
          'path, or leave it unset'
      )
  for name in _POSITIVE_COUNTS:
    if config[name] < 1:
      raise ValueError(f'config.{name}={config[name]} must be at least 1')
  if not _whole_number(config.aug_repeats):
    raise ValueError(
        f'config.aug_repeats={config.aug_repeats!r} must be a whole number of copies of each '
        "image, e.g. 3 (DeiT's; 1: off)"
    )
  if config.accum_steps < 1:
    raise ValueError(f'config.accum_steps={config.accum_steps} must be at least 1')
  if config.polyak_decay is not None and not 0.0 <= config.polyak_decay < 1.0:
    raise ValueError(
        f'config.polyak_decay={config.polyak_decay} must be in [0, 1), e.g. 0.9999 '
        '(or unset to turn Polyak averaging off)'
    )
  # Each batch ahead is held on the devices: the first step waited for all of them (100000: hours
  # of reading, then out of memory).
  if not 0 <= config.device_prefetch <= MAX_DEVICE_PREFETCH:
    raise ValueError(
        f'config.device_prefetch={config.device_prefetch} must be from 0 to '
        f'{MAX_DEVICE_PREFETCH} batches, e.g. 2 (0: each batch goes to the devices at its step)'
    )
  if config.profile_steps < 0:
    raise ValueError(
        f'config.profile_steps={config.profile_steps} must be at least 0 (0: no trace)'
    )
  # The checks wait on a lock with this timeout: Python refuses one beyond threading.TIMEOUT_MAX.
  if not 0 < config.storage_timeout_s <= threading.TIMEOUT_MAX:
    raise ValueError(
        f'config.storage_timeout_s={config.storage_timeout_s} must be a positive number '
        f'of seconds up to {threading.TIMEOUT_MAX:.0f}, e.g. 60'
    )
  # Below seconds, the watchdog ends every run in its first phase, and a scheduler that requeues a
  # hung run (launch/slurm.sbatch) would start it again and again.
  if not (config.hang_timeout_s == 0 or config.hang_timeout_s >= MIN_HANG_TIMEOUT_S):
    raise ValueError(
        f'config.hang_timeout_s={config.hang_timeout_s} must be 0 (no watchdog) or at least '
        f'{MIN_HANG_TIMEOUT_S:g} seconds, e.g. 1800: the longest a compile, an evaluation or a '
        'save may take'
    )
  if config.data_shards is not None and config.data_shards < 1:
    raise ValueError(
        f'config.data_shards={config.data_shards} must be at least 1 (or unset: one per ' 'process)'
    )
  posemb_resizing.check_posemb_method(config.posemb_interpolation)
  patch_resizing.check_patch_method(config.patch_interpolation)
  _check_flexi(config.flexi)
