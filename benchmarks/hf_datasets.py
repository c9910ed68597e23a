"""A Hugging Face dataset on disk (`dataset='huggingface'`) against its peers, on the same JPEGs.

  python benchmarks/hf_datasets.py --num_images=2048 --image_size=224 --batch=32

Writes `--num_images` generated 500x375 JPEGs (input_pipeline.py's) as an image folder, through
the `datasets` library as the hub's Parquet layout (data/train-0000i-of-0000N.parquet), and as
WebDataset tar shards in timm's names (imagenet-train-000i.tar: jpg, cls, json a sample), and as
an image folder zipped (train.zip, test.zip: the JPEGs deflated and a metadata.csv), then:
- the first read of each split (Parquet: its copy into the Arrow cache; tar shards: their index)
  and a later one; for the shards, against `datasets.load_dataset`'s first read of them (its copy of
  every sample into its Arrow cache), as a ratio;
- the copy one host of `--hosts` makes of its data shard (strided rows) of the Parquet split, against
  the whole split's copy one host makes, in seconds and bytes, as ratios; and the copy one host of
  `--hosts` makes of its two data shards (`data_shards` twice the hosts) together, against a copy a
  shard;
- records read and decoded in a random order, one process: ours (`HuggingFaceSource.load`, from
  Parquet, the shards and the zips) against `datasets`' own random access (`ds[i]['image']`
  decoded to RGB, what timm's Hugging Face reader does; of the Parquet files and of the zips), and
  against the image folder's files, as ratios;
- train images/s through `data.train_iterator` (inception crop, flip, the default workers), the
  Parquet dataset, the shards and the zips against the same images as a folder, as ratios: the
  best of `--rounds` interleaved timings of each (a process's first runs up to a third slower).
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()

import argparse
import glob
import tempfile
import time

import numpy as np

import input_pipeline  # pylint: disable=wrong-import-position
from vit_jax import defaults  # pylint: disable=wrong-import-position
from vit_jax.data import dataset_cache  # pylint: disable=wrong-import-position
from vit_jax.data import folder  # pylint: disable=wrong-import-position
from vit_jax.data import hf_source  # pylint: disable=wrong-import-position
from vit_jax.data import images  # pylint: disable=wrong-import-position


def write_parquet(folder_root: str, out: str, shards: int) -> None:
  """The folder's train and test JPEGs (their bytes, in the folder's order) as Parquet files that
  `datasets` writes, in the hub's names."""
  import datasets  # pylint: disable=g-import-not-at-top

  listed = folder.FolderSource(folder_root, 'train')
  features = datasets.Features(
      {'image': datasets.Image(), 'label': datasets.ClassLabel(names=list(listed.class_names))}
  )
  for split in ('train', 'test'):
    paths, labels = listed.split_files(split)
    count = shards if split == 'train' else 1
    for i in range(count):
      rows = range(i, len(paths), count)
      table = {
          'image': [{'bytes': folder.read_file(paths[k]), 'path': None} for k in rows],
          'label': [int(labels[k]) for k in rows],
      }
      datasets.Dataset.from_dict(table, features=features).to_parquet(
          os.path.join(out, 'data', f'{split}-{i:05d}-of-{count:05d}.parquet')
      )


def write_shards(folder_root: str, out: str, shards: int) -> None:
  """The folder's train and test JPEGs (their bytes, in write_parquet's order) as WebDataset tar
  shards: a sample's jpg, cls (its class number) and json, as timm's imagenet-1k-wds has them."""
  import io  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  import tarfile  # pylint: disable=g-import-not-at-top

  listed = folder.FolderSource(folder_root, 'train')
  os.makedirs(out)
  for split in ('train', 'test'):
    paths, labels = listed.split_files(split)
    count = shards if split == 'train' else 1
    for i in range(count):
      with tarfile.open(os.path.join(out, f'imagenet-{split}-{i:04d}.tar'), 'w') as tar:
        for k in range(i, len(paths), count):
          label = int(labels[k])
          files = {
              'jpg': folder.read_file(paths[k]),
              'cls': str(label).encode(),
              'json': json.dumps({'label': label, 'filename': os.path.basename(paths[k])}).encode(),
          }
          for column, content in files.items():
            info = tarfile.TarInfo(f'{split}_{k:08d}.{column}')
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))


def write_zips(folder_root: str, out: str) -> None:
  """The folder's train and test JPEGs as a zip archive a split (deflated, as `zip` writes them),
  each listed with its label in the split's metadata.csv, in the folder's order."""
  import zipfile  # pylint: disable=g-import-not-at-top

  listed = folder.FolderSource(folder_root, 'train')
  os.makedirs(out)
  for split in ('train', 'test'):
    paths, labels = listed.split_files(split)
    with zipfile.ZipFile(os.path.join(out, f'{split}.zip'), 'w', zipfile.ZIP_DEFLATED) as archive:
      rows = ['file_name,label']
      for path, label in zip(paths, labels):
        name = os.path.relpath(path, os.path.join(folder_root, split))
        archive.write(path, f'{split}/{name}')
        rows.append(f'{name},{int(label)}')
      archive.writestr(f'{split}/metadata.csv', '\n'.join(rows) + '\n')


def first_and_later(root: str, label: str) -> tuple[hf_source.HuggingFaceSource, float, float]:
  """The dataset's source, and the seconds its train split's first and a later read take."""

  def read() -> hf_source.HuggingFaceSource:
    source = hf_source.HuggingFaceSource(root, 'train', label)
    records = source.examples('train')
    if records.prepare:  # A pipeline's set-up: a Parquet split's copy.
      records.prepare()
    return source

  start = time.perf_counter()
  source = read()
  first = time.perf_counter() - start
  start = time.perf_counter()
  read()
  return source, first, time.perf_counter() - start


def shard_copy(
    root: str, cache: str, shards: range, num_shards: int, together: bool = True
) -> tuple[float, int, int]:
  """Seconds and bytes of the Parquet copies that a process of data `shards` of `num_shards` makes
  in `cache`: of them `together` (what a run does), or a copy a shard; and the rows they read from
  the Parquet files (what cloud storage sends)."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  os.environ[dataset_cache.CACHE_VARIABLE] = cache
  source = hf_source.HuggingFaceSource(root, 'train', 'label')
  rows_read = []
  iter_batches = pq.ParquetFile.iter_batches

  def counted(self, *args, **kwargs):
    for batch in iter_batches(self, *args, **kwargs):
      rows_read.append(batch.num_rows)
      yield batch

  pq.ParquetFile.iter_batches = counted
  try:
    start = time.perf_counter()
    for shard in shards:
      source.examples('train', shard, num_shards, shards if together else ()).prepare()
    seconds = time.perf_counter() - start
  finally:
    pq.ParquetFile.iter_batches = iter_batches
  copied = sum(os.path.getsize(f) for f in glob.glob(os.path.join(cache, '*.arrow')))
  return seconds, copied, sum(rows_read)


def seconds_per_record(read, order: np.ndarray) -> float:
  start = time.perf_counter()
  for k in order:
    read(int(k))
  return (time.perf_counter() - start) / len(order)


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--num_images', type=int, default=2048)
  parser.add_argument('--shards', type=int, default=4, help='train Parquet files, and tar files')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=32)
  parser.add_argument('--reads', type=int, default=1000, help='records read in the random order')
  parser.add_argument('--warmup', type=int, default=3, help='batches before timing')
  parser.add_argument('--batches', type=int, default=20, help='batches timed')
  parser.add_argument('--rounds', type=int, default=2, help='train timings of each, the best kept')
  parser.add_argument('--hosts', type=int, default=4, help='hosts that share the Parquet split')
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    os.environ[dataset_cache.CACHE_VARIABLE] = os.path.join(tmp, 'cache')
    os.environ['HF_DATASETS_CACHE'] = os.path.join(tmp, 'hf_cache')
    import datasets  # pylint: disable=g-import-not-at-top  # It reads HF_DATASETS_CACHE here.

    jpegs, parquet = os.path.join(tmp, 'jpegs'), os.path.join(tmp, 'parquet')
    shards, zips = os.path.join(tmp, 'shards'), os.path.join(tmp, 'zips')
    input_pipeline.write_jpegs(jpegs, args.num_images)
    write_parquet(jpegs, parquet, args.shards)
    write_shards(jpegs, shards, args.shards)
    write_zips(jpegs, zips)
    megabytes = sum(os.path.getsize(f) for f in glob.glob(f'{parquet}/data/*')) / 1e6
    print(
        f'# {args.num_images} JPEGs of 500x375, {megabytes:.0f} MB of Parquet; '
        f'{os.cpu_count()} cores'
    )

    ours, first, again = first_and_later(parquet, 'label')
    print(
        f'| Parquet split read: first (copied into the cache) | {first:.2f} s | later | {again:.2f} s |'
    )
    cache = os.environ[dataset_cache.CACHE_VARIABLE]
    host, whole = (
        shard_copy(parquet, os.path.join(tmp, name), range(1), hosts)
        for name, hosts in (('host_cache', args.hosts), ('whole_cache', 1))
    )
    # The best of three interleaved timings each, in fresh caches.
    timings = {True: [], False: []}
    for attempt in range(3):
      for together in (attempt % 2 == 0, attempt % 2 != 0):
        cache_dir = os.path.join(tmp, f'shards_{together}_{attempt}')
        timings[together].append(shard_copy(parquet, cache_dir, range(2), 2 * args.hosts, together))
    together, apart = (min(timings[k]) for k in (True, False))
    os.environ[dataset_cache.CACHE_VARIABLE] = cache
    print(
        f'| Parquet copy: one host of {args.hosts} (its data shard) | {host[0]:.2f} s | '
        f'{host[1] / 1e6:.1f} MB | one host, the whole split | {whole[0]:.2f} s | '
        f'{whole[1] / 1e6:.1f} MB | as fast x | {whole[0] / host[0]:.2f} | bytes x | '
        f'{host[1] / whole[1]:.3f} |'
    )
    print(
        f'| Parquet copy: one host of {args.hosts}, its 2 data shards together | {together[0]:.2f} s '
        f'| {together[1] / 1e6:.1f} MB | {together[2]} rows read | a copy a shard | '
        f'{apart[0]:.2f} s | {apart[1] / 1e6:.1f} MB | {apart[2]} rows read | as fast x | '
        f'{apart[0] / together[0]:.2f} | rows read x | {together[2] / apart[2]:.2f} |'
    )
    tars, first, again = first_and_later(shards, 'cls')
    start = time.perf_counter()
    datasets.load_dataset(shards, split='train')
    peer = time.perf_counter() - start
    print(
        f'| tar split read: first (indexed) | {first:.2f} s | later | {again:.2f} s | '
        f"datasets' first read | {peer:.2f} s | ours as fast x | {peer / first:.1f} |"
    )

    zipped = hf_source.HuggingFaceSource(zips, 'train', 'label')
    records, tar_records = ours.examples('train'), tars.examples('train')
    zip_records = zipped.examples('train')
    theirs = datasets.load_dataset(parquet, split='train')
    theirs_zipped = datasets.load_dataset(zips, split='train')
    files = folder.FolderSource(jpegs, 'train')
    file_records = files.examples('train')
    order = np.random.default_rng(0).permutation(records.num_records)[: args.reads]
    # Every order is the folder's: write_parquet and write_shards keep it, shard by shard.
    rows = np.concatenate(
        [np.arange(i, records.num_records, args.shards) for i in range(args.shards)]
    )
    # A record read and decoded: sources hand the crop the image's file, which it decodes.
    decoded = lambda example: images.pixels(example['image'])
    timed = {
        'ours': lambda k: decoded(ours.load(records.read(k))),
        'ours, tar shards': lambda k: decoded(tars.load(tar_records.read(k))),
        'datasets': lambda k: np.asarray(theirs[k]['image'].convert('RGB')),
        'folder': lambda k: decoded(files.load(file_records.read(int(rows[k])))),
        'ours, zip archive': lambda k: decoded(zipped.load(zip_records.read(int(rows[k])))),
        'datasets, zip archive': lambda k: np.asarray(
            theirs_zipped[int(rows[k])]['image'].convert('RGB')
        ),
    }
    os.sync()  # The files just written go to the disk now, not while a timing runs.
    for read in timed.values():  # Warm: page cache, lazy opens.
      seconds_per_record(read, order[:50])
    expected = timed['datasets'](int(order[0]))
    for name in ('ours', 'ours, tar shards', 'ours, zip archive'):
      np.testing.assert_array_equal(images.rgb(timed[name](int(order[0]))), expected)
    np.testing.assert_array_equal(timed['datasets, zip archive'](int(order[0])), expected)
    per = {name: seconds_per_record(read, order) for name, read in timed.items()}
    print('| read + decode, random order, 1 process | ms a record | ours, as fast as it x |')
    print('|---|---|---|')
    for name, seconds in per.items():
      print(f'| {name} | {seconds * 1e3:.2f} | {seconds / per["ours"]:.2f} |')

    config = defaults.get_config()
    config.image_size, config.pp.crop, config.pp.flip = args.image_size, 'inception', True
    print('| train_iterator, inception + flip | images/s | as fast as the folder x |')
    print('|---|---|---|')
    rates = {}
    for _ in range(args.rounds):  # The first measurement in a process runs slow: the best round.
      for name, dataset, root, label in (
          ('huggingface', 'huggingface', parquet, 'label'),
          ('huggingface, tar shards', 'huggingface', shards, 'cls'),
          ('huggingface, zip archive', 'huggingface', zips, 'label'),
          ('folder', 'folder', jpegs, 'label'),
      ):
        config.dataset, config.data_dir, config.label_feature = dataset, root, label
        rate, _ = input_pipeline.images_per_second(config, args.batch, args.warmup, args.batches)
        rates[name] = max(rate, rates.get(name, 0))
    for name, rate in rates.items():
      print(f'| {name} | {rate:.0f} | {rate / rates["folder"]:.2f} |')


if __name__ == '__main__':
  main()
