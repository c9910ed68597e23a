"""Tests of vit_jax.data: the bundled digits, image folders, determinism, sharding, errors."""

import collections
import io
import os
import subprocess
import sys
import threading
import time

import numpy as np
from PIL import Image
import pytest
import tensorflow_datasets as tfds

import helpers
from helpers import as_uint8, assert_same_batches, multiset, take
import tfds_fixtures
from vit_jax import data
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import order
from vit_jax.data import images as data_images
from vit_jax.data import preprocess
from vit_jax.data import readable
from vit_jax.data import train_ops
from vit_jax.data import unreadable
from vit_jax.train import loop, setup as train_setup

make_config = helpers.data_config


# The bundled digits.


def test_digits_split_is_the_stratified_sklearn_split(data_dir):
  info = data.get_info(make_config(data_dir))
  assert (info.num_train, info.num_eval, info.num_classes) == (1437, 360, 10)
  assert info.class_names == tuple('0123456789')
  arrays = digits.split_arrays()
  assert arrays['train'][0].shape == (1437, 8, 8, 3) and arrays['test'][0].shape == (360, 8, 8, 3)
  # Pixels are the 17 levels of scikit-learn's 0..16 counts, spread over 0..255, grey in RGB.
  levels = np.round(np.arange(17) * 255 / 16).astype(np.uint8)
  images = arrays['train'][0]
  assert images.dtype == np.uint8 and np.isin(images, levels).all() and images.max() == 255
  np.testing.assert_array_equal(images[..., 0], images[..., 2])
  # Stratified: every class keeps its share in the test split.
  assert np.bincount(arrays['test'][1]).min() >= 35
  # scikit-learn's own images and split, which the digits read from its file and a copy of its split.
  from sklearn import datasets, model_selection  # pylint: disable=g-import-not-at-top

  sk = datasets.load_digits()
  train_x, test_x, train_y, test_y = model_selection.train_test_split(
      sk.images, sk.target, test_size=0.2, random_state=0, stratify=sk.target
  )
  for name, (x, y) in {'train': (train_x, train_y), 'test': (test_x, test_y)}.items():
    np.testing.assert_array_equal(arrays[name][0][..., 1], np.round(x * 255 / 16).astype(np.uint8))
    np.testing.assert_array_equal(arrays[name][1], y)


def test_digits_eval_holds_exactly_the_split(data_dir):
  config = make_config(data_dir)
  batches = list(data.eval_iterator(config, 'test', local_batch_size=360))
  assert len(batches) == 1 and batches[0]['mask'].all()
  got = multiset(as_uint8(batches[0]['image']), batches[0]['label'])
  assert got == multiset(*digits.split_arrays()['test'])


_NO_TENSORFLOW = """
import sys
from vit_jax import data
from vit_jax import main
from vit_jax.tools import export, fewshot, predict
from vit_jax.train import loop, setup
heavy = sorted({'tensorflow', 'keras', 'sklearn', 'matplotlib'} & sys.modules.keys())
sys.path.insert(0, 'tests')
import helpers
for config in (helpers.data_config(None, pp=dict(crop='inception', flip=True)),
               helpers.data_config(sys.argv[1], dataset='folder', data_workers=0)):
  train = next(data.train_iterator(config, local_batch_size=4))
  evaluation = next(data.eval_iterator(config, 'test', local_batch_size=4))
  print(config.dataset, train['image'].shape, evaluation['image'].shape, evaluation['mask'].sum())
print(heavy, 'tensorflow' in sys.modules)
"""


def test_a_run_does_not_import_tensorflow(image_folder):
  """Where importing TensorFlow fails, the data pipeline (and every command's imports) still loads,
  and the digits and an image folder give train and eval batches; TensorFlow is never imported.
  Keras, scikit-learn and matplotlib are not loaded by a command's imports either (seconds of its
  start)."""
  root, _ = image_folder
  run = subprocess.run(
      [sys.executable, '-c', _NO_TENSORFLOW, root],
      cwd=helpers.REPO,
      env=helpers.without_tensorflow(),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.splitlines()[-3:] == [
      'digits (4, 8, 8, 3) (4, 8, 8, 3) 4',
      'folder (4, 8, 8, 3) (4, 8, 8, 3) 4',
      '[] False',
  ], run.stdout


# Train batches.


@pytest.mark.parametrize('crop', list(train_ops.CROPS))
def test_train_batches(data_dir, crop):
  pad = 2 if crop == 'random' else 0  # Only that crop pads.
  config = make_config(data_dir, image_size=16, pp=dict(crop=crop, pad=pad, flip=True))
  for batch in take(data.train_iterator(config, local_batch_size=32), 3):
    assert set(batch) == {'image', 'label'}
    assert batch['image'].shape == (32, 16, 16, 3) and batch['image'].dtype == np.uint8
    assert batch['label'].shape == (32,) and batch['label'].dtype == np.int32
    images = preprocess.model_input(batch['image'])
    assert -1 <= images.min() < 0 < images.max() <= 1
    assert 0 <= batch['label'].min() and batch['label'].max() <= 9


def test_each_epoch_is_a_new_permutation_of_the_split(data_dir):
  # 1437 = 3 * 479, so three batches are one epoch. Negative seeds are seeds too.
  orders = {}
  for seed in (0, 1, -1):
    config = make_config(data_dir, seed=seed)
    batches = take(data.train_iterator(config, local_batch_size=479), 6)
    epochs = [batches[:3], batches[3:]]
    images = [np.concatenate([as_uint8(b['image']) for b in epoch]) for epoch in epochs]
    labels = [np.concatenate([b['label'] for b in epoch]) for epoch in epochs]
    for x, y in zip(images, labels):
      assert multiset(x, y) == multiset(*digits.split_arrays()['train'])
    assert not np.array_equal(labels[0], labels[1])
    orders[seed] = labels[0]
  assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[0], orders[-1])
  assert not np.array_equal(orders[1], orders[-1])


def test_epoch_permutations_differ_across_epochs_and_seeds_and_visit_every_record_once():
  n = 37

  def epoch_order(seed, epoch):
    return tuple(order.index_at(n, seed, epoch * n + k) for k in range(n))

  for seed in [(0, 0, 0), (-1, 0, 0), (2**63, 5, 1), (-(2**63), 0, 1)]:
    epochs = [epoch_order(seed, e) for e in range(20)]
    assert all(sorted(e) == list(range(n)) for e in epochs)
    assert len(set(epochs)) == 20
  seeds = [(s, 0, 0) for s in range(-50, 50)]
  assert len({epoch_order(seed, 0) for seed in seeds}) == 100
  # A seed and its unsigned 64-bit twin are one seed; -1 and 1 are not.
  assert epoch_order((-1, 0, 0), 3) == epoch_order((2**64 - 1, 0, 0), 3)
  assert epoch_order((-1, 0, 0), 3) != epoch_order((1, 0, 0), 3)


@pytest.mark.parametrize(
    'pp',
    [
        dict(crop='inception', flip=True),
        dict(crop='random', pad=1, flip=True),
        dict(crop='resize', flip=False),
    ],
)
def test_resume_is_bitwise_identical(data_dir, pp):
  config = make_config(data_dir, image_size=12, pp=pp)
  # 100 does not divide 1437: batch 14 spans epochs 0 and 1, batch 28 spans epochs 1 and 2.
  for process_index, process_count in [(0, 1), (1, 2)]:
    kwargs = dict(local_batch_size=100, process_index=process_index, process_count=process_count)
    reference = take(data.train_iterator(config, **kwargs), 32)
    for start in (5, 14, 29):
      resumed = take(data.train_iterator(config, start_step=start, **kwargs), 3)
      assert_same_batches(resumed, reference[start : start + 3])


def test_batches_do_not_depend_on_the_number_of_worker_processes(data_dir, image_folder):
  """grain's worker processes (config.data_workers) build the batches this process builds, from the
  first step or resumed, augmented, with an unreadable file in each split (the image folder's)."""
  root, _ = image_folder
  for where in (dict(data_dir=data_dir), dict(data_dir=root, dataset='folder')):

    def batches(workers, start_step, **where):
      config = make_config(
          **where, image_size=12, data_workers=workers, pp=dict(crop='inception', flip=True)
      )
      train = take(data.train_iterator(config, local_batch_size=10, start_step=start_step), 3)
      if 'dataset' not in where:  # The digits' eval rows are no different in kind.
        return train, []
      return train, list(data.eval_iterator(config, 'test', local_batch_size=10))

    in_process, eval_in_process = batches(0, 2, **where)
    in_workers, eval_in_workers = batches(2, 2, **where)
    assert_same_batches(in_workers, in_process)
    assert_same_batches(eval_in_workers, eval_in_process)
    uninterrupted, _ = batches(0, 0, **where)
    assert_same_batches(uninterrupted[2:], in_process[:1])


_CLOSED_WITH_WORKERS_IN_FLIGHT = """
import sys
sys.path.insert(0, 'tests')
import helpers
from vit_jax import data
config = helpers.data_config(sys.argv[1], dataset='folder', data_workers=2)
batches = data.train_iterator(config, local_batch_size=4)
next(batches)
for _ in data.eval_iterator(config, 'test', local_batch_size=2):  # A whole evaluation.
  pass
batches.close()
"""


@pytest.mark.slow  # An evaluation with worker processes in a subprocess: make test-all's.
def test_a_run_with_worker_processes_ends_without_a_shared_memory_warning(image_folder):
  """Batches still in the workers' shared memory when the run ends are unlinked by multiprocessing's
  resource tracker, which says so in a UserWarning ("leaked shared_memory objects") on the console.
  """
  run = subprocess.run(
      [sys.executable, '-c', _CLOSED_WITH_WORKERS_IN_FLIGHT, image_folder[0]],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'resource_tracker' not in run.stderr and 'leaked' not in run.stderr, run.stderr[-3000:]


_KILLED_WITH_WORKERS = """
import multiprocessing, os, signal, sys
sys.path.insert(0, 'tests')
import helpers
from vit_jax import data
config = helpers.data_config(sys.argv[1], dataset='folder', data_workers=2)
batches = data.train_iterator(config, local_batch_size=4)
next(batches)
print(*[child.pid for child in multiprocessing.active_children()], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads process states from /proc')
def test_worker_processes_end_with_a_killed_run(image_folder):
  """A run that is SIGKILLed (the OOM killer, a scheduler) takes its grain workers with it: they
  would otherwise run on, holding their memory and the run's output pipes (so that a caller reading
  them to the end waits for ever)."""
  root, _ = image_folder
  run = subprocess.Popen(
      [sys.executable, '-c', _KILLED_WITH_WORKERS, root],
      cwd=helpers.REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.DEVNULL,
      text=True,
  )
  workers = [int(pid) for pid in run.stdout.readline().split()]
  assert run.wait(timeout=300) == -9
  assert len(workers) == 2
  deadline = time.monotonic() + 30
  while any(helpers.running(pid) for pid in workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(helpers.running(pid) for pid in workers), workers
  assert run.stdout.read() == ''  # The pipe's end: no worker holds it.


def test_augmentation_depends_on_seed_and_host(data_dir):
  config = make_config(data_dir, pp=dict(crop='inception', flip=True))
  a = next(data.train_iterator(config, local_batch_size=64))
  b = next(
      data.train_iterator(
          make_config(data_dir, seed=1, pp=dict(crop='inception', flip=True)), local_batch_size=64
      )
  )
  assert not np.array_equal(a['label'], b['label'])
  host0, host1 = (
      next(data.train_iterator(config, local_batch_size=64, process_index=i, process_count=2))
      for i in range(2)
  )
  assert not np.array_equal(host0['image'], host1['image'])


def test_crops_are_wired(data_dir):
  """An inception crop of the whole area and a random crop without padding are plain resizes; a
  flip mirrors some images and leaves the others."""

  def first_batch(**pp):
    config = make_config(data_dir, image_size=16, pp=pp)
    return preprocess.model_input(next(data.train_iterator(config, local_batch_size=128))['image'])

  resized = first_batch(crop='resize', flip=False)
  np.testing.assert_array_equal(first_batch(crop='inception', min_area=1.0, flip=False), resized)
  np.testing.assert_array_equal(
      first_batch(crop='random_resized', min_area=1.0, flip=False), resized
  )
  np.testing.assert_array_equal(first_batch(crop='random', pad=0, flip=False), resized)
  assert not np.array_equal(first_batch(crop='inception', min_area=0.05, flip=False), resized)
  assert not np.array_equal(first_batch(crop='random_resized', min_area=0.05, flip=False), resized)
  shifted = first_batch(crop='random', pad=2, flip=False)
  assert not np.array_equal(shifted, resized) and (shifted == -1).any()  # Black padding shows.
  flipped = first_batch(crop='resize', flip=True)
  is_mirror = [np.array_equal(f, r[:, ::-1]) for f, r in zip(flipped, resized)]
  is_same = [np.array_equal(f, r) for f, r in zip(flipped, resized)]
  assert all(m or s for m, s in zip(is_mirror, is_same))
  assert 20 < sum(m and not s for m, s in zip(is_mirror, is_same)) < 108


# Sharding and eval.


@pytest.mark.parametrize('process_count', [2, 3])
def test_train_shards_are_disjoint_and_cover_the_split(data_dir, process_count):
  config = make_config(data_dir)
  info = data.get_info(config)
  per_host = collections.Counter()
  for process_index in range(process_count):
    shard_size = len(range(process_index, info.num_train, process_count))
    # One batch of the shard's size is exactly one epoch of that host's shard.
    batch = next(
        data.train_iterator(
            config,
            local_batch_size=shard_size,
            process_index=process_index,
            process_count=process_count,
        )
    )
    per_host += multiset(as_uint8(batch['image']), batch['label'])
  assert per_host == multiset(*digits.split_arrays()['train'])


@pytest.mark.parametrize('pp', [dict(crop='inception', flip=True), dict(crop='resize')])
def test_global_batches_do_not_depend_on_the_number_of_hosts(data_dir, pp):
  config = make_config(data_dir, data_shards=4, pp=pp)
  one_host = take(data.train_iterator(config, local_batch_size=32, start_step=40), 3)
  for process_count in (2, 4):
    hosts = [
        take(
            data.train_iterator(
                config,
                local_batch_size=32 // process_count,
                start_step=40,
                process_index=i,
                process_count=process_count,
            ),
            3,
        )
        for i in range(process_count)
    ]
    assembled = [
        {k: np.concatenate([host[step][k] for host in hosts]) for k in ('image', 'label')}
        for step in range(3)
    ]
    assert_same_batches(one_host, assembled)
  with pytest.raises(ValueError, match='data_shards=4 is not a multiple of the 3 processes'):
    data.train_iterator(config, local_batch_size=8, process_count=3)


# 360 = 7 * 51 + 3: three hosts hold 52 examples, so they need a second, mostly padded batch.
@pytest.mark.parametrize('process_count,batch', [(1, 64), (2, 64), (3, 360), (7, 51)])
def test_eval_visits_each_example_once_with_equal_batch_counts(data_dir, process_count, batch):
  config = make_config(data_dir)
  expected = data.num_eval_batches(360, local_batch_size=batch, process_count=process_count)
  seen = collections.Counter()
  for process_index in range(process_count):
    batches = list(
        data.eval_iterator(
            config,
            'test',
            local_batch_size=batch,
            process_index=process_index,
            process_count=process_count,
        )
    )
    assert len(batches) == expected
    for b in batches:
      assert b['image'].shape == (batch, 8, 8, 3) and b['mask'].dtype == bool
      real = b['mask']
      seen += multiset(as_uint8(b['image'][real]), b['label'][real])
      assert (b['image'][~real] == 0).all()
  assert seen == multiset(*digits.split_arrays()['test'])


@pytest.fixture(scope='module')
def array_record_dir(tmp_path_factory):
  """A tfds data_dir with the digits prepared as ArrayRecord (read by index), found by name."""
  path = str(tmp_path_factory.mktemp('array_record'))
  assert tfds_fixtures.prepare(tfds_fixtures.DigitsBuilder, path) == 'digits_builder'
  return path


@pytest.mark.parametrize('source', ['digits', 'array_record'])
def test_tfds_slices_hold_out_a_minival(data_dir, array_record_dir, source):
  """train_split 'train[:90%]' and eval_split 'train[90%:]' cut the train split in two disjoint
  parts, for sharded training, sharded eval and the counts alike: on the digits in memory and on a
  tfds dataset."""
  where = (
      dict(data_dir=data_dir)
      if source == 'digits'
      else dict(dataset='digits_builder', data_dir=array_record_dir)
  )
  config = make_config(train_split='train[:90%]', eval_split='train[90%:]', **where)
  info = data.get_info(config)
  assert (info.num_train, info.num_eval) == (1293, 144)
  assert data.num_examples(config, 'train[90%:]') == 144

  def eval_rows(split, process_count):
    rows = collections.Counter()
    for process_index in range(process_count):
      for b in data.eval_iterator(
          config,
          split,
          local_batch_size=100,
          process_index=process_index,
          process_count=process_count,
      ):
        rows += multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']])
    return rows

  held_in, held_out = eval_rows('train[:90%]', 3), eval_rows('train[90%:]', 2)
  assert not held_in & held_out
  assert held_in + held_out == multiset(*digits.split_arrays()['train'])
  trained = collections.Counter()
  for process_index in range(2):
    # One batch of the host's shard size is one epoch of its shard of the slice.
    batch = next(
        data.train_iterator(
            config,
            local_batch_size=len(range(process_index, 1293, 2)),
            process_index=process_index,
            process_count=2,
        )
    )
    trained += multiset(as_uint8(batch['image']), batch['label'])
  assert trained == held_in


def test_eval_resize_matches_pil_bilinear(data_dir):
  native = next(data.eval_iterator(make_config(data_dir), 'test', local_batch_size=360))
  upscaled = next(
      data.eval_iterator(make_config(data_dir, image_size=20), 'test', local_batch_size=360)
  )
  for small, big in zip(as_uint8(native['image'][:50]), upscaled['image'][:50]):
    reference = np.asarray(Image.fromarray(small).resize((20, 20), Image.BILINEAR), np.float32)
    # PIL rounds to uint8 after each of its two 1-D passes: less than one level apart.
    np.testing.assert_allclose((preprocess.model_input(big) + 1) * 127.5, reference, atol=1.0)


# Label features, and tfds datasets prepared unshuffled.


class CoarseDigits(tfds_fixtures.DigitsBuilder, skip_registration=True):
  """The digits with a 2-class 'coarse_label' (small: 0-4, large: 5-9) beside their 10-class 'label',
  as cifar100's 'coarse_label', and a Sequence of ClassLabel 'label_set' (ImageNet-ReaL's layout).
  """

  def _info(self) -> tfds.core.DatasetInfo:
    classes = [str(d) for d in range(10)]
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(8, 8, 3)),
                'label': tfds.features.ClassLabel(names=classes),
                'coarse_label': tfds.features.ClassLabel(names=['small', 'large']),
                'label_set': tfds.features.Sequence(tfds.features.ClassLabel(names=classes)),
            }
        )
    )

  def _generate_examples(self, images, labels):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {
          'image': tfds_fixtures.png(image),
          'label': label,
          'coarse_label': int(label >= 5),
          'label_set': [label],
      }


@pytest.fixture(scope='module')
def coarse_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('coarse_digits'))
  tfds_fixtures.prepare(CoarseDigits, path)
  return path


def _coarse(labels: np.ndarray) -> np.ndarray:
  return (labels >= 5).astype(np.int64)


def test_the_run_trains_and_evaluates_on_its_label_feature(coarse_dir):
  config = make_config(coarse_dir, dataset='coarse_digits', label_feature='coarse_label')
  info = data.get_info(config)
  assert (info.num_classes, info.class_names) == (2, ('small', 'large'))
  assert (info.num_train, info.num_eval) == (1437, 360)
  assert data.class_names(config) == ('small', 'large')
  train_images, train_labels = digits.split_arrays()['train']
  epoch = next(data.train_iterator(config, local_batch_size=1437))
  assert multiset(as_uint8(epoch['image']), epoch['label']) == multiset(
      train_images, _coarse(train_labels)
  )
  # An evaluation that names no label feature (the eval split's, few-shot's) reads the run's...
  test_images, test_labels = digits.split_arrays()['test']
  (batch,) = data.eval_iterator(config, 'test', local_batch_size=360)
  assert multiset(as_uint8(batch['image']), batch['label']) == multiset(
      test_images, _coarse(test_labels)
  )
  # ...and one that names another reads that one.
  (batch,) = data.eval_iterator(config, 'test', local_batch_size=360, label_feature='label')
  assert multiset(as_uint8(batch['image']), batch['label']) == multiset(test_images, test_labels)


def test_a_tiny_run_on_a_coarse_label_has_its_classes(tmp_path, coarse_dir):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'coarse_digits',
          'data_dir': coarse_dir,
          'label_feature': 'coarse_label',
          'total_steps': 4,
          'eval_every_steps': 4,
          'data_workers': 0,
      },
  )
  config.evals.minival = dict(type='classification', split='train[:100]', every_steps=4)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert setup.info.num_classes == 2
  metrics = loop.train_and_evaluate(setup)
  # Top-5 of 2 classes holds every label of 2 classes; a label of the 10 digits would miss it.
  assert metrics['eval_top5'] == metrics['minival_top5'] == 1.0
  assert np.isfinite(metrics['eval_loss'])


def test_label_feature_errors(coarse_dir, image_folder):
  expect_error(
      make_config(coarse_dir, dataset='coarse_digits', label_feature='fine_label'),
      r"^Dataset 'coarse_digits' has no ClassLabel \(or Sequence of ClassLabel\) feature "
      r"'fine_label': set --config.label_feature \(or the evaluator's label_feature\) to one "
      r"of its ClassLabel features \['coarse_label', 'label'\] or label sets \['label_set'\]$",
  )
  root, _ = image_folder
  expect_error(
      make_config(root, dataset='folder', label_feature='coarse_label'),
      r"^An image folder has one class an image, not a label feature 'coarse_label'",
  )


# Image folders.


@pytest.fixture(autouse=True)
def forget_named_files(monkeypatch):
  """Each test starts with no unreadable file named yet in the process (each is named once)."""
  monkeypatch.setattr(unreadable, '_named', set())


@pytest.fixture(scope='module')
def image_folder(tmp_path_factory):
  """root/{train,test}/{cat,dog}/ with 12x12 PNGs and JPEGs (some extensions upper-case), a
  greyscale PNG, a non-image file, and a corrupt .jpg in each split's cat folder.

  Returns the root and, per split, the multiset of exact (RGB pixels, label) of its PNGs.
  """
  root = tmp_path_factory.mktemp('folder')
  rng = np.random.default_rng(0)
  pngs = {}
  for split, per_class in [('train', 4), ('test', 3)]:
    pngs[split] = collections.Counter()
    for label, name in enumerate(['cat', 'dog']):
      folder = root / split / name
      folder.mkdir(parents=True)
      for i in range(per_class):
        pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f'{i}.png')
        Image.fromarray(pixels).save(folder / f'{i}.JPG', format='JPEG')
        Image.fromarray(pixels).save(folder / f'{i}b.jpeg', format='JPEG')
        pngs[split][(pixels.tobytes(), label)] += 1
      grey = rng.integers(0, 256, (12, 12), dtype=np.uint8)
      Image.fromarray(grey, 'L').save(folder / 'grey.PNG')
      pngs[split][(np.repeat(grey[..., None], 3, -1).tobytes(), label)] += 1
      (folder / 'notes.txt').write_text('not an image')
    (root / split / 'cat' / 'corrupt.jpg').write_bytes(b'\xff\xd8\xff\xe0' + b'garbage' * 10)
  return str(root), pngs


def test_folder_info(image_folder):
  root, _ = image_folder
  info = data.get_info(make_config(root, dataset='folder'))
  assert info.class_names == ('cat', 'dog') and info.num_classes == 2
  # Per class: 3 files per index and a greyscale PNG; plus the corrupt file, found but not yet read.
  assert (info.num_train, info.num_eval) == (2 * (3 * 4 + 1) + 1, 2 * (3 * 3 + 1) + 1)
  assert data.num_examples(make_config(root, dataset='folder'), 'train') == info.num_train


def test_a_symbolic_link_that_loops_back_is_a_one_line_error(tmp_path):
  for split in ('train', 'test'):
    (tmp_path / split / 'a').mkdir(parents=True)
    Image.new('RGB', (8, 8)).save(tmp_path / split / 'a' / '0.png')
  (tmp_path / 'train' / 'a' / 'loop').symlink_to('..')  # A folder in its own sub-folder: no end.
  assert helpers.data_error(str(tmp_path), dataset='folder') == (
      f"Image folder {tmp_path / 'train/a/loop'} is a symbolic link to {tmp_path / 'train'}, "
      'which holds it: its images would be listed without end; remove the link'
  )
  # A folder listed twice by links that do not loop is read twice, as torchvision's ImageFolder.
  (tmp_path / 'train' / 'a' / 'loop').unlink()
  (tmp_path / 'train' / 'a' / 'again').symlink_to(tmp_path / 'test' / 'a')
  files, _ = folder.FolderSource(str(tmp_path), 'train').split_files('train')
  assert [os.path.relpath(f, tmp_path) for f in files] == ['train/a/0.png', 'train/a/again/0.png']


def test_a_folder_is_listed_once_per_split_however_often_it_is_read(tmp_path, monkeypatch):
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      (tmp_path / split / name).mkdir(parents=True)
      Image.new('RGB', (8, 8)).save(tmp_path / split / name / '0.png')
  listed = collections.Counter()
  image_files = folder.image_files
  monkeypatch.setattr(
      folder, 'image_files', lambda path: listed.update([path]) or image_files(path)
  )
  config = make_config(str(tmp_path), dataset='folder', eval_batch_size=2)
  data.get_info(config)
  take(data.train_iterator(config, local_batch_size=2), 2)
  for _ in range(3):  # Three evaluations.
    assert len(list(data.eval_iterator(config, 'test', local_batch_size=2))) == 1
  assert listed == {str(tmp_path / split / name): 1 for split in ('train', 'test') for name in 'ab'}
  Image.new('RGB', (8, 8)).save(tmp_path / 'train' / 'a' / '1.png')
  assert data.get_info(config).num_train == 3  # The next run lists the folder again.


def test_class_folders_are_listed_at_once_in_their_order(tmp_path, monkeypatch):
  """On cloud storage each class folder is a request or more: one after the other, ImageNet's 1000
  would wait on a thousand round trips."""
  for name in ('b', 'a', 'd', 'c', 'e', 'f'):
    (tmp_path / 'train' / name).mkdir(parents=True)
    for k in range(2):
      Image.new('RGB', (8, 8)).save(tmp_path / 'train' / name / f'{k}.png')
  lock, running, most = threading.Lock(), [0], [0]
  image_files = folder.image_files

  def slow_image_files(path):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.2)  # A round trip to the bucket.
    with lock:
      running[0] -= 1
    return image_files(path)

  monkeypatch.setattr(folder, 'image_files', slow_image_files)
  files, labels = folder.FolderSource(str(tmp_path), 'train').split_files('train')
  assert list(files) == [
      str(tmp_path / 'train' / name / f'{k}.png') for name in 'abcdef' for k in range(2)
  ]
  assert labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
  assert most[0] > 1


def test_folder_eval_skips_corrupt_file_with_warning(image_folder, caplog):
  root, pngs = image_folder
  config = make_config(root, dataset='folder', image_size=12)
  with caplog.at_level('WARNING'):
    batches = list(data.eval_iterator(config, 'test', local_batch_size=8))
  assert any(
      r.getMessage().startswith('Skipping unreadable image file ')
      and '/test/cat/corrupt.jpg (' in r.getMessage()
      for r in caplog.records
  )
  assert len(batches) == data.num_eval_batches(21, local_batch_size=8) == 3
  mask = np.concatenate([b['mask'] for b in batches])
  images = as_uint8(np.concatenate([b['image'] for b in batches])[mask])
  labels = np.concatenate([b['label'] for b in batches])[mask]
  assert len(labels) == 20 and np.bincount(labels).tolist() == [10, 10]  # All but the corrupt one.
  # PNGs (and the greyscale PNG, as RGB) come through pixel-exact; the class is the folder's index.
  assert not pngs['test'] - multiset(images, labels)
  # The corrupt file's row is a padding row in its place (zeros, mask False); so is the batch's tail.
  paths, _ = folder.FolderSource(root, 'train').split_files('test')
  corrupt_row = paths.index(os.path.join(root, 'test', 'cat', 'corrupt.jpg'))
  assert np.flatnonzero(~mask).tolist() == [corrupt_row, 21, 22, 23]
  assert (np.concatenate([b['image'] for b in batches])[~mask] == 0).all()


def test_folder_train_skips_corrupt_file(image_folder, caplog):
  root, _ = image_folder
  config = make_config(root, dataset='folder', pp=dict(crop='inception', flip=True))
  with caplog.at_level('WARNING'):
    batches = take(data.train_iterator(config, local_batch_size=9), 6)  # Two epochs of 26 images.
  assert any('/train/cat/corrupt.jpg (' in r.getMessage() for r in caplog.records)
  labels = np.concatenate([b['label'] for b in batches])
  assert batches[0]['image'].shape == (9, 8, 8, 3) and set(labels) == {0, 1}


def _folder_with_corrupt_files(root) -> dict[str, collections.Counter]:
  """root/{train,test}/{a,b}/ with 5 random 8x8 PNGs a class and 2 corrupt files a split, first and
  last in the split's order; the multiset of readable (pixels, label) of each split."""
  rng = np.random.default_rng(0)
  readable = {}
  for split in ('train', 'test'):
    readable[split] = collections.Counter()
    for label, name in enumerate(('a', 'b')):
      (root / split / name).mkdir(parents=True)
      for i in range(5):
        pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / split / name / f'{i}.png')
        readable[split][(pixels.tobytes(), label)] += 1
    (root / split / 'a' / '0_corrupt.jpg').write_bytes(b'not a jpeg')
    (root / split / 'b' / 'z_corrupt.png').write_bytes(b'\x89PNG truncated')
  return readable


def test_folder_names_each_dropped_file_once_a_process(tmp_path, caplog):
  # Corrupt files first and last in the split's order: the last one's gap shows only at the next
  # batch (train) or at the first padding row (eval).
  _folder_with_corrupt_files(tmp_path)
  config = make_config(str(tmp_path), dataset='folder', image_size=8)
  corrupt = {
      f'{split}/{path}'
      for split in ('train', 'test')
      for path in ('a/0_corrupt.jpg', 'b/z_corrupt.png')
  }

  def named(split):
    # 'Skipping unreadable image file PATH (REASON)'.
    names = [
        r.getMessage().rsplit(str(tmp_path) + os.sep, 1)[-1].split(' (')[0]
        for r in caplog.records
        if r.getMessage().startswith('Skipping unreadable image file')
    ]
    return collections.Counter(n for n in names if n.startswith(split))

  with caplog.at_level('WARNING'):
    batches = take(data.train_iterator(config, local_batch_size=4), 8)  # 32 = 3 epochs of 10, + 2.
  assert all(len(b['label']) == 4 for b in batches)
  # 32 readable examples are 3 epochs read through: the stream met each corrupt file 3 times or
  # more, and named it once.
  assert named('train') == collections.Counter({c: 1 for c in corrupt if c.startswith('train')})
  for _ in range(2):  # Two evaluations: the first names the split's corrupt files, the second none.
    with caplog.at_level('WARNING'):
      batches = list(data.eval_iterator(config, 'test', local_batch_size=4))
    assert named('test') == collections.Counter({c: 1 for c in corrupt if c.startswith('test')})
    assert sum(b['mask'].sum() for b in batches) == 10


def test_an_unreadable_train_file_is_replaced_by_the_next_record_of_its_epoch(tmp_path):
  """12 records a epoch, 2 of them corrupt: each epoch's 12 rows hold every readable image, and 2 of
  them twice (each corrupt file's slot takes the next record of the epoch's order). The stream stays a
  function of the step: a resumed run reads what an uninterrupted one reads, unreadable files and all,
  in this process or in worker processes."""
  readable = _folder_with_corrupt_files(tmp_path)['train']
  config = make_config(str(tmp_path), dataset='folder', image_size=8)
  reference = take(data.train_iterator(config, local_batch_size=4), 9)  # 3 epochs of 12.
  orders = []
  for epoch in range(3):
    rows = reference[3 * epoch : 3 * epoch + 3]
    got = multiset(
        np.concatenate([as_uint8(b['image']) for b in rows]),
        np.concatenate([b['label'] for b in rows]),
    )
    assert set(got) == set(readable) and sum(got.values()) == 12, f'epoch {epoch}'
    assert sorted(got.values()) == [1] * 8 + [2] * 2, f'epoch {epoch}'
    orders.append(np.concatenate([as_uint8(b['image']) for b in rows]))
  assert not np.array_equal(orders[0], orders[1])
  for start in (1, 3, 5):
    assert_same_batches(
        take(data.train_iterator(config, local_batch_size=4, start_step=start), 3),
        reference[start : start + 3],
    )
  workers = make_config(str(tmp_path), dataset='folder', image_size=8, data_workers=2)
  assert_same_batches(
      take(data.train_iterator(workers, local_batch_size=4, start_step=4), 3), reference[4:7]
  )


@pytest.mark.parametrize('process_count', [2, 3])
def test_folder_shards_are_disjoint_and_cover_the_split(image_folder, process_count):
  root, _ = image_folder
  config = make_config(root, dataset='folder', image_size=12)

  def real_rows(process_index, count):
    batches = list(
        data.eval_iterator(
            config, 'test', local_batch_size=4, process_index=process_index, process_count=count
        )
    )
    rows = collections.Counter()
    for b in batches:
      rows += multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']])
    return len(batches), rows

  _, everything = real_rows(0, 1)
  shards = [real_rows(i, process_count) for i in range(process_count)]
  assert len({num_batches for num_batches, _ in shards}) == 1
  assert sum((rows for _, rows in shards), collections.Counter()) == everything


def _save(path, pixels, **kwargs):
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.fromarray(pixels).save(path, **kwargs)


def _eval_rows(config, split):
  """The multiset of (exact RGB pixels, label) of a split at its native size."""
  batches = list(data.eval_iterator(config, split, local_batch_size=64))
  return sum(
      (multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']]) for b in batches),
      collections.Counter(),
  )


def test_hidden_entries_are_not_data_and_subfolders_belong_to_their_class(tmp_path):
  rng = np.random.default_rng(0)
  want = collections.Counter()
  for label, name in enumerate(['cat', 'dog']):
    for path in ('0.png', 'sub/1.png', 'sub/deeper/2.png'):  # Images at any depth are the class's.
      pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
      _save(tmp_path / 'train' / name / path, pixels)
      want[(pixels.tobytes(), label)] += 1
    _save(tmp_path / 'test' / name / '0.png', rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    # Not data: hidden files and folders at every level, and a folder named as an image.
    (tmp_path / 'train' / name / '._0.png').write_bytes(b'AppleDouble')
    _save(tmp_path / 'train' / name / '.hidden' / '3.png', np.zeros((8, 8, 3), np.uint8))
    _save(
        tmp_path / 'train' / name / 'sub' / '.ipynb_checkpoints' / '4.png',
        np.zeros((8, 8, 3), np.uint8),
    )
    (tmp_path / 'train' / name / 'folder.png').mkdir()
  for split in ('train', 'test'):  # Jupyter's checkpoints folder beside the class folders.
    _save(tmp_path / split / '.ipynb_checkpoints' / '0.png', np.zeros((8, 8, 3), np.uint8))
  config = make_config(str(tmp_path), dataset='folder')
  info = data.get_info(config)
  assert info.class_names == ('cat', 'dog') and (info.num_train, info.num_eval) == (6, 2)
  assert _eval_rows(config, 'train') == want
  # A class's own images first, then each sub-folder's: sorted, whatever order the disk lists them in.
  assert folder.image_files(str(tmp_path / 'train' / 'cat')) == [
      '0.png',
      'sub/1.png',
      'sub/deeper/2.png',
  ]


def test_images_of_formats_not_read_are_warned_of_once_per_extension(tmp_path, caplog, monkeypatch):
  # An iPhone's .heic photos are images PIL does not read: left out without a word, a class of them
  # would be missing from the run.
  monkeypatch.setattr(folder, '_warned_extensions', set())
  for name in ('cat', 'dog'):
    _save(tmp_path / 'train' / name / '0.png', np.zeros((8, 8, 3), np.uint8))
    _save(tmp_path / 'train' / name / '1.tif', np.zeros((8, 8, 3), np.uint8))  # PIL reads TIFF.
    for i in range(3):
      (tmp_path / 'train' / name / f'{i}.HEIC').write_bytes(b'not read')
  assert folder.image_files(str(tmp_path / 'train' / 'cat')) == [
      '0.png',
      '1.tif',
  ]
  folder.image_files(str(tmp_path / 'train' / 'dog'))
  warnings = [
      r.getMessage() for r in caplog.records if '.heic files are not read' in r.getMessage()
  ]
  assert len(warnings) == 1 and 'convert them' in warnings[0], caplog.text


class _CloudPath:
  """etils.epath.Path on a bucket: a listing says nothing of what an entry is; each is_dir() is a
  request, recorded in `asked`."""

  listings = {
      'gs://b/train/cat': ['1.png', 'sub', '5.TIF', 'notes.txt', '6.heic'],
      'gs://b/train/cat/sub': ['2.JPG', '.x.png', '.hidden'],
  }
  asked = []

  def __init__(self, path: str):
    self._path = path
    self.name = path.rsplit('/', 1)[-1]

  def iterdir(self):
    return [_CloudPath(f'{self._path}/{name}') for name in self.listings[self._path]]

  def is_dir(self) -> bool:
    self.asked.append(self._path)
    return self._path in self.listings


def test_a_cloud_listing_costs_no_request_per_image(monkeypatch):
  # A name with an image's extension (or one of a format not read) is taken for a file unasked.
  monkeypatch.setattr(folder.epath, 'Path', _CloudPath)
  monkeypatch.setattr(_CloudPath, 'asked', [])
  assert folder.image_files('gs://b/train/cat') == [
      '1.png',
      '5.TIF',
      'sub/2.JPG',
  ]
  assert _CloudPath.asked == [
      'gs://b/train/cat/sub',
      'gs://b/train/cat/notes.txt',
      'gs://b/train/cat/sub/.hidden',
  ]


@pytest.mark.parametrize(
    'fmt, kwargs',
    [
        ('JPEG', dict(quality=90)),
        ('JPEG', dict(quality=75, subsampling=0)),
        ('PNG', {}),
        ('BMP', {}),
        ('GIF', {}),
        ('WEBP', dict(lossless=True)),
        ('WEBP', dict(quality=80)),
    ],
)
def test_each_listed_format_decodes_as_pil_decodes_it(fmt, kwargs):
  # Photo-like pixels (smooth, with noise), where JPEG's DCT rounding shows.
  y, x = np.mgrid[0:48, 0:64]
  smooth = np.stack([np.sin(x / 7) * 90 + 128, np.cos(y / 9) * 90 + 128, (x * 3 + y) % 256], -1)
  pixels = np.clip(smooth + np.random.default_rng(0).normal(0, 20, smooth.shape), 0, 255).astype(
      np.uint8
  )
  encoded = io.BytesIO()
  Image.fromarray(pixels).save(encoded, format=fmt, **kwargs)
  assert f'.{fmt.lower()}' in data_images.IMAGE_EXTENSIONS  # A folder lists it.
  want = np.asarray(Image.open(io.BytesIO(encoded.getvalue())).convert('RGB'))
  got = data_images.decode(encoded.getvalue())
  assert got.dtype == np.uint8 and got.shape == (48, 64, 3)
  np.testing.assert_array_equal(got, want)


def test_a_class_of_webp_images_trains(tmp_path):
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for i in range(4):
      _save(tmp_path / split / 'cat' / f'{i}.png', rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
      _save(
          tmp_path / split / 'dog' / f'{i}.WEBP',
          rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
          lossless=True,
      )
  config = make_config(str(tmp_path), dataset='folder')
  assert data.get_info(config).num_train == 8
  labels = np.concatenate(
      [b['label'] for b in take(data.train_iterator(config, local_batch_size=4), 4)]
  )
  assert np.bincount(labels).tolist() == [8, 8]


def test_an_empty_class_folder_is_refused_in_train_and_fine_in_eval(tmp_path):
  for split in ('train', 'test'):
    _save(tmp_path / split / 'cat' / '0.png', np.zeros((8, 8, 3), np.uint8))
  (tmp_path / 'test' / 'dog').mkdir()
  (tmp_path / 'train' / 'dog').mkdir()
  (tmp_path / 'train' / 'dog' / 'notes.txt').write_text('no image')
  _save(tmp_path / 'train' / 'dog' / '.ipynb_checkpoints' / '0.png', np.zeros((8, 8, 3), np.uint8))
  config = make_config(str(tmp_path), dataset='folder')
  expect_error(
      config,
      rf"^Class folders of {tmp_path}/train without images: 'dog'; put "
      'images in each or remove it$',
  )
  _save(tmp_path / 'train' / 'dog' / '0.png', np.zeros((8, 8, 3), np.uint8))
  info = data.get_info(config)
  assert info.class_names == ('cat', 'dog') and (info.num_train, info.num_eval) == (2, 1)


def _garbage_folder(root, train_garbage, test_garbage, classes=('cat', 'dog')):
  """root/{train,test}/<class>/ with 4 PNGs a class, or 4 files of garbage in the named classes."""
  for split, garbage in [('train', train_garbage), ('test', test_garbage)]:
    for name in classes:
      for i in range(4):
        if name in garbage:  # What a git-lfs checkout without `git lfs pull` holds.
          (root / split / name).mkdir(parents=True, exist_ok=True)
          (root / split / name / f'{i}.png').write_bytes(
              b'version https://git-lfs.github.com/spec/v1\n'
          )
        else:
          _save(root / split / name / f'{i}.png', np.zeros((8, 8, 3), np.uint8))
  return make_config(str(root), dataset='folder')


def test_a_split_without_a_readable_image_is_refused_before_the_run_writes(tmp_path):
  lfs_fix = r'\(a git-lfs pointer, not the image\); check that they are images \(a git-lfs checkout needs '
  config = _garbage_folder(tmp_path / 'a', train_garbage=('cat', 'dog'), test_garbage=())
  expect_error(
      config,
      rf"^No image of split 'train' decodes: none of 6 sampled, e.g. "
      rf'{tmp_path}/a/train/cat/0.png {lfs_fix}`git lfs pull`\)$',
  )
  # A run stops there, before it writes anything (an endless train stream would skip every file).
  run_config = helpers.load_config(
      'demo', {**helpers.TINY, 'dataset': 'folder', 'data_dir': config.data_dir}
  )
  with pytest.raises(ValueError, match="No image of split 'train' decodes"):
    train_setup.prepare(run_config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()

  config = _garbage_folder(tmp_path / 'b', train_garbage=(), test_garbage=('cat', 'dog'))
  expect_error(config, rf"^No image of split 'test' decodes: .* e.g. {tmp_path}/b/test/cat/0.png")
  # The reason is the decoder's own where a file is not a git-lfs pointer.
  (tmp_path / 'b' / 'test' / 'cat' / '0.png').write_bytes(b'\x89PNG truncated')
  expect_error(config, rf'e.g. {tmp_path}/b/test/cat/0.png \(not an image format PIL reads\)')


def test_a_train_class_without_a_readable_image_is_refused(tmp_path):
  config = _garbage_folder(tmp_path / 'a', train_garbage=('dog',), test_garbage=('dog',))
  expect_error(
      config,
      rf"^Class 'dog' has no readable train image: none of its 4 decodes, e.g. "
      rf'{tmp_path}/a/train/dog/0.png \(a git-lfs pointer, not the image\); check .*, or remove the '
      'class folder$',
  )
  # One it did not sample decodes: the class trains on it (removing the folder would lose it).
  from vit_jax.data import readable  # pylint: disable=g-import-not-at-top

  dog = tmp_path / 'a' / 'train' / 'dog'
  names = sorted(os.listdir(dog))
  sampled = readable.spread(names, readable._PROBE_PER_CLASS)  # pylint: disable=protected-access
  (unsampled,) = set(names) - set(sampled)
  _save(dog / unsampled, np.zeros((8, 8, 3), np.uint8))
  assert data.get_info(config).num_train == 8
  # In the eval split it is only skipped, each file named once (as any unreadable file).
  config = _garbage_folder(tmp_path / 'b', train_garbage=(), test_garbage=('dog',))
  assert data.get_info(config).num_eval == 8


def test_the_readability_probe_decodes_a_bounded_sample(tmp_path, monkeypatch):
  classes = [f'c{i:03d}' for i in range(100)]
  for split in ('train', 'test'):
    for name in classes:
      for i in range(5):
        _save(tmp_path / split / name / f'{i}.png', np.zeros((2, 2, 3), np.uint8))
  probed = []
  why_unreadable = readable._why_unreadable
  monkeypatch.setattr(
      readable,
      '_why_unreadable',
      lambda path, read: probed.append(path) or why_unreadable(path, read),
  )
  data.get_info(make_config(str(tmp_path), dataset='folder'))
  # 3 files of each of 64 classes a split, spread over the sorted ones: the same on every run.
  assert len(probed) == 2 * 64 * 3 and len(set(probed)) == len(probed)
  train = sorted(p for p in probed if '/train/' in p)
  assert train[:6] == [f'{tmp_path}/train/{c}/{i}.png' for c in ('c000', 'c001') for i in (0, 1, 3)]


def test_the_readability_probe_reads_a_jpeg_at_an_eighth_of_its_size(tmp_path, jpeg_draft_scales):
  """Its errors lie in the bitstream, read whole all the same: a folder of large photos starts
  without decoding hundreds of them at full size."""
  photo = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      _save(tmp_path / split / name / '0.jpg', photo)
  data.get_info(make_config(str(tmp_path), dataset='folder'))
  assert jpeg_draft_scales == [8] * 4


# Errors: one line, naming the fix.


def expect_error(config, match):
  with pytest.raises(ValueError, match=match) as e:
    data.get_info(config)
  assert '\n' not in str(e.value)


def test_unknown_dataset(data_dir):
  expect_error(
      make_config(data_dir, dataset='foo'),
      rf"^Unknown dataset 'foo': tensorflow_datasets has no builder of that name and none is "
      rf"prepared in {data_dir}: set config.data_dir to where it is prepared, or use 'digits' ",
  )


def test_unknown_vtab_task_names_the_tasks(data_dir):
  expect_error(
      make_config(data_dir, dataset='vtab/cifar1000'),
      r"^Unknown VTAB task 'vtab/cifar1000': use one of vtab/caltech101, vtab/cifar100, .*vtab/svhn",
  )


def test_tfds_dataset_not_prepared(tmp_path):
  expect_error(
      make_config(str(tmp_path), dataset='cifar10'),
      rf"'cifar10' is not prepared in {tmp_path}: run `tfds build cifar10 --data_dir=",
  )


def test_bad_tfds_version(tmp_path):
  expect_error(
      make_config(str(tmp_path), dataset='cifar10:0.0.1'), r"Cannot load .*'cifar10:0.0.1'"
  )


def test_unknown_split(data_dir):
  # A run's split names the config field to set.
  expect_error(
      make_config(data_dir, eval_split='validation'),
      r"^Bad split 'validation': Unknown split 'validation'\. "
      r"Should be one of \['train', 'test'\]; set --config\.eval_split to one of "
      r"\['train', 'test'\] or a slice of one, e\.g\. 'train\[:90%\]'$",
  )
  expect_error(
      make_config(data_dir, train_split='train[:200%]'),
      r"^Bad split 'train\[:200%\]': Error parsing split "
      r"'train\[:200%\]'\. See format at: .*; set --config\.train_split to one of ",
  )
  for split, match in [
      ('validation', r"Bad split 'validation'.*'test'"),
      ('train[:200%]', r"Bad split 'train\[:200%\]'"),
  ]:
    with pytest.raises(ValueError, match=match) as e:
      data.num_examples(make_config(data_dir), split)
    assert '\n' not in str(e.value)


def test_folder_errors(tmp_path, image_folder):
  expect_error(make_config(None, dataset='folder'), r"'folder' needs config.data_dir")
  expect_error(make_config(str(tmp_path), dataset='folder'), rf'{tmp_path}/train does not exist')
  expect_error(
      make_config(str(tmp_path / 'nothing'), dataset='folder'),
      rf'^config.data_dir={tmp_path}/nothing does not exist: set it to a folder of split folders$',
  )
  (tmp_path / 'a_file').write_text('')  # It said "does not exist".
  expect_error(
      make_config(str(tmp_path / 'a_file'), dataset='folder'),
      rf'^config.data_dir={tmp_path}/a_file is a file: set it to a folder of split folders$',
  )
  root, _ = image_folder
  # A missing split names the folders there are, and the field that picks one.
  expect_error(
      make_config(root, dataset='folder', eval_split='val'),
      rf"^Image folder {root}/val does not exist; {root} holds \['test', 'train'\]: name one with "
      r'--config.eval_split=test \(',
  )
  expect_error(
      make_config(root, dataset='folder', train_split='tr'),
      rf'{root}/tr does not exist; .*: name one with --config.train_split=train \(',
  )
  # A data_dir that is one split's class folders (a common slip) is named as such.
  expect_error(
      make_config(f'{root}/train', dataset='folder'),
      rf"the sub-folders of {root}/train hold images \(\['cat', 'dog'\]\): they are one split's "
      rf'class folders; set config.data_dir to the folder that holds train/',
  )
  for split in ('train_split', 'eval_split'):  # A tfds slice is no folder: name the folder to make.
    expect_error(
        make_config(root, dataset='folder', **{split: 'train[:90%]'}),
        rf'^Image folder splits are sub-folder names, not slices: {root} has no train\[:90%\]/; '
        rf'make a folder of class folders \(e.g. {root}/val/\), then --config.eval_split=val$',
    )
  (tmp_path / 'train' / 'cat').mkdir(parents=True)
  (tmp_path / 'test').mkdir()
  expect_error(
      make_config(str(tmp_path), dataset='folder'), rf'No .* images .* of {tmp_path}/train'
  )
  Image.new('RGB', (8, 8)).save(tmp_path / 'train' / 'cat' / 'a.png')
  (tmp_path / 'test' / 'cow').mkdir()
  expect_error(
      make_config(str(tmp_path), dataset='folder'), rf'{tmp_path}/test/cow has no counterpart'
  )


def test_bad_preprocessing(data_dir):
  expect_error(make_config(data_dir, pp=dict(crop='center')), r"Unknown config.pp.crop 'center'")
  expect_error(make_config(data_dir, pp=dict(crop='inception', min_area=0.0)), r'min_area')
  expect_error(make_config(data_dir, pp=dict(crop='random', pad=-1)), r'config.pp.pad=-1 must be')
  data.get_info(make_config(data_dir, pp=dict(crop='resize', min_area=0.0)))  # A crop's own fields.
  expect_error(make_config(data_dir, image_size=0), r'image_size')
