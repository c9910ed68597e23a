"""The VTAB-1k table of a sweep's runs (configs/vtab.py, configs/sweeps/vtab_lr.py).

  python -m vit_jax.tools.vtab SWEEP_ROOT [SWEEP_ROOT ...] [--out=DIR] [--select=per_task|shared]

A task's learning rate is that of its sweep run (trained on train800) with the best val200 top-1 at
its last step (`--select=per_task`, the default), or with `--select=shared` the paper's protocol: one
rate for every task, the one whose mean val200 top-1 over the tasks is best; its test top-1 is that of the task's final run at that rate (trained on
train800val200: configs/vtab.py:TASK,final) where the roots hold one, else that of the sweep run.
Prints the table, a row a task of each group (natural, specialized, structured), each group's mean
and the mean over all tasks (the VTAB score), over the tasks that have a result; --out also writes
it to DIR/vtab.md and DIR/vtab.csv (top-1 as logged, fractions). Runs are recognised by their
config.json (dataset vtab/<task>; the sweep phase has evals.val200), not their directory names; a run
that has not evaluated its last step yet is left out.
"""

if __name__ == '__main__':  # Before anything loads TensorFlow (vit_jax.data does).
  from vit_jax.runtime import quiet  # pylint: disable=g-import-not-at-top

  quiet.quiet_tensorflow()

import csv
import dataclasses
import io
from typing import Sequence

import numpy as np
from absl import flags
from etils import epath

from vit_jax.runtime import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools.runs import find_runs, load_run, Run  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.data import vtab as vtab_data  # pylint: disable=g-import-not-at-top,wrong-import-position

_USAGE = 'SWEEP_ROOT [SWEEP_ROOT ...] [--out=DIR] [--select=per_task|shared]'
TEST_METRIC = 'eval_top1'  # configs/vtab.py evaluates the test split as eval_split in both phases.
VAL_METRIC = 'val200_top1'


@dataclasses.dataclass(frozen=True)
class Row:
  """A task's result, or a mean over tasks (task 'mean', source 'k of n tasks')."""

  group: str
  task: str
  lr: float | None = None
  val200_top1: float | None = None
  test_top1: float | None = None
  source: str = ''  # 'final run' | 'sweep run' | 'k of n tasks'.
  run: str = ''


def _last_value(run: Run, metric: str) -> float | None:
  """The metric at the run's last step (its config's total_steps), None while it is not there."""
  return run.scalars.get(metric, {}).get(run.config.get('total_steps'))


def _rank(value: float) -> float:
  """A val200 top-1 to choose by: a non-finite one (a diverged run's, or a mean holding one) ranks
  below every other, where `max` would keep a NaN met first, e.g. at the lowest rate."""
  return value if np.isfinite(value) else -np.inf


def vtab_runs(runs: Sequence[Run]) -> dict[str, dict[str, list[Run]]]:
  """task -> {'sweep': runs, 'final': runs}: the VTAB runs that have logged their last step's test
  top-1 (and val200 top-1, in the sweep phase)."""
  found = {name: {'sweep': [], 'final': []} for name in vtab_data.TASKS}
  for run in runs:
    dataset = run.config.get('dataset')
    phase = 'sweep' if 'evals.val200.split' in run.config else 'final'
    metrics = (TEST_METRIC, VAL_METRIC) if phase == 'sweep' else (TEST_METRIC,)
    if dataset in vtab_data.SOURCES and all(_last_value(run, m) is not None for m in metrics):
      found[dataset.removeprefix('vtab/')][phase].append(run)
  return found


def task_row(
    name: str, sweep: Sequence[Run], final: Sequence[Run], rate: float | None = None
) -> Row:
  """The task's result: the best val200 learning rate (or `rate`, when given), and the test top-1 of
  the final run at it (or of that sweep run); empty where the task has no finished run."""
  group = vtab_data.TASKS[name].group
  if rate is not None:
    sweep = [run for run in sweep if run.config['lr.base'] == rate]
    final = [run for run in final if run.config['lr.base'] == rate]
  # Of equally good rates, the lowest.
  best = max(
      sorted(sweep, key=lambda r: r.config['lr.base']),
      default=None,
      key=lambda r: _rank(_last_value(r, VAL_METRIC)),
  )
  lr = best.config['lr.base'] if best else None
  finals = [run for run in final if lr is None or run.config['lr.base'] == lr]
  if len(finals) > 1:
    which = f'at lr {lr:g}' if best else 'and no sweep run to choose a rate'
    raise ValueError(
        f'VTAB task {name} has {len(finals)} final runs {which}: '
        f'{", ".join(r.name for r in finals)}: leave one of them under the roots'
    )
  val200 = _last_value(best, VAL_METRIC) if best else None
  if finals:
    return Row(
        group,
        name,
        finals[0].config['lr.base'],
        val200,
        _last_value(finals[0], TEST_METRIC),
        'final run',
        finals[0].name,
    )
  if best:
    return Row(group, name, lr, val200, _last_value(best, TEST_METRIC), 'sweep run', best.name)
  return Row(group, name)


def shared_rate(found: dict[str, dict[str, list[Run]]]) -> float | None:
  """The paper's choice (Appendix B.1.1, after BiT): the one learning rate whose mean val200 top-1 over
  the tasks is best, among the rates swept on every swept task; of equally good rates the lowest.
  None without sweep runs (the final runs' own rates are then used)."""
  by_rate: dict[float, dict[str, float]] = {}
  for name, phases in found.items():
    for run in phases['sweep']:
      by_rate.setdefault(run.config['lr.base'], {})[name] = _last_value(run, VAL_METRIC)
  swept = {name for values in by_rate.values() for name in values}
  complete = {lr: values for lr, values in by_rate.items() if values.keys() == swept}
  if by_rate and not complete:
    raise ValueError(
        f'no learning rate was swept on all of the {len(swept)} swept tasks '
        f'(rates: {", ".join(f"{lr:g}" for lr in sorted(by_rate))}): finish the sweep, or '
        'use --select=per_task'
    )
  return max(
      sorted(complete), key=lambda lr: _rank(np.mean(list(complete[lr].values()))), default=None
  )


# --select: how a task's learning rate is chosen, from the VTAB runs found (None: each task's best).
SELECTIONS = {'per_task': lambda found: None, 'shared': shared_rate}


def mean_row(group: str, rows: Sequence[Row]) -> Row:
  values = [row.test_top1 for row in rows if row.test_top1 is not None]
  return Row(
      group,
      'mean',
      test_top1=float(np.mean(values)) if values else None,
      source=f'{len(values)} of {len(rows)} tasks',
  )


def table(runs: Sequence[Run], select: str = 'per_task') -> list[Row]:
  """Each group's task rows then its mean, and the mean over all tasks last, the rates chosen by
  SELECTIONS[select]; a one-line ValueError when no run is a finished VTAB run."""
  if select not in SELECTIONS:
    raise ValueError(f'unknown --select={select}: use one of {", ".join(SELECTIONS)}')
  found = vtab_runs(runs)
  if not any(phase for phases in found.values() for phase in phases.values()):
    raise ValueError(
        'no finished VTAB run: none has a config.json with dataset vtab/<task> '
        '(configs/vtab.py:TASK) and its test top-1 at its last step'
    )
  rate = SELECTIONS[select](found)
  tasks = [
      task_row(name, found[name]['sweep'], found[name]['final'], rate) for name in vtab_data.TASKS
  ]
  rows = []
  for group in vtab_data.GROUPS:
    members = [row for row in tasks if row.group == group]
    rows += [*members, mean_row(group, members)]
  return rows + [mean_row('all', tasks)]


def _percent(value: float | None) -> str:
  return '' if value is None else f'{100 * value:.2f}'


def to_markdown(rows: Sequence[Row]) -> str:
  lines = [
      '| group | task | lr | val200 top-1 (%) | test top-1 (%) | test from | run |',
      '|---|---|---|---|---|---|---|',
  ]
  for row in rows:
    task = f'**{row.task}**' if row.task == 'mean' else row.task
    lines.append(
        f'| {row.group} | {task} | {"" if row.lr is None else f"{row.lr:g}"} | '
        f'{_percent(row.val200_top1)} | {_percent(row.test_top1)} | {row.source} | {row.run} |'
    )
  return '\n'.join(lines) + '\n'


def to_csv(rows: Sequence[Row]) -> str:
  buffer = io.StringIO()
  writer = csv.writer(buffer, lineterminator='\n')
  writer.writerow(field.name for field in dataclasses.fields(Row))
  for row in rows:  # repr-exact floats: the numbers the runs logged.
    writer.writerow(['' if v is None else v for v in dataclasses.astuple(row)])
  return buffer.getvalue()


def vtab_table(
    roots: Sequence[str], out: str | None = None, select: str = 'per_task'
) -> tuple[str, list[str]]:
  """The markdown table of the VTAB runs under `roots`, and the files written to `out` (if given).
  Bad input is a one-line ValueError, raised before anything is written."""
  rows = table([load_run(name, path) for name, path in find_runs(roots)], select)
  markdown = to_markdown(rows)
  if not out:
    return markdown, []
  cli.make_out_dir(out)
  written = [epath.Path(out) / 'vtab.md', epath.Path(out) / 'vtab.csv']
  written[0].write_text(markdown)
  written[1].write_text(to_csv(rows))
  return markdown, [str(path) for path in written]


def main(argv: list[str]) -> None:
  if len(argv) < 2:
    cli.fail(f'no SWEEP_ROOT given: use {_USAGE}')
  try:
    markdown, written = vtab_table(argv[1:], flags.FLAGS.out, flags.FLAGS.select)
  except ValueError as e:
    cli.fail(str(e))
  print(markdown + ''.join(f'\n{path}' for path in written))


if __name__ == '__main__':
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('out', None, 'Directory to write vtab.md and vtab.csv (optional).')
  flags.DEFINE_string(
      'select',
      'per_task',
      "How each task's learning rate is chosen on val200: "
      "per_task (its best) or shared (the paper's: one rate, best mean over tasks).",
  )
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
