"""Our JPEG-folder pipeline against tf.data doing the same work, and tf.data's own shortcut, in one run.

  python benchmarks/tfdata_peer.py [--image_size=224] [--batch=32] [--rounds=2]   # needs tensorflow

Issue 38 compared the grain pipeline with the tf.data one it replaced (7154924), which decoded only
the crop's part of each JPEG (`decode_and_crop_jpeg`) and resized it with 2x2 bilinear taps. Ours
decodes the whole JPEG with PIL and shrinks with PIL's antialiased filter (timm's pixels). Here, on the
same generated 500x375 JPEGs (input_pipeline.write_jpegs), rounds alternate between:
  ours                  vit_jax.data.train_iterator (inception crop + flip, uint8 batches)
  tf.data, same work    read, whole decode, inception crop, antialiased bilinear resize, flip, uint8
  tf.data, shortcut     read, decode_and_crop_jpeg, bilinear resize without antialiasing, flip, uint8
tf.data runs its map with AUTOTUNE parallelism and prefetches, as the replaced pipeline did. Prints a
markdown row per pipeline and round.
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # pylint: disable=wrong-import-position
import glob  # pylint: disable=wrong-import-position
import tempfile  # pylint: disable=wrong-import-position
import time  # pylint: disable=wrong-import-position

import input_pipeline  # pylint: disable=wrong-import-position
from vit_jax import defaults  # pylint: disable=wrong-import-position


def tf_dataset(files: list[str], image_size: int, batch: int, same_work: bool):
  """tf.data's pipeline over `files`: endless, shuffled, mapped in parallel, batched, prefetched."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def load(path):
    encoded = tf.io.read_file(path)
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        shape,
        tf.zeros([0, 0, 4]),
        area_range=(0.08, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    if same_work:
      image = tf.image.decode_jpeg(encoded, channels=3)
      image = tf.slice(image, begin, size)
      image = tf.image.resize(image, (image_size, image_size), antialias=True)
    else:
      y, x, _ = tf.unstack(begin)
      h, w, _ = tf.unstack(size)
      image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
      image = tf.image.resize(image, (image_size, image_size))
    image = tf.image.random_flip_left_right(image)
    return tf.cast(tf.clip_by_value(tf.round(image), 0, 255), tf.uint8)

  dataset = tf.data.Dataset.from_tensor_slices(files).repeat().shuffle(len(files), seed=0)
  dataset = dataset.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return dataset.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def _rate(batches, batch: int, warmup: int, timed: int) -> float:
  for _ in range(warmup):
    next(batches)
  start = time.perf_counter()
  for _ in range(timed):
    next(batches)
  return batch * timed / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--num_images', type=int, default=512)
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--warmup', type=int, default=3)
  parser.add_argument('--batches', type=int, default=20)
  args = parser.parse_args()
  print('| pipeline | round | images/s | cores |')
  print('|---|---|---|---|')
  cores = len(os.sched_getaffinity(0))
  with tempfile.TemporaryDirectory() as tmp:
    input_pipeline.write_jpegs(tmp, args.num_images)
    files = sorted(glob.glob(os.path.join(tmp, 'train', '*', '*.jpg')))
    config = defaults.get_config()
    config.image_size, config.pp.crop, config.pp.flip = args.image_size, 'inception', True
    config.dataset, config.data_dir, config.data_workers = 'folder', tmp, 0
    for round_ in range(1, args.rounds + 1):
      iterator, _ = input_pipeline.first_batch(config, args.batch)
      try:
        rate = _rate(iterator, args.batch, args.warmup, args.batches)
      finally:
        iterator.close()
      print(f'| ours (grain, threads) | {round_} | {rate:.0f} | {cores} |', flush=True)
      for same_work, name in ((True, 'tf.data, same work'), (False, 'tf.data, shortcut')):
        dataset = tf_dataset(files, args.image_size, args.batch, same_work)
        rate = _rate(iter(dataset.as_numpy_iterator()), args.batch, args.warmup, args.batches)
        print(f'| {name} | {round_} | {rate:.0f} | {cores} |', flush=True)


if __name__ == '__main__':
  main()
