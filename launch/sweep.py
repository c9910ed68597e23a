"""Expands a sweep file into runs: one after another here, as a SLURM job array, or printed.

  python launch/sweep.py --sweep=configs/sweeps/demo_lr_steps.py --workdir=workdirs/sweep [--print]
  python launch/sweep.py --sweep=... --workdir=/shared/sweep --slurm='--nodes=2' [--print]

--slurm writes the runs' arguments to WORKDIR/sweep_runs.txt and submits launch/slurm.sbatch as a job
array, one element per run (with the given sbatch options; --print only prints that sbatch line).

A sweep file names the experiment config (`CONFIG = 'configs/X.py[:arg]'`) and defines `get_sweep()`,
a list of dicts of config overrides. In each dict, a value that is a list is swept: the dict stands for
the product of its lists. The list of dicts is concatenated. The key 'config' is the config file of
those runs instead of CONFIG (and may be swept too: one task a config argument, e.g. vtab_lr.py).
Each run gets its own workdir, named after its overrides, under --workdir. Arguments after `--` go to
every run (e.g. `-- --config.seed=1`); one that sets a field the sweep file sets (or --config, or
--workdir) is an error: it would make the runs of that field the same, in folders named apart.

WORKDIR/sweep.json records the sweep file and its runs' commands; a run logging to Weights & Biases
(config.wandb.project) whose workdir it lists is in the W&B group named after WORKDIR, unless
config.wandb.group names another (vit_jax/train/wandb_writer.py reads it).
"""

import argparse
import importlib.util
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from typing import Any

from etils import epath


def expand(sweep: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """A list of dicts whose list values are swept -> the flat list of single runs' overrides."""
  runs = []
  for entry in sweep:
    keys = list(entry)
    choices = [entry[k] if isinstance(entry[k], list) else [entry[k]] for k in keys]
    runs.extend(dict(zip(keys, values)) for values in itertools.product(*choices))
  return runs


def run_name(overrides: dict[str, Any]) -> str:
  """A directory name that tells the runs apart: 'lr.base=0.001,total_steps=500'."""
  name = ','.join(f'{k}={v}' for k, v in overrides.items()) or 'base'
  return re.sub(r'[^A-Za-z0-9_.,=+-]', '_', name)


def config_file(config: str, sweep_file: str) -> str:
  """A sweep's `FILE[:ARG]` config: as written when FILE is found from the current directory, else
  FILE under the sweep file's directory or the nearest of its parents that has it (a sweep file names
  `configs/X.py` from its repository's root), absolute; unchanged if none has it (vit_jax.main says so).
  """
  path, colon, arg = config.partition(':')
  if os.path.isabs(path) or os.path.isfile(path):
    return config
  directory = os.path.dirname(os.path.abspath(sweep_file))
  while not os.path.isfile(os.path.join(directory, path)):
    if os.path.dirname(directory) == directory:
      return config
    directory = os.path.dirname(directory)
  return os.path.join(directory, path) + colon + arg


class SweepError(ValueError):
  """A sweep that cannot run as asked; the message is one line naming the fix."""


def _field_of(arg: str) -> str | None:
  """The config field an argument of vit_jax.main sets ('config' for the file, 'workdir'), or None."""
  match = re.fullmatch(r'--(config(?:\.[\w.]+)?|workdir)(=.*)?', arg)
  return match and match.group(1).removeprefix('config.')


def check_extra_args(runs: list[dict[str, Any]], extra_args: list[str]) -> None:
  """Raises SweepError where an argument for every run sets what the sweep sets: a field (or a field
  inside it, or one it is inside), the config file, or the workdir (each run has its own)."""
  set_by_sweep = {key for overrides in runs for key in overrides} | {'workdir'}
  for arg in extra_args:
    field = _field_of(arg)
    clash = field and next(
        (
            key
            for key in sorted(set_by_sweep)
            if key == field or key.startswith(f'{field}.') or field.startswith(f'{key}.')
        ),
        None,
    )
    if clash:
      values = sorted({str(overrides[clash]) for overrides in runs if clash in overrides})
      raise SweepError(
          f'{arg} (after --) sets {clash!r}, which the sweep file sets '
          f'({", ".join(values) or "each run its own"}): the runs would differ only in '
          f'their folder names; change {clash!r} in the sweep file, or leave the flag out'
      )


def commands(sweep_file: str, workdir: str, extra_args: list[str]) -> list[list[str]]:
  """Each run's vit_jax.main command; raises SweepError for an argument that clashes with the sweep."""
  spec = importlib.util.spec_from_file_location('sweep', sweep_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  check_extra_args(expand(module.get_sweep()), extra_args)
  return [
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          f'--config={config_file(overrides.get("config") or module.CONFIG, sweep_file)}',
          f'--workdir={workdir.rstrip("/")}/{run_name(overrides)}',
          *(f'--config.{k}={v}' for k, v in overrides.items() if k != 'config'),
          *extra_args,
      ]
      for overrides in expand(module.get_sweep())
  ]


def write_sweep_file(sweep_file: str, workdir: str, runs: list[list[str]]) -> None:
  """WORKDIR/sweep.json (a local folder or cloud storage): the sweep file, and each run's
  vit_jax.main arguments by its workdir's name."""
  listed = {'sweep': os.path.abspath(sweep_file), 'runs': {}}
  for cmd in runs:
    run_workdir = next(a for a in cmd if a.startswith('--workdir=')).partition('=')[2]
    listed['runs'][run_workdir.rpartition('/')[2]] = cmd[3:]
  root = epath.Path(workdir)
  root.mkdir(parents=True, exist_ok=True)
  (root / 'sweep.json').write_text(json.dumps(listed, indent=2))


def slurm_array(runs: list[list[str]], workdir: str, sbatch_options: str) -> list[str]:
  """Writes WORKDIR/sweep_runs.txt (each run's vit_jax.main arguments, a line each, as launch/slurm.sbatch
  reads them) and returns the sbatch command of the job array that runs them."""
  os.makedirs(workdir, exist_ok=True)
  runs_file = os.path.abspath(os.path.join(workdir, 'sweep_runs.txt'))
  with open(runs_file, 'w') as f:
    f.writelines(shlex.join(cmd[3:]) + '\n' for cmd in runs)  # Without `python -m vit_jax.main`.
  return [
      'sbatch',
      f'--array=0-{len(runs) - 1}',
      f'--output={os.path.abspath(workdir)}/slurm-%A_%a.out',
      *shlex.split(sbatch_options),
      'launch/slurm.sbatch',
      f'--sweep_runs={runs_file}',
  ]


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--sweep', required=True, help='A sweep file, e.g. configs/sweeps/X.py.')
  parser.add_argument('--workdir', required=True, help="Root of the runs' workdirs.")
  parser.add_argument(
      '--print', action='store_true', help='Print the commands instead of running them.'
  )
  parser.add_argument(
      '--slurm',
      nargs='?',
      const='',
      default=None,
      metavar='SBATCH_OPTIONS',
      help='Submit the runs as a SLURM job array, with these sbatch options.',
  )
  parser.add_argument('extra', nargs=argparse.REMAINDER, help='After --: arguments for every run.')
  args = parser.parse_args()
  extra = args.extra[1:] if args.extra[:1] == ['--'] else args.extra
  try:
    runs = commands(args.sweep, args.workdir, extra)
  except SweepError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  if args.slurm is not None:
    write_sweep_file(args.sweep, args.workdir, runs)  # With --print too: the sbatch line runs them.
    sbatch = slurm_array(runs, args.workdir, args.slurm)
    print(shlex.join(sbatch), flush=True)
    if not args.print:
      sys.exit(
          subprocess.run(
              sbatch, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
          ).returncode
      )
    return
  if args.print:
    print('\n'.join(shlex.join(cmd) for cmd in runs))
    return
  write_sweep_file(args.sweep, args.workdir, runs)
  failed = []
  for i, cmd in enumerate(runs, 1):
    print(f'[{i}/{len(runs)}] {shlex.join(cmd)}', flush=True)
    if subprocess.run(cmd).returncode:
      failed.append(cmd)
  if failed:
    sys.exit(
        f'{len(failed)} of {len(runs)} runs failed: ' + '; '.join(shlex.join(c) for c in failed)
    )


if __name__ == '__main__':
  main()
