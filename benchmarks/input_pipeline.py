"""Images/s of the training input pipeline on one host: read, decode, crop, flip, normalise, batch.

  python benchmarks/input_pipeline.py --source=digits --image_size=224 --batch=32
  python benchmarks/input_pipeline.py --source=folder --image_size=224 --batch=32   # generated JPEGs
  python benchmarks/input_pipeline.py --source=folder --image_size=224 --batch=32 --workers=1,2,4
  python benchmarks/input_pipeline.py --source=folder --image_size=224 --batch=32 --randaug=2,10
  python benchmarks/input_pipeline.py --source=folder --jpeg_size=4032x3024 --reducing_gap=0,2,3

Runs `vit_jax.data.train_iterator` exactly as training does (seeded permutation, inception crop, flip,
uint8 batches) and prints a markdown table row per worker count (`config.data_workers`; default: the
pipeline's own choice). The digits are served from memory. `--source=folder` first writes
`--num_images` random JPEGs of about ImageNet's size (500x375; `--jpeg_size`, e.g. a phone's
12-megapixel 4032x3024) into a temporary `train/<class>/` tree, so reading and decoding are measured
too; `--reducing_gap` lists config.pp.reducing_gap values to measure (0: every JPEG decoded at its
full size, timm's pixels; the row's peer). "resumed first batch s" is the time to the first batch
of a run resumed at `--resume_step`: it must not grow with the step (the order is skipped
arithmetically). Compare the images/s with benchmarks/train_step.py's at the same image size and
batch: the input pipeline must outrun the train step or the step waits for data.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates: the train step's memory stays mapped on CPU.

import argparse
import tempfile
import time

import numpy as np
from PIL import Image

from vit_jax import data  # pylint: disable=wrong-import-position
from vit_jax import defaults  # pylint: disable=wrong-import-position
from vit_jax.data import train_ops  # pylint: disable=wrong-import-position


def write_jpegs(
    root: str, num_images: int, num_classes: int = 10, size: tuple[int, int] = (500, 375)
):
  """`num_images` smooth random JPEGs (quality 90) in root/{train,test}/<class>/."""
  rng = np.random.default_rng(0)
  for split, count in (('train', num_images), ('test', num_classes)):
    for i in range(count):
      folder = os.path.join(root, split, f'class_{i % num_classes}')
      os.makedirs(folder, exist_ok=True)
      # Upsampled noise: compresses like a photograph more than white noise does.
      small = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
      image = Image.fromarray(small).resize(size, Image.BILINEAR)
      image.save(os.path.join(folder, f'{i:05d}.jpg'), quality=90)


def first_batch(config, batch: int, start_step: int = 0):
  """(the iterator, seconds to its first batch). The caller closes the iterator: its threads and
  workers read ahead until then."""
  start = time.perf_counter()
  iterator = data.train_iterator(config, local_batch_size=batch, start_step=start_step)
  next(iterator)
  return iterator, time.perf_counter() - start


def images_per_second(config, batch: int, warmup: int, batches: int) -> tuple[float, float]:
  """(images/s after warm-up, seconds to the first batch)."""
  iterator, first = first_batch(config, batch)
  try:
    for _ in range(warmup):
      next(iterator)
    start = time.perf_counter()
    for _ in range(batches):
      next(iterator)
    return batch * batches / (time.perf_counter() - start), first
  finally:
    iterator.close()


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--source', default='digits', choices=('digits', 'folder'))
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--crop', default='inception', choices=tuple(train_ops.CROPS))
  parser.add_argument(
      '--randaug',
      default=None,
      metavar='LAYERS,MAGNITUDE',
      help='RandAugment after the flip, e.g. 2,10 (default: off)',
  )
  parser.add_argument('--num_images', type=int, default=512, help='JPEGs to generate (folder)')
  parser.add_argument('--jpeg_size', default='500x375', metavar='WxH', help='of the JPEGs (folder)')
  parser.add_argument(
      '--reducing_gap',
      default='0',
      metavar='G[,G...]',
      help='config.pp.reducing_gap values to measure, e.g. 0,3 (0: full-size decoding)',
  )
  parser.add_argument('--warmup', type=int, default=3, help='batches before timing')
  parser.add_argument('--batches', type=int, default=20, help='batches timed')
  parser.add_argument(
      '--resume_step',
      type=int,
      default=1_000_000,
      help='step of the resumed run whose first batch is timed',
  )
  parser.add_argument(
      '--workers',
      default=None,
      metavar='N[,N...]',
      help='config.data_workers to measure, e.g. 0,1,2,4 (default: unset, automatic)',
  )
  parser.add_argument('--header', action='store_true', help='print the table header first')
  args = parser.parse_args()

  config = defaults.get_config()
  config.image_size, config.pp.crop, config.pp.flip = args.image_size, args.crop, True
  ops = f'{args.crop} + flip'
  if args.randaug:
    layers, magnitude = (int(x) for x in args.randaug.split(','))
    config.pp.randaug_layers, config.pp.randaug_magnitude = layers, magnitude
    ops += f' + RandAugment({layers}, {magnitude})'
  workers = [None] if args.workers is None else [int(w) for w in args.workers.split(',')]
  gaps = [float(g) for g in args.reducing_gap.split(',')]
  width, height = (int(n) for n in args.jpeg_size.split('x'))
  if args.header:
    print(
        '| source | px | batch | crop | reducing gap | workers | images/s | first batch s '
        '| resumed first batch s | cores |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|')
  source = {
      'digits': 'bundled digits (8x8, in memory)',
      'folder': f'{args.num_images} generated {width}x{height} JPEGs (image folder)',
  }[args.source]
  with tempfile.TemporaryDirectory() as tmp:
    if args.source == 'folder':
      write_jpegs(tmp, args.num_images, size=(width, height))
      config.dataset, config.data_dir = 'folder', tmp
    else:
      config.dataset = 'digits'
    for gap in gaps:
      config.pp.reducing_gap = gap
      for count in workers:
        config.data_workers = count
        rate, first = images_per_second(config, args.batch, args.warmup, args.batches)
        resumed_iterator, resumed = first_batch(config, args.batch, args.resume_step)
        resumed_iterator.close()
        print(
            f'| {source} | {args.image_size} | {args.batch} | {ops} | {gap:g} | '
            f'{"auto" if count is None else count} | {rate:.0f} | {first:.1f} | '
            f'{resumed:.1f} (step {args.resume_step}) | {len(os.sched_getaffinity(0))} |',
            flush=True,
        )


if __name__ == '__main__':
  main()
