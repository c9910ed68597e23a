"""How long a small run takes to start: the demo's command, 2 steps, as a user starts it.

  python benchmarks/startup.py [--runs=5] [--peer=PATH_TO_ANOTHER_CHECKOUT]

Runs `python -m vit_jax.main --config=configs/demo.py` for 2 steps (its evaluation and checkpoint
included) `--runs` times with a warm compilation cache (a first, unmeasured run fills a private one),
each in a fresh workdir. Per run: seconds from the command's start to the end of its first train step
(the log's 'Memory in use after step 1' line, written once that step's results are ready) and to
the command's exit. With --peer, the same command of another checkout (e.g. `git worktree add
/tmp/before <commit>`) runs alternately with this one, in this Python, and the last line gives the
ratios of the medians (this / peer).
"""

import argparse
import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FIRST_STEP = re.compile(r'^I(\d{4}) (\d\d:\d\d:\d\d\.\d+) .*Memory in use after step 1 ', re.M)
_OVERRIDES = [
    '--config.total_steps=2',
    '--config.log_every_steps=1',
    '--config.eval_every_steps=2',
    '--config.checkpoint_every_steps=2',
]


def _log_time(month_day: str, clock: str) -> float:
  """An absl log line's local time (it has no year) as a Unix time."""
  now = datetime.datetime.now()
  stamp = datetime.datetime.strptime(f'{now.year}{month_day} {clock}', '%Y%m%d %H:%M:%S.%f')
  return stamp.timestamp()


def time_run(checkout: str, cache_home: str) -> tuple[float, float]:
  """(seconds to the first train step's end, seconds to the command's exit) of one 2-step demo."""
  with tempfile.TemporaryDirectory() as workdir:
    env = dict(os.environ, XDG_CACHE_HOME=cache_home)
    start = time.time()
    run = subprocess.run(
        [
            sys.executable,
            '-m',
            'vit_jax.main',
            '--config=configs/demo.py',
            f'--workdir={workdir}',
            *_OVERRIDES,
        ],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    end = time.time()
  if run.returncode:
    raise SystemExit(f'{checkout}: the demo failed:\n{run.stderr[-3000:]}')
  first_step = _FIRST_STEP.search(run.stderr)
  if not first_step:
    raise SystemExit(f"{checkout}: no 'Memory in use after step 1' line in the log")
  return _log_time(*first_step.groups()) - start, end - start


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', type=int, default=5)
  parser.add_argument('--peer', help='another checkout whose same command runs alternately')
  args = parser.parse_args()
  checkouts = {'this': _HERE, **({'peer': os.path.abspath(args.peer)} if args.peer else {})}
  times = {name: [] for name in checkouts}
  with tempfile.TemporaryDirectory() as cache_home:
    for name, checkout in checkouts.items():
      time_run(checkout, os.path.join(cache_home, name))  # Fills its compilation cache.
    for _ in range(args.runs):
      for name, checkout in checkouts.items():
        times[name].append(time_run(checkout, os.path.join(cache_home, name)))
  print('| checkout | first step s (median, all) | whole run s (median, all) |')
  print('|---|---|---|')
  medians = {}
  for name, runs in times.items():
    first, whole = zip(*runs)
    medians[name] = statistics.median(first), statistics.median(whole)
    print(
        f'| {name} ({checkouts[name]}) | {medians[name][0]:.2f} ({", ".join(f"{t:.2f}" for t in first)}) '
        f'| {medians[name][1]:.2f} ({", ".join(f"{t:.2f}" for t in whole)}) |'
    )
  if 'peer' in medians:
    print(
        f'this / peer: first step {medians["this"][0] / medians["peer"][0]:.2f}x, '
        f'whole run {medians["this"][1] / medians["peer"][1]:.2f}x'
    )


if __name__ == '__main__':
  main()
