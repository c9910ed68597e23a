"""What the training-recipe knobs do where data is scarce: the demo ViT on a slice of the digits.

  python benchmarks/recipes.py --train_split='train[:25%]' --steps=1500 --header

Trains the demo model (configs/demo.py) once per recipe on the same slice of the bundled digits (a
quarter of train is ~36 images per class) and evaluates on the whole test split. Recipes: the demo's
own (inception crop, label smoothing, dropout), then with RandAugment, with Mixup + CutMix, with
stochastic depth, with random erasing, and with all of them. Prints a markdown row per recipe: the test
top-1 of the last step, its train loss and the seconds the run took. One seed per recipe: differences
under ~1% are noise (rerun with --seed to see the spread).
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates: the train step's memory stays mapped on CPU.

import argparse
import tempfile
import time

from configs import demo  # pylint: disable=wrong-import-position
from vit_jax.train import loop  # pylint: disable=wrong-import-position
from vit_jax.train import setup as train_setup  # pylint: disable=wrong-import-position

_RANDAUG = {'pp.randaug_layers': 2, 'pp.randaug_magnitude': 10}
_MIX = {'mix.mixup_alpha': 0.8, 'mix.cutmix_alpha': 1.0}
_DROP_PATH = {'model.drop_path_rate': 0.1}
_ERASE = {'pp.erase_prob': 0.25}
# name -> config overrides on top of the demo.
RECIPES = {
    'demo (inception crop, smoothing 0.1, head dropout 0.1)': {},
    '+ RandAugment(2, 10)': _RANDAUG,
    '+ Mixup 0.8 / CutMix 1.0': _MIX,
    '+ stochastic depth 0.1': _DROP_PATH,
    '+ random erasing 0.25': _ERASE,
    '+ all four': {**_RANDAUG, **_MIX, **_DROP_PATH, **_ERASE},
}


def set_fields(config, overrides: dict) -> None:
  for key, value in overrides.items():
    *parents, field = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[field] = value


def train(overrides: dict, args: argparse.Namespace, workdir: str) -> tuple[dict, float]:
  config = demo.get_config()
  set_fields(
      config,
      {
          'train_split': args.train_split,
          'total_steps': args.steps,
          'seed': args.seed,
          'eval_every_steps': args.steps,
          'checkpoint_every_steps': args.steps,
          'log_every_steps': max(args.steps // 10, 1),
          'data_dir': args.data_dir,
          **overrides,
      },
  )
  start = time.perf_counter()
  metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  return metrics, time.perf_counter() - start


def last_train_loss(workdir: str) -> float:
  """The train loss of the last logged step, from the run's TensorBoard events."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top

  events = event_accumulator.EventAccumulator(workdir, size_guidance={'tensors': 0})
  events.Reload()
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top

  return float(tensor_util.make_ndarray(events.Tensors('train_loss')[-1].tensor_proto))


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--train_split', default='train[:25%]')
  parser.add_argument('--steps', type=int, default=1500)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--only', default=None, help='run the recipes whose name contains this')
  parser.add_argument(
      '--data_dir', default=None, help='tfds data_dir of the digits (default: tfds)'
  )
  parser.add_argument('--header', action='store_true', help='print the table header first')
  args = parser.parse_args()
  if args.header:
    print(
        f'| recipe ({args.train_split} of the digits, {args.steps} steps, seed {args.seed}) '
        '| test top-1 | last train loss | seconds |'
    )
    print('|---|---|---|---|')
  for name, overrides in RECIPES.items():
    if args.only and args.only not in name:
      continue
    with tempfile.TemporaryDirectory() as workdir:
      metrics, seconds = train(overrides, args, workdir)
      loss = last_train_loss(workdir)
    print(
        f'| {name} | {100 * metrics["eval_top1"]:.1f}% | {loss:.3f} | {seconds:.0f} |', flush=True
    )


if __name__ == '__main__':
  main()
