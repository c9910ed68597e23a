"""Compares runs: their curves in one picture and their final and best eval metrics in one table.

  python -m vit_jax.tools.report WORKDIR [WORKDIR ...] --out=DIR
  python -m vit_jax.tools.report SWEEP_ROOT --pivot=ROW_FIELD,COLUMN_FIELD [--metric=eval_top1]

A WORKDIR is a run's workdir (it holds config.json or TensorBoard event files) or a directory with
runs under it, e.g. the root of a sweep (launch/sweep.py); each run is named after its workdir's
basename, or its path under the root. Writes and prints:
  DIR/report.png   train loss, learning rate and every eval metric against steps, one line per run;
  DIR/report.html  the picture and a table: each run's config fields that differ between the runs
                   shown, its last step, and each eval metric's final and best value.
It reads the event files as they are, so it reports on runs that are still training. --pivot prints
a sweep as the paper's tables are laid out: a row per value of one config field, a column per value
of another, each cell the last logged `--metric` of the run with that pair (e.g. Table 8:
--pivot=model.posemb,model.posemb_where).
"""

if __name__ == '__main__':  # Before anything loads TensorFlow (epath does, for a gs:// path).
  from vit_jax.runtime import quiet  # pylint: disable=g-import-not-at-top

  quiet.quiet_tensorflow()

import base64
import html
import json
import math
from typing import Any, Sequence

import matplotlib
from absl import flags
from etils import epath

matplotlib.use('Agg')  # Files only: no display needed.
from matplotlib import pyplot as plt, ticker  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.runtime import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools import figures  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools.runs import Run, eval_metrics, find_runs, load_run  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.train import events  # pylint: disable=g-import-not-at-top,wrong-import-position

_USAGE = 'WORKDIR [WORKDIR ...] --out=DIR | --pivot=ROW_FIELD,COLUMN_FIELD [--metric=M]'

PANEL_INCHES, LEGEND_ROW_INCHES, DPI, MAX_COLUMNS = (5.0, 3.5), 0.25, 100, 3


def differing_fields(runs: Sequence[Run]) -> list[dict[str, Any]]:
  """Each run's config fields whose values are not the same in all the runs shown (that have a config).

  config.json holds the whole config, not which fields the command line or the sweep overrode, so this
  is what tells the runs apart: a sweep's overrides, and anything else that differs.
  """
  configs = [run.config for run in runs if run.config]
  keys = sorted({key for config in configs for key in config})
  differ = [
      key for key in keys if any(config.get(key) != configs[0].get(key) for config in configs)
  ]
  return [{key: run.config.get(key) for key in differ} if run.config else {} for run in runs]


def best(metric: str, values: Sequence[float]) -> float:
  """The best of a metric's values (`events.lower_is_better`); non-finite values never count as best."""
  finite = [v for v in values if math.isfinite(v)]
  return (min(finite) if events.lower_is_better(metric) else max(finite)) if finite else math.nan


def table(runs: Sequence[Run]) -> list[dict[str, Any]]:
  """One row a run: name, differing config fields, last step, and '<metric> final' / '<metric> best'
  (None where the run has not logged the metric yet)."""
  rows = []
  for run, fields in zip(runs, differing_fields(runs)):
    row = {
        'run': run.name,
        'differing config': fields,
        'last step': max((s for v in run.scalars.values() for s in v), default=None),
    }
    for metric in eval_metrics(runs):
      steps = run.scalars.get(metric, {})
      row[f'{metric} final'] = steps[max(steps)] if steps else None
      row[f'{metric} best'] = best(metric, list(steps.values())) if steps else None
    rows.append(row)
  return rows


def figure_inches(num_panels: int, num_runs: int) -> tuple[float, float]:
  """The picture's size: panels in rows of MAX_COLUMNS, and the legend's rows under them."""
  columns = min(num_panels, MAX_COLUMNS)
  rows = math.ceil(num_panels / columns)
  return columns * PANEL_INCHES[0], rows * PANEL_INCHES[1] + LEGEND_ROW_INCHES * (
      math.ceil(num_runs / columns) + 1
  )


def panels(runs: Sequence[Run]) -> list[str]:
  """The tags to plot: train loss, learning rate and each eval metric, where some run has logged them."""
  return [
      tag for tag in ('train_loss', 'learning_rate') if any(tag in r.scalars for r in runs)
  ] + eval_metrics(runs)


def plot(runs: Sequence[Run], tags: Sequence[str]) -> bytes:
  """The PNG: a panel a tag, a line a run, the same colour for a run in every panel."""
  columns = min(len(tags), MAX_COLUMNS)
  fig = plt.figure(figsize=figure_inches(len(tags), len(runs)), dpi=DPI, layout='constrained')
  colors = plt.get_cmap('tab10' if len(runs) <= 10 else 'tab20').colors
  lines = {}
  for i, tag in enumerate(tags):
    ax = fig.add_subplot(math.ceil(len(tags) / columns), columns, i + 1)
    for j, run in enumerate(runs):
      steps = sorted(run.scalars.get(tag, {}))
      if steps:  # Few points (evaluations) need markers: one point is no line.
        (lines[run.name],) = ax.plot(
            steps,
            [run.scalars[tag][s] for s in steps],
            markersize=3,
            color=colors[j % len(colors)],
            marker='o' if len(steps) < 30 else None,
        )
    ax.set(title=tag, xlabel='step')
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
  fig.legend(
      list(lines.values()), list(lines), loc='outside lower center', ncol=columns, frameon=False
  )
  return figures.png(fig, DPI)


def _cell(value: Any) -> str:
  if value is None:
    return ''
  if isinstance(value, dict):
    return ', '.join(
        f'{k}={json.dumps(v) if not isinstance(v, str) else v}' for k, v in value.items()
    )
  return f'{value:.4g}' if isinstance(value, float) else str(value)


def to_html(png: bytes, rows: Sequence[dict[str, Any]]) -> str:
  """A page with the picture inlined (one file to mail or attach) and the table."""
  header = ''.join(f'<th>{html.escape(key)}</th>' for key in rows[0])
  body = ''.join(
      '<tr>' + ''.join(f'<td>{html.escape(_cell(v))}</td>' for v in row.values()) + '</tr>\n'
      for row in rows
  )
  return (
      '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>vit_jax report</title><style>'
      'table{border-collapse:collapse}th,td{border:1px solid #bbb;padding:2px 6px}</style></head>\n'
      f'<body>\n<img alt="curves" src="data:image/png;base64,{base64.b64encode(png).decode()}">\n'
      f'<table>\n<tr>{header}</tr>\n{body}</table>\n</body></html>\n'
  )


def report(workdirs: Sequence[str], out: str) -> list[str]:
  """Writes report.png and report.html about the runs of `workdirs` to `out`; returns their paths.
  Bad input is a one-line ValueError, raised before anything is written."""
  runs = [load_run(name, path) for name, path in find_runs(workdirs)]
  tags = panels(runs)
  if not tags:
    raise ValueError(
        f'no run in {" ".join(workdirs)} has logged its train loss or an eval metric yet '
        f'(its {events.EVENTS} files)'
    )
  png = plot(runs, tags)
  cli.make_out_dir(out)
  written = [epath.Path(out) / 'report.png', epath.Path(out) / 'report.html']
  written[0].write_bytes(png)
  written[1].write_text(to_html(png, table(runs)))
  return [str(path) for path in written]


def _value(config: dict[str, Any], field: str) -> str:
  return '(default)' if config.get(field) is None else str(config[field])


def pivot(runs: Sequence[Run], rows: str, columns: str, metric: str = 'eval_top1') -> str:
  """Markdown: a row per value of the config field `rows`, a column per value of `columns` (unset:
  '(default)'), each cell the last logged `metric` of the run with that pair ('-': no such run, or
  not logged yet); a one-line ValueError when two runs share a cell, a field is in no run's config,
  or no run has logged `metric`.
  """
  configs = [run.config for run in runs if run.config]
  for field in (rows, columns):
    # A misspelt field, or a group of fields (config.json's are flat: lr.base, not lr), would be
    # '(default)' in every run: two runs in one cell, or a table of one row, saying nothing of why.
    if configs and not any(field in config for config in configs):
      under = sorted(key for config in configs for key in config if key.startswith(f'{field}.'))
      hint = (
          f'the fields under it are {", ".join(dict.fromkeys(under))}'
          if under
          else "pass a dotted field name of the runs' config.json, e.g. lr.base"
      )
      raise ValueError(f"--pivot field {field!r} is in no run's config: {hint}")
  if not any(run.scalars.get(metric) for run in runs):  # A misspelt metric: a table of '-' only.
    raise ValueError(
        f'no run logged {metric!r}: use --metric= one of '
        f'{", ".join(eval_metrics(runs)) or "(none yet)"}'
    )
  cells: dict[tuple[str, str], str] = {}
  for run in runs:
    key = (_value(run.config, rows), _value(run.config, columns))
    if key in cells:
      raise ValueError(
          f'two runs have {rows}={key[0]}, {columns}={key[1]}: pass roots with one run ' 'per pair'
      )
    values = run.scalars.get(metric)
    cells[key] = f'{values[max(values)]:.4f}' if values else '-'
  row_values = list(dict.fromkeys(key[0] for key in cells))
  column_values = list(dict.fromkeys(key[1] for key in cells))
  lines = [
      f'| {metric}: {rows} (rows), {columns} (columns) | ' + ' | '.join(column_values) + ' |',
      '|---' * (len(column_values) + 1) + '|',
  ]
  lines += [
      f'| {row} | ' + ' | '.join(cells.get((row, column), '-') for column in column_values) + ' |'
      for row in row_values
  ]
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  out, fields = flags.FLAGS.out, flags.FLAGS.pivot
  if len(argv) < 2 or not (out or fields):
    cli.fail(f'no {"WORKDIR" if len(argv) < 2 else "--out or --pivot"} given: use {_USAGE}')
  if fields and len(fields) != 2:
    cli.fail(
        f'--pivot={",".join(fields)} names {len(fields)} fields: give a row and a column field, '
        'e.g. --pivot=model.posemb,model.posemb_where'
    )
  if flags.FLAGS['metric'].present and not fields:
    cli.fail(
        '--metric picks what a --pivot table shows, and none is asked for: add '
        '--pivot=ROW_FIELD,COLUMN_FIELD, or drop --metric (the report shows every eval metric)'
    )
  try:
    if fields:
      runs = [load_run(name, path) for name, path in find_runs(argv[1:])]
      print(pivot(runs, *fields, flags.FLAGS.metric))
    if out:
      print('\n'.join(report(argv[1:], out)))
  except ValueError as e:
    cli.fail(str(e))


if __name__ == '__main__':
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('out', None, 'Directory to write report.png and report.html.')
  flags.DEFINE_list('pivot', None, 'ROW_FIELD,COLUMN_FIELD: print the runs as a table of --metric.')
  flags.DEFINE_string('metric', 'eval_top1', 'The scalar a --pivot table shows (its last value).')
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
