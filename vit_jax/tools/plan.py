"""Will it fit? Per-device memory and step time of a config's training on N chips, compiling nothing.

  python -m vit_jax.tools.plan --config=configs/vit_b16_i1k.py --devices=128 --chip=tpu-v4 \
      [--config.FIELD=VALUE ...] [--num_classes=1000] [--mfu=0.4] [--headroom=0.1] [--json]

prints the bytes per device of the parameters, gradients, optimizer state, Polyak copy, activations and
a distillation teacher (config.distill.teacher: its parameters and its forward pass) under the config's mesh and accum_steps, a column per remat policy, whether each fits the chip less the
headroom, and the step time at the assumed MFU; then the mesh / remat / accum_steps that fit, fastest
first (`--json`: the same as one JSON object).

The estimates are vit_jax/planning/footprint.py's; the config's mesh (checked as training would) and
the suggested ones, vit_jax/planning/meshes.py's. The config's fields and model are checked as a run
checks them (train/setup.py's check_fields and resolve_model) before anything is traced.
"""

import dataclasses
import json
from typing import Any

import jax
import ml_collections
from absl import flags
from ml_collections import config_flags

from vit_jax.checkpoints import teacher as teacher_lib
from vit_jax.planning import chips, footprint, meshes
from vit_jax.runtime import cli, config_files
from vit_jax.train import setup as train_setup


def _gib(n: float) -> str:
  return f'{n / 2**30:.2f}'


def render(
    config: ml_collections.ConfigDict,
    traced: footprint.Traced,
    plans: list[footprint.Estimate],
    found: list[footprint.Estimate] | None,
    target: chips.Target,
) -> str:
  """The plans as a markdown table, a column per remat policy, then the suggestions (None: none were
  asked for, --suggestions=0)."""
  mesh, chip = plans[0].mesh, target.chip
  images = config.batch_size // (mesh.get('data', 1) * mesh.get('fsdp', 1))
  count = sum(x.size for x in jax.tree.leaves(traced.state['params']))
  mu = f' (first moment {config.optim.mu_dtype})' if config.optim.mu_dtype else ''
  own = lambda p: ' (config)' if p.remat == config.model.remat and len(plans) > 1 else ''
  lines = [
      f'{config.variant}, {count / 1e6:.1f}M parameters, {config.image_size} px, batch '
      f'{config.batch_size} ({images} per device, accum_steps {config.accum_steps}), '
      f'{config.dtype} compute, {config.optim.name}{mu}',
      f'{target.devices} x {chip.name} ({_gib(chip.hbm_bytes)} GiB, '
      f'{chip.peak_flops / 1e12:.0f} TFLOP/s bf16 each), mesh {meshes.mesh_name(mesh)}; '
      f'{_gib(target.usable_bytes)} GiB usable ({target.headroom:.0%} headroom); step time at '
      f'{target.mfu:.0%} MFU',
      '',
      '| GiB per device | '
      + ' | '.join(f'remat {p.remat or "none"}{own(p)}' for p in plans)
      + ' |',
      '|---' * (len(plans) + 1) + '|',
  ]
  rows = [
      ('parameters (float32)', lambda p: _gib(p.params)),
      ('gradients (float32)', lambda p: _gib(p.gradients)),
      (f'optimizer state ({config.optim.name})', lambda p: _gib(p.optimizer_state)),
      ('Polyak copy', lambda p: _gib(p.polyak) if config.polyak_decay is not None else '-'),
      ('activations', lambda p: _gib(p.activations)),
      (
          'distillation teacher',
          lambda p: _gib(p.teacher) if traced.teacher is not None else '-',
      ),
      ('total', lambda p: _gib(p.total)),
      (f'fits in {_gib(target.usable_bytes)} GiB', lambda p: 'yes' if target.fits(p) else 'NO'),
      ('step time (s)', lambda p: f'{p.step_s:.3f}'),
  ]
  lines += [f'| {name} | ' + ' | '.join(cell(p) for p in plans) + ' |' for name, cell in rows]
  if found is None:
    return '\n'.join(lines)
  if not found:
    return '\n'.join(
        lines + ['', 'Nothing searched fits: more devices, a smaller batch or a larger chip.']
    )
  return '\n'.join(
      lines
      + [
          '',
          'Suggestions that fit, fastest first:',
          '',
          '| mesh | remat | accum_steps | GiB per device | step time (s) |',
          '|---|---|---|---|---|',
      ]
      + [
          f'| {meshes.mesh_name(s.mesh)} | {s.remat or "none"} | {s.accum_steps} | '
          f'{_gib(s.total)} | {s.step_s:.3f} |'
          for s in found
      ]
  )


def as_json(
    config: ml_collections.ConfigDict,
    plans: list[footprint.Estimate],
    found: list[footprint.Estimate],
    target: chips.Target,
) -> dict[str, Any]:
  entry = lambda e: {**dataclasses.asdict(e), 'total': e.total, 'fits': target.fits(e)}
  return {
      'config': {k: config[k] for k in ('variant', 'image_size', 'batch_size', 'dtype')},
      **dataclasses.asdict(target),
      'usable_bytes': target.usable_bytes,
      'plans': [entry(e) for e in plans],
      'suggestions': [entry(e) for e in found],
  }


_USAGE = '--config=FILE --devices=N --chip=NAME [--config.FIELD=VALUE ...] [--json]'


def _define_flags() -> None:
  # Defined only when run as a command: vit_jax.main defines --config too.
  config_flags.DEFINE_config_file(
      'config', None, 'Experiment config file (configs/X.py[:arg]).', lock_config=True
  )
  flags.DEFINE_integer('devices', None, 'Chips the run trains on.')
  flags.DEFINE_string('chip', None, f'The chip: one of {", ".join(chips.CHIPS)}.')
  flags.DEFINE_integer('num_classes', 1000, "The head's classes (the data is not read).")
  flags.DEFINE_float('mfu', 0.4, 'Model FLOPs utilisation assumed for the step time, in (0, 1].')
  flags.DEFINE_float(
      'headroom', 0.1, "Fraction of the chip's memory left to the runtime, in [0, 1)."
  )
  flags.DEFINE_integer('suggestions', 5, 'Suggestions to print at most (0: no search).')
  flags.DEFINE_boolean('json', False, 'Print one JSON object instead of the tables.')
  flags.mark_flags_as_required(['config', 'devices', 'chip'])


def main(argv: list[str]) -> None:
  args = flags.FLAGS
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  config = args.config
  try:
    target = chips.Target(
        chips.get(args.chip), args.devices, args.mfu, args.headroom
    )  # All checked first.
    if not 0 < args.mfu <= 1 or not 0 <= args.headroom < 1:
      raise ValueError(
          f'--mfu={args.mfu} must be in (0, 1] and --headroom={args.headroom} in [0, 1)'
      )
    if args.num_classes < 1 or args.suggestions < 0:
      raise ValueError(
          f'--num_classes={args.num_classes} must be at least 1 and '
          f'--suggestions={args.suggestions} at least 0'
      )
    train_setup.check_fields(config)
    model_config = train_setup.resolve_model(config)
    mesh = meshes.check(config, model_config, args.devices)
    teacher = teacher_lib.architecture(config) if config.distill.teacher else None
    traced = footprint.trace(config, model_config, args.num_classes, teacher)
  except ValueError as e:
    cli.fail(str(e))
  plans = [
      footprint.estimate(config, traced, mesh, remat, config.accum_steps, target)
      for remat in dict.fromkeys((config.model.remat, *footprint.REMATS))
  ]
  found = meshes.suggest(config, traced, target)[: args.suggestions] if args.suggestions else None
  print(  # A reader that stops reading (`| head`): cli.run ends quietly.
      json.dumps(as_json(config, plans, found or [], target))
      if args.json
      else render(config, traced, plans, found, target)
  )


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=config_files.flags_parser(_USAGE))
