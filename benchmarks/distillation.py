"""Does distillation help a small ViT? DeiT's recipe in miniature, on the bundled digits, on CPU.

  python benchmarks/distillation.py [--teacher=workdirs/demo] [--seeds=0,1,2] [--steps=1500]
      [--student=S|XS] [--train_split=SPLIT] [--set=FIELD=VALUE,...] [--only=SIDE]

The teacher is the demo's ViT (configs/demo.py: 4 blocks of width 64), trained here for --teacher_steps
unless --teacher names a trained workdir (e.g. `make demo`'s). The student is a smaller ViT (`STUDENTS`:
S has 2 blocks of width 32, XS one of width 16) trained with the demo's recipe for --steps, alone and
distilled from the teacher in each of `SIDES`' ways (DeiT's hard and soft distillation, through a
distillation token with its own head or through the one head; alpha 0.5), for each seed, on the
images of --train_split (a part of the teacher's: distillation where labels are few). Prints a
markdown row a run (test top-1 of the last step, seconds) and each side's mean and sample standard
deviation over the seeds.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates: the train step's memory stays mapped on CPU.

import argparse  # pylint: disable=wrong-import-position
import ast  # pylint: disable=wrong-import-position
import tempfile  # pylint: disable=wrong-import-position
import time  # pylint: disable=wrong-import-position

import recipes  # pylint: disable=wrong-import-position
import seed_table  # pylint: disable=wrong-import-position
from configs import demo  # pylint: disable=wrong-import-position
from vit_jax.train import loop  # pylint: disable=wrong-import-position
from vit_jax.train import setup as train_setup  # pylint: disable=wrong-import-position

# --student: the student's model fields (the teacher's: 4 blocks of width 64, 4 heads, 128 MLP units).
STUDENTS = {
    'S': {  # Half the teacher's width and depth.
        'model.hidden_size': 32,
        'model.num_layers': 2,
        'model.num_heads': 2,
        'model.mlp_dim': 64,
    },
    'XS': {  # One block of width 16: a larger gap to the teacher.
        'model.hidden_size': 16,
        'model.num_layers': 1,
        'model.num_heads': 2,
        'model.mlp_dim': 32,
    },
}
# side -> config overrides of the student (the teacher's workdir is added where it distils).
SIDES = {
    'alone': {},
    'hard, distillation token': {'model.distilled': True, 'distill.kind': 'hard'},
    'hard, one head': {'distill.kind': 'hard'},
    'soft T=3 alpha 0.5, distillation token': {
        'model.distilled': True,
        'distill.kind': 'soft',
        'distill.temperature': 3.0,
    },
    'soft T=3 alpha 0.5, one head': {'distill.kind': 'soft', 'distill.temperature': 3.0},
    # Hinton et al.'s weighting: the teacher's soft targets carry most of the loss.
    'soft T=4 alpha 0.9, one head': {
        'distill.kind': 'soft',
        'distill.temperature': 4.0,
        'distill.alpha': 0.9,
    },
}


def train(
    overrides: dict, steps: int, seed: int, workdir: str, data_dir: str | None, split: str = 'train'
) -> dict:
  config = demo.get_config()
  recipes.set_fields(
      config,
      {
          'train_split': split,
          'total_steps': steps,
          'seed': seed,
          'eval_every_steps': steps,
          'checkpoint_every_steps': steps,
          'log_every_steps': max(steps // 10, 1),
          'data_dir': data_dir,
          **overrides,
      },
  )
  start = time.perf_counter()
  metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  return {'top1': 100 * metrics['eval_top1'], 'wall_s': time.perf_counter() - start}


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--teacher', default=None, help='a trained workdir (default: train one)')
  parser.add_argument('--teacher_steps', type=int, default=4000)  # The demo's.
  parser.add_argument('--steps', type=int, default=1500)
  parser.add_argument('--student', default='S', choices=sorted(STUDENTS))
  parser.add_argument(
      '--set',
      default='',
      metavar='FIELD=VALUE[,...]',
      help="config fields of every student run, e.g. 'pp.min_area=0.08' (stronger crops)",
  )
  parser.add_argument(
      '--train_split',
      default='train',
      help="the student's training images, e.g. 'train[:20%%]' (the teacher trains on 'train')",
  )
  parser.add_argument('--seeds', default='0,1,2')
  parser.add_argument('--data_dir', default=None, help='tfds data_dir (the digits need none)')
  parser.add_argument('--only', default=None, help="the sides whose name has this (and 'alone')")
  args = parser.parse_args()
  seeds = [int(s) for s in args.seeds.split(',')]
  fields = {
      name: ast.literal_eval(value)
      for name, value in (item.split('=', 1) for item in args.set.split(',') if item)
  }
  with tempfile.TemporaryDirectory() as root:
    teacher = args.teacher
    if teacher is None:
      teacher = os.path.join(root, 'teacher')
      result = train({}, args.teacher_steps, 0, teacher, args.data_dir)
      print(
          f'teacher: the demo ViT, {args.teacher_steps} steps, seed 0: '
          f'{result["top1"]:.2f}% test top-1 ({result["wall_s"]:.0f} s)',
          flush=True,
      )
    print(
        f'\n| student {args.student} ({args.steps} steps on {args.train_split}'
        f'{", " + args.set if args.set else ""}) | seed | test top-1 (%) | seconds |'
    )
    print('|---|---|---|---|')
    sides = {
        side: overrides
        for side, overrides in SIDES.items()
        if not args.only or args.only in side or side == 'alone'
    }
    tops = {side: [] for side in sides}
    for seed in seeds:
      for side, overrides in sides.items():
        extra = {'distill.teacher': teacher} if 'distill.kind' in overrides else {}
        workdir = os.path.join(root, f'{seed}-{list(sides).index(side)}')
        result = train(
            {**STUDENTS[args.student], **fields, **overrides, **extra},
            args.steps,
            seed,
            workdir,
            args.data_dir,
            args.train_split,
        )
        tops[side].append(result['top1'])
        print(f'| {side} | {seed} | {result["top1"]:.2f} | {result["wall_s"]:.0f} |', flush=True)
    for side, values in tops.items():
      print(f'| {side} | mean ± sd | {seed_table.spread(values, 2)} | |')


if __name__ == '__main__':
  main()
