"""Expands a sweep file into runs: one after another here, as a SLURM job array, or printed.

  python launch/sweep.py --sweep=configs/sweeps/demo_lr_steps.py --workdir=workdirs/sweep [--print]
  python launch/sweep.py --sweep=... --workdir=/shared/sweep --slurm='--nodes=2' [--print]

--slurm writes the runs' arguments to WORKDIR/sweep_runs.txt and submits launch/slurm.sbatch as a job
array, one element per run (with the given sbatch options; --print only prints that sbatch line).

A sweep file names the experiment config (`CONFIG = 'configs/X.py[:arg]'`) and defines `get_sweep()`,
a list of dicts of config overrides. In each dict, a value that is a list is swept: the dict stands for
the product of its lists. The list of dicts is concatenated. The key 'config' is the config file of
those runs instead of CONFIG (and may be swept too: one task a config argument, e.g. vtab_lr.py).
Each run gets its own workdir, named after its overrides, under --workdir (two runs whose names would
be the same are an error). Arguments after `--` go to every run (e.g. `-- --config.seed=1`); one that
sets a field the sweep file sets (or --config, or --workdir) is an error: it would make the runs of
that field the same, in folders named apart. So is a field a run's config does not have; each is one
line before any run starts.

Runs one after another stop as one run does: Ctrl-C or SIGTERM saves the run at its step, and the
sweep exits with its status 75; the same command resumes it (a finished run only evaluates again).
A second signal kills the run unsaved; a sweep killed outright leaves no run going (stopping.py).

WORKDIR/sweep.json records the sweep file and its runs' commands; a run logging to Weights & Biases
(config.wandb.project) whose workdir it lists is in the W&B group named after WORKDIR, unless
config.wandb.group names another (vit_jax/train/wandb_writer.py reads it). --print alone writes
nothing (its commands may run where WORKDIR is another folder): `-- --config.wandb.group=NAME` groups
its runs.
"""

import argparse
import difflib
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

import stopping
from local import REQUEUE_STATUS  # A run that stopped to be resumed: Ctrl-C or SIGTERM.
from vit_jax import defaults
from vit_jax.runtime import config_files, config_overrides, paths

_NAME_BYTES = 255  # The longest file name most file systems take.
_REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  `configs/X.py` from its repository's root), else in this checkout (its shipped configs), absolute;
  unchanged if none has it."""
  path, colon, arg = config.partition(':')
  if os.path.isabs(path) or os.path.isfile(path):
    return config
  directory = os.path.dirname(os.path.abspath(sweep_file))
  while not os.path.isfile(os.path.join(directory, path)):
    if os.path.dirname(directory) == directory:
      shipped = os.path.join(_REPOSITORY, path)  # A config this checkout ships.
      return shipped + colon + arg if os.path.isfile(shipped) else config
    directory = os.path.dirname(directory)
  return os.path.join(directory, path) + colon + arg


class SweepError(ValueError):
  """A sweep that cannot run as asked; the message is one line naming the fix."""


def _field_of(arg: str) -> str | None:
  """The config field an argument of vit_jax.main sets ('config' for the file, 'workdir'), or None;
  in each of absl's spellings: one dash or two, a boolean's --noconfig.FIELD."""
  match = re.fullmatch(r'--?(?:no)?(config(?:\.[\w.]+)?|workdir)(=.*)?', arg)
  return match and match.group(1).removeprefix('config.')


def check_extra_args(runs: list[dict[str, Any]], extra_args: list[str]) -> None:
  """Raises SweepError where an argument for every run sets what the sweep sets: a field (or a field
  inside it, or one it is inside), the config file, or the workdir (each run has its own)."""
  set_by_sweep = {key for overrides in runs for key in overrides} | {'config', 'workdir'}
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
          f'({", ".join(values) or ("its CONFIG" if clash == "config" else "each run its own")}): '
          'the runs would differ only in '
          f'their folder names; change {clash!r} in the sweep file, or leave the flag out'
      )


def _module(path: str, name: str) -> Any:
  """The Python file at `path`, run as the module `name`."""
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load(sweep_file: str) -> tuple[list[dict[str, Any]], list[str]]:
  """The runs of `sweep_file` (each its overrides) and each one's config file as the sweep file
  names it; SweepError for a file that is no sweep file."""
  try:
    module = _module(sweep_file, 'sweep')
    sweep = module.get_sweep() if hasattr(module, 'get_sweep') else None
  except Exception as e:  # pylint: disable=broad-except  # Its own code: an import, a typo.
    said = str(e).strip().splitlines()[-1] if str(e).strip() else ''
    raise SweepError(f'cannot load --sweep={sweep_file}: {type(e).__name__}: {said}') from None
  if (
      not isinstance(sweep, list)
      or not all(isinstance(entry, dict) for entry in sweep)
      or not all(isinstance(key, str) for entry in sweep for key in entry)
  ):
    raise SweepError(
        f'--sweep={sweep_file} must define get_sweep() returning a list of dicts of config '
        "overrides by field name, e.g. [{'lr.base': [1e-3, 3e-3]}]"
    )
  runs = expand(sweep)
  if not runs:
    raise SweepError(
        f'--sweep={sweep_file} has no runs: get_sweep() gives no dict, or an empty list'
    )
  configs = [overrides.get('config') or getattr(module, 'CONFIG', None) for overrides in runs]
  if not all(configs):
    raise SweepError(
        f"--sweep={sweep_file} names no config: set CONFIG = 'configs/X.py' in it, or 'config' in "
        'each of its dicts'
    )
  return runs, configs


def _check_fields(
    runs: list[dict[str, Any]],
    configs: list[str],
    resolved: dict[str, str],
    sweep_file: str,
    extra_args: list[str],
) -> None:
  """SweepError for a config file that is not there, or a field a run's config lacks (a typo),
  before any run starts: each run would say so only once started, every element of a job array once
  submitted. A config file that does not load is left to vit_jax.main, which says why. `resolved`:
  each config as `config_file` finds it."""
  given = [_field_of(arg) for arg in extra_args]
  for config in sorted(set(configs)):
    path = resolved[config].partition(':')[0]
    if not os.path.isfile(path):
      raise SweepError(
          f'config file {path} of --sweep={sweep_file} does not exist (from here, nor from the '
          "sweep file's folder or those above it): fix its name"
      )
    loaded = _loaded_config(resolved[config])
    if loaded is None:
      continue
    fields = set(_fields(loaded))
    swept = [k for overrides, c in zip(runs, configs) if c == config for k in overrides]
    for field in [*swept, *given]:
      # An evaluator is given whole (evals.NAME=dict(...)), or dropped: vit_jax.main checks it.
      if config_overrides.evaluator_name(field or ''):
        continue
      if field not in (None, 'config', 'workdir') and field not in fields:
        close = difflib.get_close_matches(field, fields, n=1)
        raise SweepError(
            f'{field!r} is no field of the config of --config={config}'
            + (f': did you mean {close[0]!r}?' if close else '')
        )
    for overrides in (o for o, c in zip(runs, configs) if c == config):
      _check_values(loaded, overrides)


def _check_values(config: Any, overrides: dict[str, Any]) -> None:
  """SweepError for a value of another type than its field's (each run would fail at its start;
  one of a job array, once it is scheduled). None and evaluators are left to vit_jax.main."""
  for field, value in overrides.items():
    if field == 'config' or value is None or config_overrides.evaluator_name(field):
      continue
    *parents, name = field.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    kept = node[name]
    try:
      node[name] = value  # A ConfigDict checks the type.
    except (TypeError, ValueError):
      raise SweepError(
          f'the sweep sets {field}={value!r} (run {overrides}): '
          f'{config_overrides.expected_value(field)}'
      ) from None
    finally:
      node[name] = kept


def _loaded_config(config: str) -> Any:
  """The ConfigDict of `FILE[:ARG]`, or None where it does not load."""
  path, _, arg = config.partition(':')
  sys.path.insert(0, config_files.import_root(path))  # Its `from configs import ...`, as main's.
  try:
    module = _module(path, 'config')
    return module.get_config(arg) if arg else module.get_config()
  except Exception:  # pylint: disable=broad-except
    return None
  finally:
    del sys.path[0]


def _fields(config: Any, prefix: str = '') -> list[str]:
  """Every field of a ConfigDict, dotted ('lr', 'lr.base', ...), as --config.FIELD overrides name
  them."""
  found = []
  for key, value in config.items():
    found.append(prefix + key)
    if hasattr(value, 'items'):
      found += _fields(value, f'{prefix}{key}.')
  return found


def commands(sweep_file: str, workdir: str, extra_args: list[str]) -> list[list[str]]:
  """Each run's vit_jax.main command; raises SweepError for a sweep that cannot run as asked: an
  argument that clashes with it, a field its config lacks, two runs in one workdir."""
  runs, configs = load(sweep_file)
  check_extra_args(runs, extra_args)
  resolved = {config: config_file(config, sweep_file) for config in set(configs)}
  _check_fields(runs, configs, resolved, sweep_file, extra_args)
  named, same, cmds = {}, {}, []
  for overrides, config in zip(runs, configs):
    name = run_name(overrides)
    # The same overrides in another order: the same run in two workdirs.
    run = repr((config, sorted(overrides.items())))
    if run in same:
      raise SweepError(f'the sweep runs {overrides} twice (as {same[run]} too): drop the repeat')
    same[run] = overrides
    if name in named:
      raise SweepError(
          f'two runs of the sweep would share the workdir {name!r} ({named[name]} and '
          f'{overrides}): give them values that differ in more than punctuation, or drop the repeat'
      )
    if len(name.encode()) > _NAME_BYTES:
      raise SweepError(
          f'the workdir name of run {overrides} is {len(name.encode())} bytes, more than a file '
          f'name may have ({_NAME_BYTES}): sweep fewer fields in one dict, or shorter values'
      )
    named[name] = overrides
    cmds.append(
        [
            sys.executable,
            '-m',
            'vit_jax.main',
            f'--config={resolved[config]}',
            f'--workdir={workdir.rstrip("/")}/{name}',
            *(f'--config.{k}={v}' for k, v in overrides.items() if k != 'config'),
            *extra_args,
        ]
    )
  return cmds


def check_root(workdir: str, slurm: bool) -> None:
  """SweepError unless the sweep can write in its root `workdir` (and, for a SLURM job array, the
  job can read its runs there), checked before anything is written or submitted."""
  if slurm and paths.is_url(workdir):
    raise SweepError(
        f'--slurm needs a --workdir on a file system the nodes share, where the job reads its '
        f'runs (sweep_runs.txt), not {workdir}: run the sweep without --slurm, or from such a folder'
    )
  try:
    paths.check_writable(workdir, defaults.get_config().storage_timeout_s)
  except ValueError as e:
    raise SweepError(str(e)) from None


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
  reads them) and returns the sbatch command of the job array that runs them. Submitted from the
  current directory, where the job starts (SLURM_SUBMIT_DIR): the runs' relative paths are read
  there, as when they run one after another; the job runs this Python (VIT_JAX_PYTHON)."""
  os.makedirs(workdir, exist_ok=True)
  runs_file = os.path.abspath(os.path.join(workdir, 'sweep_runs.txt'))
  with open(runs_file, 'w') as f:
    f.writelines(shlex.join(cmd[3:]) + '\n' for cmd in runs)  # Without `python -m vit_jax.main`.
  return [
      'sbatch',
      f'--array=0-{len(runs) - 1}',
      f'--output={os.path.abspath(workdir)}/slurm-%A_%a.out',
      f'--export=ALL,VIT_JAX_PYTHON={sys.executable}',
      *shlex.split(sbatch_options),
      os.path.join(os.path.dirname(os.path.abspath(__file__)), 'slurm.sbatch'),
      f'--sweep_runs={runs_file}',
  ]


def run_one(cmd: list[str]) -> tuple[int, int]:
  """Runs `cmd` to its end; (its exit status, how many times the sweep was signalled meanwhile).
  Ctrl-C and SIGTERM to the sweep reach the run as SIGTERM, a preemption: it saves and exits 75
  (Ctrl-C reaches it from the terminal too; a second SIGINT would stop it unsaved). A second signal
  to the sweep kills it (stopping.Stopper)."""
  with stopping.Stopper() as stopper:
    stopper.add(subprocess.Popen(stopping.ended_with_launcher(cmd)))
    return stopper.processes[0].wait(), stopper.signals


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
  only_print = args.print and args.slurm is None  # Writes nothing: the commands may run elsewhere.
  try:
    runs = commands(args.sweep, args.workdir, extra)
    if not only_print:
      check_root(args.workdir, slurm=args.slurm is not None)
  except SweepError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)
  if only_print:
    print('\n'.join(shlex.join(cmd) for cmd in runs))
    return
  write_sweep_file(args.sweep, args.workdir, runs)  # With --slurm --print too: its line runs them.
  if args.slurm is not None:
    sbatch = slurm_array(runs, args.workdir, args.slurm)
    print(shlex.join(sbatch), flush=True)
    if not args.print:
      sys.exit(subprocess.run(sbatch).returncode)
    return
  failed = []
  for i, cmd in enumerate(runs, 1):
    print(f'[{i}/{len(runs)}] {shlex.join(cmd)}', flush=True)
    status, signals = run_one(cmd)
    if signals or status == REQUEUE_STATUS:
      unsaved = ', killed unsaved by a second signal' if signals > 1 else ''
      print(
          f'error: the sweep stopped at run {i} of {len(runs)} (status {status}{unsaved}): the '
          'same command resumes it, each finished run only evaluated again',
          file=sys.stderr,
      )
      sys.exit(status if status > 0 else 128 - status if status < 0 else REQUEUE_STATUS)
    if status:
      failed.append(cmd)
  if failed:
    sys.exit(
        f'{len(failed)} of {len(runs)} runs failed: ' + '; '.join(shlex.join(c) for c in failed)
    )


if __name__ == '__main__':
  main()
