"""The train order on awkward layouts: class folders of 1, 7 and 299 images, tfds ArrayRecord files,
Hugging Face Parquet files and WebDataset tar shards of 1, 7 and 299 records, all class-sorted; 307
examples (a prime), so no batch, shard or process count divides an epoch.

Every image carries its own id in pixel (0, 0), so a batch says exactly which examples it holds.
"""

import importlib.util
import io
import json
import os
import subprocess
import sys
import tarfile

from array_record.python import array_record_module
import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

import helpers
import tfds_fixtures
from helpers import as_uint8, take
from vit_jax import data
from vit_jax.data import order

CLASS_SIZES = (1, 7, 299)  # Train images of class 0, 1, 2, listed (and written) in class order.
NUM_TRAIN = sum(CLASS_SIZES)
TRAIN_LABELS = np.repeat(np.arange(3), CLASS_SIZES)  # The label of train example id i.
FEATURES = tfds.features.FeaturesDict(
    {
        'image': tfds.features.Image(shape=(8, 8, 3)),
        'label': tfds.features.ClassLabel(names=['c0', 'c1', 'c2']),
    }
)


# The layouts each test reads; `datasets` writes the Parquet one (make test's extra).
LAYOUTS = [
    'folder',
    'array_record',
    pytest.param(
        'huggingface',
        marks=pytest.mark.skipif(
            not importlib.util.find_spec('datasets'), reason='needs the datasets library'
        ),
    ),
    'webdataset',
]


def _image(uid: int, label: int) -> np.ndarray:
  """8x8 RGB: the example's id in pixel (0, 0), its class the bright channel elsewhere."""
  image = np.zeros((8, 8, 3), np.uint8)
  image[..., label] = 200
  image[0, 0, :2] = uid % 256, uid // 256
  return image


def ids(batch: dict[str, np.ndarray]) -> np.ndarray:
  pixels = as_uint8(batch['image'])[:, 0, 0].astype(int)
  return pixels[:, 0] + 256 * pixels[:, 1]


def _write_folder(root) -> str:
  """root/{train,test}/c<k>/NNNN.png; train ids 0..306 in class order, then 2 test images a class."""
  uid = 0
  for split in ('train', 'test'):
    for label, size in enumerate(CLASS_SIZES if split == 'train' else (2, 2, 2)):
      folder = root / split / f'c{label}'
      folder.mkdir(parents=True)
      for i in range(size):
        Image.fromarray(_image(uid, label)).save(folder / f'{i:04d}.png')
        uid += 1
  return str(root)


def _write_array_records(root, name: str) -> str:
  """A tfds dataset `name` in root as tfds writes one, unshuffled, as ArrayRecord: a train file of each
  class (1, 7 and 299 records; ids 0..306 in file order), and a test file of 3 records (ids
  307..309)."""
  path = root / name / '1.0.0'
  path.mkdir(parents=True)
  files = {'train': [[label] * size for label, size in enumerate(CLASS_SIZES)], 'test': [[0, 1, 2]]}
  uid, split_infos = 0, []
  for split, labels_of_files in files.items():
    for i, labels in enumerate(labels_of_files):
      filename = (
          f'{name}-{split}.array_record-{i:05d}-of-{len(labels_of_files):05d}'  # tfds' names.
      )
      writer = array_record_module.ArrayRecordWriter(str(path / filename), 'group_size:1')
      for label in labels:
        writer.write(
            FEATURES.serialize_example(
                {'image': tfds_fixtures.png(_image(uid, label)), 'label': label}
            )
        )
        uid += 1
      writer.close()
    split_infos.append(
        tfds.core.SplitInfo(
            name=split, shard_lengths=[len(labels) for labels in labels_of_files], num_bytes=0
        )
    )
  tfds.folder_dataset.write_metadata(
      data_dir=str(path),
      features=FEATURES,
      split_infos=split_infos,
      disable_shuffling=True,
      check_data=False,
  )
  return str(root)


def _write_parquet(root) -> str:
  """A Hugging Face dataset repository as the `datasets` library writes its files: a train Parquet
  file of each class (1, 7 and 299 rows; ids 0..306 in file order), and a test file of 3 rows (ids
  307..309), named as the hub names shards."""
  import datasets  # pylint: disable=g-import-not-at-top

  features = datasets.Features(
      {'image': datasets.Image(), 'label': datasets.ClassLabel(names=['c0', 'c1', 'c2'])}
  )
  files = {'train': [[label] * size for label, size in enumerate(CLASS_SIZES)], 'test': [[0, 1, 2]]}
  uid = 0
  for split, labels_of_files in files.items():
    for i, labels in enumerate(labels_of_files):
      pictures = [Image.fromarray(_image(uid + k, label)) for k, label in enumerate(labels)]
      uid += len(labels)
      datasets.Dataset.from_dict(
          {'image': pictures, 'label': labels}, features=features
      ).to_parquet(str(root / 'data' / f'{split}-{i:05d}-of-{len(labels_of_files):05d}.parquet'))
  return str(root)


def _write_shards(root) -> str:
  """WebDataset tar shards in timm's names: a train tar of each class (1, 7 and 299 samples of a png
  and a cls; ids 0..306 in file order), and a test tar of 3 (ids 307..309)."""
  files = {'train': [[label] * size for label, size in enumerate(CLASS_SIZES)], 'test': [[0, 1, 2]]}
  uid = 0
  for split, labels_of_files in files.items():
    for i, labels in enumerate(labels_of_files):
      with tarfile.open(root / f'uneven-{split}-{i:04d}.tar', 'w') as tar:
        for label in labels:
          for column, content in (
              ('png', tfds_fixtures.png(_image(uid, label))),
              ('cls', str(label).encode()),
          ):
            info = tarfile.TarInfo(f'{uid:06d}.{column}')
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
          uid += 1
  return str(root)


@pytest.fixture(scope='module')
def layouts(tmp_path_factory):
  """{layout: config overrides}."""
  folder = _write_folder(tmp_path_factory.mktemp('uneven_folder'))
  array_records = _write_array_records(tmp_path_factory.mktemp('uneven_tfds'), 'uneven_files')
  parquet = (
      _write_parquet(tmp_path_factory.mktemp('uneven_parquet'))
      if importlib.util.find_spec('datasets')
      else None
  )
  return {
      'folder': dict(dataset='folder', data_dir=folder),
      'array_record': dict(dataset='uneven_files', data_dir=array_records),
      'huggingface': dict(dataset='huggingface', data_dir=parquet),
      'webdataset': dict(
          dataset='huggingface',
          data_dir=_write_shards(tmp_path_factory.mktemp('uneven_shards')),
          label_feature='cls',
      ),
  }


def make_config(overrides: dict, **more):
  return helpers.data_config(**{**overrides, **more})


@pytest.mark.parametrize('layout', LAYOUTS)
def test_each_epoch_is_a_new_permutation_across_batch_edges(layouts, layout):
  """Batches of 50: epochs end inside batches 6, 12 and 18. Each epoch holds every id once with its
  label, in a new order; the 8 images of the small classes (first in the listing) are spread."""
  batches = take(data.train_iterator(make_config(layouts[layout]), local_batch_size=50), 19)
  stream = np.concatenate([ids(b) for b in batches])
  np.testing.assert_array_equal(np.concatenate([b['label'] for b in batches]), TRAIN_LABELS[stream])
  epochs = [stream[e * NUM_TRAIN : (e + 1) * NUM_TRAIN] for e in range(3)]
  for e, epoch in enumerate(epochs):
    assert sorted(epoch) == list(range(NUM_TRAIN)), f'epoch {e}'
  assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
  # Full permutations: all 8 in the first 64 has chance 4e-6.
  assert np.flatnonzero(TRAIN_LABELS[epochs[0]] < 2).max() >= 64, epochs[0][:64]


@pytest.mark.parametrize('layout', LAYOUTS)
def test_batches_are_a_function_of_seed_and_step_on_any_host_count(layouts, layout):
  """data_shards=4 of 307 examples (77, 77, 77, 76; strided across the files), 6 examples
  of each shard a step (step 12 holds every shard's first epoch edge): resumed at step 12, or on 2 or
  4 hosts from step 11, the batches are those of one uninterrupted host."""
  config = make_config(layouts[layout], data_shards=4)
  reference = take(data.train_iterator(config, local_batch_size=24), 15)
  helpers.assert_same_batches(
      take(data.train_iterator(config, local_batch_size=24, start_step=12), 3), reference[12:15]
  )
  for process_count in (2, 4):
    hosts = [
        take(
            data.train_iterator(
                config,
                local_batch_size=24 // process_count,
                start_step=11,
                process_index=i,
                process_count=process_count,
            ),
            3,
        )
        for i in range(process_count)
    ]
    for step in range(3):
      for key in ('image', 'label'):
        np.testing.assert_array_equal(
            np.concatenate([host[step][key] for host in hosts]),
            reference[11 + step][key],
            err_msg=f'{process_count} hosts',
        )


def test_epoch_orders_neither_repeat_nor_collide_across_seeds():
  """Each epoch's order is drawn from all of (seed, epoch): epoch 256 is not epoch 0 again (an index
  shuffle keyed on the low 8 bits of each word once made it so), 300 seeds give 300 orders, and
  negative seeds are seeds."""

  def epoch_head(seed: int, epoch: int) -> tuple[int, ...]:
    """The records at the first 16 positions of the epoch, which tell its order."""
    return tuple(order.index_at(NUM_TRAIN, (seed, 0, 0), epoch * NUM_TRAIN + k) for k in range(16))

  assert len({epoch_head(0, epoch) for epoch in range(300)}) == 300
  assert len({epoch_head(seed, 0) for seed in range(-150, 150)}) == 300


def test_the_train_order_has_no_period_of_256_epochs(layouts):
  """One batch a whole epoch of the folder: epoch 256 is not epoch 0 again."""
  config = make_config(layouts['folder'])
  first, later = (
      next(data.train_iterator(config, local_batch_size=NUM_TRAIN, start_step=step))
      for step in (0, 256)
  )
  assert sorted(ids(first)) == sorted(ids(later)) == list(range(NUM_TRAIN))
  assert not np.array_equal(ids(first), ids(later))


def test_a_sum_of_splits_is_cut_into_even_shards(layouts):
  """'train[:301]+test' is 304 records: 152 a host. tfds.even_splits cuts each part on its own
  (151 + 2 and 150 + 1); evaluation pads every host to 152 rows of an even cut, and so dropped one.
  """
  config = make_config(layouts['array_record'])
  split = 'train[:301]+test'
  seen = []
  for process_index in range(2):
    for batch in data.eval_iterator(
        config, split, local_batch_size=8, process_index=process_index, process_count=2
    ):
      seen += list(ids(batch)[batch['mask']])
  assert sorted(seen) == list(range(301)) + [307, 308, 309]
  # Training on it: 2 shards of 152, each one epoch in one batch.
  train = next(
      data.train_iterator(
          make_config(layouts['array_record'], train_split=split, data_shards=2),
          local_batch_size=304,
      )
  )
  assert sorted(ids(train)) == sorted(seen)


# Two processes joined by jax.distributed, as `launch/local.py` runs them: each reads its data shard
# and assembles its part of the global batch (sharding.global_batch); process 0 gathers and saves it.
_STEPS, _START = 3, 37


def _process_main(process_id: int, address: str, overrides: dict, out: str) -> None:
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  jax.distributed.initialize(coordinator_address=address, num_processes=2, process_id=process_id)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top

  mesh = sharding.make_mesh((('data', -1),))
  batches = data.train_iterator(
      make_config(overrides),
      local_batch_size=4,
      start_step=_START,
      process_index=jax.process_index(),
      process_count=jax.process_count(),
  )
  rows = {}
  for step in range(_STEPS):
    for key, value in sharding.global_batch(next(batches), mesh).items():
      rows[f'{key}{step}'] = np.asarray(multihost_utils.process_allgather(value, tiled=True))
  if process_id == 0:
    np.savez(out, **rows)


@pytest.mark.slow
@pytest.mark.parametrize('layout', LAYOUTS)
def test_two_processes_assemble_the_global_batch_of_one(tmp_path, layouts, layout):
  """2 processes x 2 devices, a global batch of 8 (default data_shards: one a process) from step 37,
  where the shards of 154 and 153 examples turn their second epoch: the global batches are those of
  one process with data_shards=2."""
  import local  # pylint: disable=g-import-not-at-top

  out = str(tmp_path / 'batches.npz')
  env = dict(
      os.environ,
      JAX_PLATFORMS='cpu',
      XLA_FLAGS='--xla_force_host_platform_device_count=2',
      PYTHONPATH=os.pathsep.join([helpers.REPO, helpers.TESTS, os.environ.get('PYTHONPATH', '')]),
  )
  address = f'127.0.0.1:{local.free_port()}'
  logs = [tmp_path / f'process_{i}.log' for i in range(2)]
  procs = [
      subprocess.Popen(
          [sys.executable, __file__, str(i), address, json.dumps(layouts[layout]), out],
          cwd=helpers.REPO,
          env=env,
          stdout=open(log, 'w'),
          stderr=subprocess.STDOUT,
      )
      for i, log in enumerate(logs)
  ]
  try:
    codes = [p.wait(timeout=300) for p in procs]
  finally:  # A process left waiting for the other one is stopped, not left behind.
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  assert codes == [0, 0], ''.join(log.read_text()[-3000:] for log in logs)
  got = np.load(out)
  one = data.train_iterator(
      make_config(layouts[layout], data_shards=2), local_batch_size=8, start_step=_START
  )
  for step in range(_STEPS):
    batch = next(one)
    for key in ('image', 'label'):
      np.testing.assert_array_equal(got[f'{key}{step}'], batch[key], err_msg=f'step {step}')


if __name__ == '__main__':  # One process of test_two_processes_assemble_the_global_batch_of_one.
  _process_main(int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4])
