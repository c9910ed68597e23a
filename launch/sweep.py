"""Expands a sweep file into runs: one after another here, or printed as one command per run.

  python launch/sweep.py --sweep=configs/sweeps/demo_lr_steps.py --workdir=workdirs/sweep [--print]

A sweep file names the experiment config (`CONFIG = 'configs/X.py[:arg]'`) and defines `get_sweep()`,
a list of dicts of config overrides. In each dict, a value that is a list is swept: the dict stands for
the product of its lists. The list of dicts is concatenated. Each run gets its own workdir, named after
its overrides, under --workdir. Arguments after `--` go to every run (e.g. `-- --config.seed=1`).
"""
import argparse
import importlib.util
import itertools
import re
import shlex
import subprocess
import sys
from typing import Any


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


def commands(sweep_file: str, workdir: str, extra_args: list[str]) -> list[list[str]]:
  spec = importlib.util.spec_from_file_location('sweep', sweep_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return [[sys.executable, '-m', 'vit_jax.main', f'--config={module.CONFIG}',
           f'--workdir={workdir.rstrip("/")}/{run_name(overrides)}',
           *(f'--config.{k}={v}' for k, v in overrides.items()), *extra_args]
          for overrides in expand(module.get_sweep())]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument('--sweep', required=True, help='A sweep file, e.g. configs/sweeps/X.py.')
  parser.add_argument('--workdir', required=True, help='Root of the runs\' workdirs.')
  parser.add_argument('--print', action='store_true', help='Print the commands instead of running them.')
  parser.add_argument('extra', nargs=argparse.REMAINDER, help='After --: arguments for every run.')
  args = parser.parse_args()
  extra = args.extra[1:] if args.extra[:1] == ['--'] else args.extra
  runs = commands(args.sweep, args.workdir, extra)
  if args.print:
    print('\n'.join(shlex.join(cmd) for cmd in runs))
    return
  failed = []
  for i, cmd in enumerate(runs, 1):
    print(f'[{i}/{len(runs)}] {shlex.join(cmd)}', flush=True)
    if subprocess.run(cmd).returncode:
      failed.append(cmd)
  if failed:
    sys.exit(f'{len(failed)} of {len(runs)} runs failed: ' + '; '.join(shlex.join(c) for c in failed))


if __name__ == '__main__':
  main()
