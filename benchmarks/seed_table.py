"""folder_vs_timm.py's table: a row a run (test top-1, last train loss, wall s, train images/s), then
each side's mean and sample standard deviation over the seeds."""

import statistics

HEADER = (
    '| side | seed | test top-1 (%) | last train loss | wall s | train img/s |\n'
    '|---|---|---|---|---|---|'
)


def row(side: str, seed: str, top1: str, loss: str, wall: str, ips: str) -> str:
  return f'| {side} | {seed} | {top1} | {loss} | {wall} | {ips} |'


def run_row(side: str, seed: int, result: dict[str, float], images: int) -> str:
  return row(
      side,
      str(seed),
      f'{result["top1"]:.2f}',
      f'{result["train_loss"]:.4f}',
      f'{result["wall_s"]:.1f}',
      f'{images / result["train_s"]:.1f}',
  )


def spread(values: list[float], digits: int) -> str:
  """Mean ± sample standard deviation ('n/a' for one value)."""
  sd = f'{statistics.stdev(values):.{digits}f}' if len(values) > 1 else 'n/a'
  return f'{statistics.fmean(values):.{digits}f} ± {sd}'


def summaries(
    results: dict[str, list[dict[str, float]]], images: int
) -> dict[str, dict[str, float]]:
  """Per side: the lists of top1, train_loss, wall_s and ips over its seeds."""
  return {
      side: {
          'top1': [r['top1'] for r in runs],
          'train_loss': [r['train_loss'] for r in runs],
          'wall_s': [r['wall_s'] for r in runs],
          'ips': [images / r['train_s'] for r in runs],
      }
      for side, runs in results.items()
      if runs
  }
