"""Seconds an evaluation pass over an image folder takes, its worker processes kept between passes
(`data.eval_passes`, what the evaluators use) against a new iterator and new workers every pass
(`data.eval_iterator` each time, the evaluators before).

  python benchmarks/eval_passes.py --num_images=256 --workers=2 --header
  python benchmarks/eval_passes.py --num_images=1536 --workers=2

Writes `--num_images` random JPEGs of about ImageNet's size (500x375) and reads them as a split with
the eval preprocessing (resize, central crop, 224 px), `--passes` times each way, alternating rounds.
The first pass of the kept workers starts them; the others do not. A pass here is what a run pays at
each evaluation, beside the model's own time.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # pylint: disable=wrong-import-position
import statistics  # pylint: disable=wrong-import-position
import tempfile  # pylint: disable=wrong-import-position
import time  # pylint: disable=wrong-import-position

import input_pipeline  # pylint: disable=wrong-import-position
from vit_jax import data  # pylint: disable=wrong-import-position
from vit_jax import defaults  # pylint: disable=wrong-import-position


def _timed(batches) -> float:
  start = time.perf_counter()
  for _ in batches:
    pass
  return time.perf_counter() - start


def fresh_passes(config, batch: int, passes: int) -> list[float]:
  """Seconds of each pass, each from a new iterator (its workers started and ended with it)."""
  seconds = []
  for _ in range(passes):
    start = time.perf_counter()
    batches = data.eval_iterator(config, 'train', local_batch_size=batch)
    _timed(batches)
    batches.close()
    seconds.append(time.perf_counter() - start)
  return seconds


def kept_passes(config, batch: int, passes: int) -> list[float]:
  """Seconds of each pass of one `eval_passes` (its workers started at the first)."""
  kept = data.eval_passes(config, 'train', local_batch_size=batch)
  try:
    return [_timed(kept()) for _ in range(passes)]
  finally:
    kept.close()


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--num_images', type=int, default=256, help='JPEGs in the split')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=64)
  parser.add_argument('--workers', type=int, default=2, help='config.data_workers')
  parser.add_argument('--passes', type=int, default=4, help='passes timed each way a round')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--header', action='store_true', help='print the table header first')
  args = parser.parse_args()

  config = defaults.get_config()
  config.image_size, config.data_workers = args.image_size, args.workers
  if args.header:
    print(
        '| images | px | batch | workers | round | new workers a pass: s a pass | kept: first '
        'pass s | kept: later passes s | later passes, kept / new | cores |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|')
  with tempfile.TemporaryDirectory() as root:
    input_pipeline.write_jpegs(root, args.num_images)
    config.dataset, config.data_dir = 'folder', root
    for round_index in range(args.rounds):
      fresh = statistics.median(fresh_passes(config, args.batch, args.passes))
      first, *later = kept_passes(config, args.batch, args.passes)
      kept = statistics.median(later)
      print(
          f'| {args.num_images} | {args.image_size} | {args.batch} | {args.workers} | '
          f'{round_index + 1} | {fresh:.2f} | {first:.2f} | {kept:.2f} | {kept / fresh:.2f} | '
          f'{len(os.sched_getaffinity(0))} |',
          flush=True,
      )


if __name__ == '__main__':
  main()
