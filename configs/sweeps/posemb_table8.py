"""The paper's position-embedding ablation (Appendix D.4, Table 8) on the demo: rows none / 1-D / 2-D /
relative position embeddings x columns input / every layer / shared every layer (none and relative
only at the input: Table 8's N/A cells).

  python launch/sweep.py --sweep=configs/sweeps/posemb_table8.py --workdir=workdirs/posemb_table8
  python -m configs.sweeps.posemb_table8 workdirs/posemb_table8   # prints the table (final eval_top1)
"""
import sys

CONFIG = 'configs/demo.py'
ROWS = {'none': 'No Pos. Emb.', 'learn': '1-D Pos. Emb.', 'learn2d': '2-D Pos. Emb.',
        'relative': 'Rel. Pos. Emb.'}
COLUMNS = {'input': 'Default/Stem', 'every_layer': 'Every Layer', 'shared_every_layer': 'Every Layer-Shared'}


def get_sweep():
  return [{'model.posemb': ['none', 'relative']},
          {'model.posemb': ['learn', 'learn2d'], 'model.posemb_where': list(COLUMNS)}]


def table(root: str, metric: str = 'eval_top1') -> str:
  """Table 8 in markdown: each run's last `metric` under `root`, by its model.posemb and posemb_where
  (unset: the defaults, learn and input); '-' for a run not there or not evaluated yet."""
  from vit_jax import report  # pylint: disable=g-import-not-at-top
  cells = {}
  for name, path in report.find_runs([root]):
    run = report.load_run(name, path)
    kind = run.config.get('model.posemb') or 'learn'
    where = run.config.get('model.posemb_where') or 'input'
    values = run.scalars.get(metric)
    cells[kind, where] = f'{values[max(values)]:.4f}' if values else '-'
  applicable = {(kind, where) for sweep in get_sweep() for kind in sweep['model.posemb']
                for where in sweep.get('model.posemb_where', ['input'])}
  lines = [f'| {metric} | ' + ' | '.join(COLUMNS.values()) + ' |', '|---' * (len(COLUMNS) + 1) + '|']
  for kind, label in ROWS.items():
    lines.append(f'| {label} | ' + ' | '.join(
        cells.get((kind, where), '-') if (kind, where) in applicable else 'N/A' for where in COLUMNS)
                 + ' |')
  return '\n'.join(lines)


if __name__ == '__main__':
  if len(sys.argv) != 2:
    sys.exit('usage: python -m configs.sweeps.posemb_table8 SWEEP_ROOT')
  print(table(sys.argv[1]))
