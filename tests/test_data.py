"""Tests of vit_jax.data: the bundled digits, image folders, determinism, sharding, errors."""
import collections
import io
import os
import subprocess
import sys
import threading

from etils import epath
import numpy as np
from PIL import Image
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import helpers
from helpers import as_uint8, assert_same_batches, multiset, take
from vit_jax import data
from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data import unreadable
from vit_jax.data.as_written import as_written
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


def test_digits_tfds_files_hold_exactly_the_split(data_dir):
  config = make_config(data_dir)
  batches = list(data.eval_iterator(config, 'test', local_batch_size=360))
  assert len(batches) == 1 and batches[0]['mask'].all()
  got = multiset(as_uint8(batches[0]['image']), batches[0]['label'])
  assert got == multiset(*digits.split_arrays()['test'])


def test_concurrent_prepare_is_safe(tmp_path, monkeypatch):
  """Two preparations of one data_dir that overlap for sure: both generate, one rename wins."""
  both_generating = threading.Barrier(2, timeout=60)
  generate = digits.VitJaxDigits._split_generators

  def generate_together(self, dl_manager):
    both_generating.wait()
    return generate(self, dl_manager)

  monkeypatch.setattr(digits.VitJaxDigits, '_split_generators', generate_together)
  results, errors = [], []

  def prepare():
    try:
      results.append(digits.prepared_builder(str(tmp_path)).info.splits['train'].num_examples)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=prepare) for _ in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors and results == [1437, 1437]
  assert os.listdir(tmp_path / 'vit_jax_digits') == ['1.0.0']  # No temporary folder left behind.


def test_as_written_traces_a_function_without_autograph():
  """What the pipeline's functions are traced with (as_written.py): a Python `if` on a tensor, which
  AutoGraph would rewrite into a graph conditional, is an error."""
  def sign(x):
    if x > 0:
      return x
    return -x
  assert list(tf.data.Dataset.range(-1, 2).map(sign).as_numpy_iterator()) == [1, 0, 1]
  with pytest.raises(TypeError, match='bool'):
    tf.data.Dataset.range(-1, 2).map(as_written(sign))


_COMMAND_IMPORTS = """
import os
import sys
from vit_jax import data
onednn = os.environ.get('TF_ENABLE_ONEDNN_OPTS')
from vit_jax import export, fewshot, main, predict
from vit_jax.train import loop, setup
heavy = sorted({'keras', 'sklearn', 'matplotlib'} & sys.modules.keys())
import tensorflow as tf
print(heavy, onednn, tf.keras.layers.Dense(2)(tf.ones((1, 3))).shape)
"""


def test_vit_jax_loads_tensorflow_without_keras_and_onednn():
  """Keras, scikit-learn and matplotlib are 1.5 s of every command's start (vit_jax/data/__init__.py),
  and tf.keras still works; oneDNN stays off also where vit_jax is imported as a library
  (vit_jax/quiet.py)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith('TF_')}
  run = subprocess.run([sys.executable, '-c', _COMMAND_IMPORTS], cwd=helpers.REPO, capture_output=True,
                       text=True, env=env, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert run.stdout.split('\n')[-2] == '[] 0 (1, 2)', run.stdout


# Train batches.

@pytest.mark.parametrize('crop', list(preprocess.CROPS))
def test_train_batches(data_dir, crop):
  pad = 2 if crop == 'random' else 0  # Only that crop pads.
  config = make_config(data_dir, image_size=16, pp=dict(crop=crop, pad=pad, flip=True))
  for batch in take(data.train_iterator(config, local_batch_size=32), 3):
    assert set(batch) == {'image', 'label'}
    assert batch['image'].shape == (32, 16, 16, 3) and batch['image'].dtype == np.float32
    assert batch['label'].shape == (32,) and batch['label'].dtype == np.int32
    assert -1 <= batch['image'].min() < 0 < batch['image'].max() <= 1
    assert 0 <= batch['label'].min() and batch['label'].max() <= 9


def test_iterators_run_without_the_autotuning_thread(data_dir, monkeypatch):
  # Destroying an iterator joins tf.data's autotuning thread, which can sleep out its period (up to a
  # minute) first: every iterator is made with autotuning off and all usable cores per parallel op.
  options = []
  as_numpy_iterator = tf.data.Dataset.as_numpy_iterator
  monkeypatch.setattr(tf.data.Dataset, 'as_numpy_iterator',
                      lambda ds: options.append(ds.options()) or as_numpy_iterator(ds))
  config = make_config(data_dir)
  next(data.train_iterator(config, local_batch_size=8))
  next(data.eval_iterator(config, 'test', local_batch_size=8))
  assert [(o.autotune.enabled, o.deterministic) for o in options] == [(False, True)] * 2
  assert [o.autotune.initial_parallelism for o in options] == [len(os.sched_getaffinity(0))] * 2


def test_each_epoch_is_a_new_permutation_of_the_split(data_dir):
  # 1437 = 3 * 479, so three batches are one epoch. A window of 500 shuffles each 500-block.
  for shuffle_buffer in (50_000, 500):
    config = make_config(data_dir, shuffle_buffer=shuffle_buffer)
    batches = take(data.train_iterator(config, local_batch_size=479), 6)
    epochs = [batches[:3], batches[3:]]
    images = [np.concatenate([as_uint8(b['image']) for b in epoch]) for epoch in epochs]
    labels = [np.concatenate([b['label'] for b in epoch]) for epoch in epochs]
    for x, y in zip(images, labels):
      assert multiset(x, y) == multiset(*digits.split_arrays()['train'])
    assert not np.array_equal(labels[0], labels[1])


@pytest.mark.parametrize('pp,shuffle_buffer', [
    (dict(crop='inception', flip=True), 50_000),
    (dict(crop='random', pad=1, flip=True), 500),
    (dict(crop='resize', flip=False), 1),
])
def test_resume_is_bitwise_identical(data_dir, pp, shuffle_buffer):
  config = make_config(data_dir, image_size=12, shuffle_buffer=shuffle_buffer, pp=pp)
  # 100 does not divide 1437: batch 14 spans epochs 0 and 1, batch 28 spans epochs 1 and 2.
  for process_index, process_count in [(0, 1), (1, 2)]:
    kwargs = dict(local_batch_size=100, process_index=process_index, process_count=process_count)
    reference = take(data.train_iterator(config, **kwargs), 32)
    for start in (5, 14, 29):
      resumed = take(data.train_iterator(config, start_step=start, **kwargs), 3)
      assert_same_batches(resumed, reference[start:start + 3])


def test_augmentation_depends_on_seed_and_host(data_dir):
  config = make_config(data_dir, pp=dict(crop='inception', flip=True))
  a = next(data.train_iterator(config, local_batch_size=64))
  b = next(data.train_iterator(make_config(data_dir, seed=1, pp=dict(crop='inception', flip=True)),
                               local_batch_size=64))
  assert not np.array_equal(a['label'], b['label'])
  host0, host1 = (next(data.train_iterator(config, local_batch_size=64, process_index=i,
                                           process_count=2)) for i in range(2))
  assert not np.array_equal(host0['image'], host1['image'])


def test_crops_are_wired(data_dir):
  """An inception crop of the whole area and a random crop without padding are plain resizes; a
  flip mirrors some images and leaves the others."""
  def first_batch(**pp):
    config = make_config(data_dir, image_size=16, pp=pp)
    return next(data.train_iterator(config, local_batch_size=128))['image']

  resized = first_batch(crop='resize', flip=False)
  np.testing.assert_array_equal(first_batch(crop='inception', min_area=1.0, flip=False), resized)
  np.testing.assert_array_equal(first_batch(crop='random_resized', min_area=1.0, flip=False), resized)
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
    batch = next(data.train_iterator(config, local_batch_size=shard_size,
                                     process_index=process_index, process_count=process_count))
    per_host += multiset(as_uint8(batch['image']), batch['label'])
  assert per_host == multiset(*digits.split_arrays()['train'])


@pytest.mark.parametrize('pp', [dict(crop='inception', flip=True), dict(crop='resize')])
def test_global_batches_do_not_depend_on_the_number_of_hosts(data_dir, pp):
  config = make_config(data_dir, data_shards=4, shuffle_buffer=500, pp=pp)
  one_host = take(data.train_iterator(config, local_batch_size=32, start_step=40), 3)
  for process_count in (2, 4):
    hosts = [take(data.train_iterator(config, local_batch_size=32 // process_count, start_step=40,
                                      process_index=i, process_count=process_count), 3)
             for i in range(process_count)]
    assembled = [{k: np.concatenate([host[step][k] for host in hosts]) for k in ('image', 'label')}
                 for step in range(3)]
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
    batches = list(data.eval_iterator(config, 'test', local_batch_size=batch,
                                      process_index=process_index, process_count=process_count))
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
  digits.VitJaxDigits(data_dir=path, file_format='array_record').download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return path


@pytest.mark.parametrize('file_format', ['tfrecord', 'array_record'])
def test_tfds_slices_hold_out_a_minival(data_dir, array_record_dir, file_format):
  """train_split 'train[:90%]' and eval_split 'train[90%:]' cut the train split in two disjoint
  parts, for sharded training, sharded eval and the counts alike."""
  where = dict(data_dir=data_dir) if file_format == 'tfrecord' else dict(
      dataset='vit_jax_digits', data_dir=array_record_dir)
  config = make_config(train_split='train[:90%]', eval_split='train[90%:]', **where)
  info = data.get_info(config)
  assert (info.num_train, info.num_eval) == (1293, 144)
  assert data.num_examples(config, 'train[90%:]') == 144

  def eval_rows(split, process_count):
    rows = collections.Counter()
    for process_index in range(process_count):
      for b in data.eval_iterator(config, split, local_batch_size=100,
                                  process_index=process_index, process_count=process_count):
        rows += multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']])
    return rows

  held_in, held_out = eval_rows('train[:90%]', 3), eval_rows('train[90%:]', 2)
  assert not held_in & held_out
  assert held_in + held_out == multiset(*digits.split_arrays()['train'])
  trained = collections.Counter()
  for process_index in range(2):
    # One batch of the host's shard size is one epoch of its shard of the slice.
    batch = next(data.train_iterator(config, local_batch_size=len(range(process_index, 1293, 2)),
                                     process_index=process_index, process_count=2))
    trained += multiset(as_uint8(batch['image']), batch['label'])
  assert trained == held_in


def test_eval_resize_matches_pil_bilinear(data_dir):
  native = next(data.eval_iterator(make_config(data_dir), 'test', local_batch_size=360))
  upscaled = next(data.eval_iterator(make_config(data_dir, image_size=20), 'test',
                                     local_batch_size=360))
  for small, big in zip(as_uint8(native['image'][:50]), upscaled['image'][:50]):
    reference = np.asarray(Image.fromarray(small).resize((20, 20), Image.BILINEAR), np.float32)
    # PIL rounds to uint8 after each of its two 1-D passes: less than one level apart.
    np.testing.assert_allclose((big + 1) * 127.5, reference, atol=1.0)


# Label features, and tfds datasets prepared unshuffled.

class CoarseDigits(digits.VitJaxDigits, skip_registration=True):
  """The digits with a 2-class 'coarse_label' (small: 0-4, large: 5-9) beside their 10-class 'label',
  as cifar100's 'coarse_label', and a Sequence of ClassLabel 'label_set' (ImageNet-ReaL's layout)."""
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self) -> tfds.core.DatasetInfo:
    classes = [str(d) for d in range(10)]
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(8, 8, 3)),
        'label': tfds.features.ClassLabel(names=classes),
        'coarse_label': tfds.features.ClassLabel(names=['small', 'large']),
        'label_set': tfds.features.Sequence(tfds.features.ClassLabel(names=classes)),
    }))

  def _generate_examples(self, images, labels):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {'image': image, 'label': label, 'coarse_label': int(label >= 5), 'label_set': [label]}


class SortedDigits(digits.VitJaxDigits, skip_registration=True):
  """The digits in class order, prepared without shuffling (builder.info.disable_shuffling), as
  some tfds datasets are."""
  pkg_dir_path = epath.Path(__file__).parent

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
        'image': tfds.features.Image(shape=(8, 8, 3)),
        'label': tfds.features.ClassLabel(names=[str(d) for d in range(10)]),
    }), disable_shuffling=True)

  def _generate_examples(self, images, labels):
    in_class_order = np.argsort(labels, kind='stable')
    return super()._generate_examples(images[in_class_order], labels[in_class_order])


def _prepare(builder_class, path: str, file_format: str = 'tfrecord') -> str:
  builder_class(data_dir=path, file_format=file_format).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return path


@pytest.fixture(scope='module')
def coarse_dir(tmp_path_factory):
  return _prepare(CoarseDigits, str(tmp_path_factory.mktemp('coarse_digits')))


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
  assert multiset(as_uint8(epoch['image']), epoch['label']) == multiset(train_images,
                                                                       _coarse(train_labels))
  # An evaluation that names no label feature (the eval split's, few-shot's) reads the run's...
  test_images, test_labels = digits.split_arrays()['test']
  batch, = data.eval_iterator(config, 'test', local_batch_size=360)
  assert multiset(as_uint8(batch['image']), batch['label']) == multiset(test_images,
                                                                       _coarse(test_labels))
  # ...and one that names another reads that one.
  batch, = data.eval_iterator(config, 'test', local_batch_size=360, label_feature='label')
  assert multiset(as_uint8(batch['image']), batch['label']) == multiset(test_images, test_labels)


def test_a_tiny_run_on_a_coarse_label_has_its_classes(tmp_path, coarse_dir):
  config = helpers.load_config('demo', {**helpers.TINY, 'dataset': 'coarse_digits',
                                       'data_dir': coarse_dir, 'label_feature': 'coarse_label',
                                       'total_steps': 4, 'eval_every_steps': 4})
  config.evals.minival = dict(type='classification', split='train[:100]', every_steps=4)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert setup.info.num_classes == 2
  metrics = loop.train_and_evaluate(setup)
  # Top-5 of 2 classes holds every label of 2 classes; a label of the 10 digits would miss it.
  assert metrics['eval_top5'] == metrics['minival_top5'] == 1.0
  assert np.isfinite(metrics['eval_loss'])


def test_label_feature_errors(coarse_dir, image_folder):
  expect_error(make_config(coarse_dir, dataset='coarse_digits', label_feature='fine_label'),
               r"^Dataset 'coarse_digits' has no ClassLabel \(or Sequence of ClassLabel\) feature "
               r"'fine_label': set --config.label_feature \(or the evaluator's label_feature\) to one "
               r"of its ClassLabel features \['coarse_label', 'label'\] or label sets \['label_set'\]$")
  label_sets = make_config(coarse_dir, dataset='coarse_digits', label_feature='label_set')
  error = (r"^config.label_feature='label_set' of dataset 'coarse_digits' is a set of classes an "
           r"image \(a Sequence of ClassLabel\), which a run cannot train on: set "
           r"--config.label_feature to one of \['coarse_label', 'label'\]")
  expect_error(label_sets, error)
  with pytest.raises(ValueError, match=error):
    data.train_iterator(label_sets, local_batch_size=8)
  root, _ = image_folder
  expect_error(make_config(root, dataset='folder', label_feature='coarse_label'),
               r"^An image folder has one class an image, not a label feature 'coarse_label'")


@pytest.fixture(scope='module')
def sorted_dirs(tmp_path_factory):
  """data_dirs of the digits in class order, prepared unshuffled as TFRecord and as ArrayRecord."""
  return {file_format: _prepare(SortedDigits, str(tmp_path_factory.mktemp(file_format)), file_format)
          for file_format in ('tfrecord', 'array_record')}


@pytest.mark.parametrize('dataset, file_format, shuffle_buffer, warns', [
    ('sorted_digits', 'tfrecord', 256, True),
    ('sorted_digits', 'tfrecord', 1437, False),  # A window of the whole split: a full permutation.
    ('sorted_digits', 'array_record', 256, False),  # Read by index in a global random order.
    ('vit_jax_digits', 'tfrecord', 256, False),  # Shuffled when tfds prepared it.
])
def test_unshuffled_tfrecord_files_read_through_a_small_window_warn(
    sorted_dirs, data_dir, caplog, dataset, file_format, shuffle_buffer, warns):
  where = data_dir if dataset == 'vit_jax_digits' else sorted_dirs[file_format]
  config = make_config(where, dataset=dataset, shuffle_buffer=shuffle_buffer)
  with caplog.at_level('WARNING'):
    next(data.train_iterator(config, local_batch_size=32))
  warnings = [r.getMessage() for r in caplog.records if 'disable_shuffling' in r.getMessage()]
  assert len(warnings) == int(warns)
  if warns:
    assert warnings[0].startswith("Dataset 'sorted_digits' was prepared without shuffling")
    assert 'raise --config.shuffle_buffer to >= 1437' in warnings[0]
    assert "file_format='array_record'" in warnings[0] and '\n' not in warnings[0]


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


def test_a_folder_is_listed_once_per_split_however_often_it_is_read(tmp_path, monkeypatch):
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      (tmp_path / split / name).mkdir(parents=True)
      Image.new('RGB', (8, 8)).save(tmp_path / split / name / '0.png')
  listed = collections.Counter()
  image_files = folder._image_files  # pylint: disable=protected-access
  monkeypatch.setattr(folder, '_image_files', lambda path: listed.update([path]) or image_files(path))
  config = make_config(str(tmp_path), dataset='folder', eval_batch_size=2)
  data.get_info(config)
  take(data.train_iterator(config, local_batch_size=2), 2)
  for _ in range(3):  # Three evaluations.
    assert len(list(data.eval_iterator(config, 'test', local_batch_size=2))) == 1
  assert listed == {str(tmp_path / split / name): 1 for split in ('train', 'test') for name in 'ab'}
  Image.new('RGB', (8, 8)).save(tmp_path / 'train' / 'a' / '1.png')
  assert data.get_info(config).num_train == 3  # The next run lists the folder again.


def test_folder_eval_skips_corrupt_file_with_warning(image_folder, caplog):
  root, pngs = image_folder
  config = make_config(root, dataset='folder', image_size=12)
  with caplog.at_level('WARNING'):
    batches = list(data.eval_iterator(config, 'test', local_batch_size=8))
  assert any('Skipping' in r.getMessage() and r.getMessage().endswith('/test/cat/corrupt.jpg')
             for r in caplog.records)
  assert len(batches) == data.num_eval_batches(21, local_batch_size=8) == 3
  mask = np.concatenate([b['mask'] for b in batches])
  images = as_uint8(np.concatenate([b['image'] for b in batches])[mask])
  labels = np.concatenate([b['label'] for b in batches])[mask]
  assert len(labels) == 20 and np.bincount(labels).tolist() == [10, 10]  # All but the corrupt one.
  # PNGs (and the greyscale PNG, as RGB) come through pixel-exact; the class is the folder's index.
  assert not pngs['test'] - multiset(images, labels)


def test_folder_train_skips_corrupt_file(image_folder, caplog):
  root, _ = image_folder
  config = make_config(root, dataset='folder', pp=dict(crop='inception', flip=True))
  with caplog.at_level('WARNING'):
    batches = take(data.train_iterator(config, local_batch_size=9), 6)  # Two epochs of 26 images.
  assert any(r.getMessage().endswith('/train/cat/corrupt.jpg') for r in caplog.records)
  labels = np.concatenate([b['label'] for b in batches])
  assert batches[0]['image'].shape == (9, 8, 8, 3) and set(labels) == {0, 1}


def test_folder_names_each_dropped_file_once_a_process(tmp_path, caplog):
  # Corrupt files first and last in the split's order: the last one's gap shows only at the next
  # batch (train) or at the first padding row (eval).
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name in ('a', 'b'):
      (tmp_path / split / name).mkdir(parents=True)
      for i in range(5):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
            tmp_path / split / name / f'{i}.png')
    (tmp_path / split / 'a' / '0_corrupt.jpg').write_bytes(b'not a jpeg')
    (tmp_path / split / 'b' / 'z_corrupt.png').write_bytes(b'\x89PNG truncated')
  config = make_config(str(tmp_path), dataset='folder', image_size=8)
  corrupt = {f'{split}/{path}' for split in ('train', 'test')
             for path in ('a/0_corrupt.jpg', 'b/z_corrupt.png')}

  def named(split):
    names = [r.getMessage().rsplit(str(tmp_path) + os.sep, 1)[-1] for r in caplog.records
             if r.getMessage().startswith('Skipping unreadable image file')]
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


def test_records_at_is_the_record_at_each_stream_position():
  values = tf.constant([f'record {i}' for i in range(37)])
  records = order.RandomAccess(37, lambda indices: {'record': tf.gather(values, indices)})
  seed = tf.constant([3, 4], tf.int64)
  stream = list(order.shuffled_stream(records, start=20, window_size=1, seed=seed).take(100))
  positions = tf.constant([int(e['position']) for e in stream], tf.int64)
  assert positions.numpy().tolist() == list(range(20, 120))
  assert (order.records_at(records, positions, seed)['record'].numpy().tolist()
          == [e['record'].numpy() for e in stream])


@pytest.mark.parametrize('process_count', [2, 3])
def test_folder_shards_are_disjoint_and_cover_the_split(image_folder, process_count):
  root, _ = image_folder
  config = make_config(root, dataset='folder', image_size=12)

  def real_rows(process_index, count):
    batches = list(data.eval_iterator(config, 'test', local_batch_size=4,
                                      process_index=process_index, process_count=count))
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
  return sum((multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']]) for b in batches),
             collections.Counter())


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
    _save(tmp_path / 'train' / name / 'sub' / '.ipynb_checkpoints' / '4.png', np.zeros((8, 8, 3), np.uint8))
    (tmp_path / 'train' / name / 'folder.png').mkdir()
  for split in ('train', 'test'):  # Jupyter's checkpoints folder beside the class folders.
    _save(tmp_path / split / '.ipynb_checkpoints' / '0.png', np.zeros((8, 8, 3), np.uint8))
  config = make_config(str(tmp_path), dataset='folder')
  info = data.get_info(config)
  assert info.class_names == ('cat', 'dog') and (info.num_train, info.num_eval) == (6, 2)
  assert _eval_rows(config, 'train') == want
  # A class's own images first, then each sub-folder's: sorted, whatever order the disk lists them in.
  assert folder._image_files(str(tmp_path / 'train' / 'cat')) == [  # pylint: disable=protected-access
      '0.png', 'sub/1.png', 'sub/deeper/2.png']


def test_images_of_formats_not_read_are_warned_of_once_per_extension(tmp_path, caplog, monkeypatch):
  # torchvision's ImageFolder reads a .tif through PIL; here it would be left out without a word.
  monkeypatch.setattr(folder, '_warned_extensions', set())
  for name in ('cat', 'dog'):
    _save(tmp_path / 'train' / name / '0.png', np.zeros((8, 8, 3), np.uint8))
    for i in range(3):
      Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / 'train' / name / f'{i}.tif')
  assert folder._image_files(str(tmp_path / 'train' / 'cat')) == ['0.png']  # pylint: disable=protected-access
  folder._image_files(str(tmp_path / 'train' / 'dog'))  # pylint: disable=protected-access
  warnings = [r.getMessage() for r in caplog.records if '.tif files are not read' in r.getMessage()]
  assert len(warnings) == 1 and 'convert them' in warnings[0], caplog.text


def test_a_cloud_listing_costs_no_request_per_image(monkeypatch):
  # Cloud storage marks folders with a trailing '/' in a listing; an image name is then a file.
  listings = {'gs://b/train/cat': ['1.png', 'sub/', 'dir.png/', '5.tif'],
              'gs://b/train/cat/sub': ['2.JPG', '.x.png'],
              'gs://b/train/cat/dir.png': ['3.webp']}
  asked = []
  monkeypatch.setattr(tf.io.gfile, 'listdir', lambda path: listings[path])
  monkeypatch.setattr(tf.io.gfile, 'isdir', lambda path: asked.append(path) or False)
  assert folder._image_files('gs://b/train/cat') == [  # pylint: disable=protected-access
      '1.png', 'dir.png/3.webp', 'sub/2.JPG']
  assert not asked


@pytest.mark.parametrize('fmt, kwargs', [
    ('JPEG', dict(quality=90)), ('JPEG', dict(quality=75, subsampling=0)), ('PNG', {}), ('BMP', {}),
    ('GIF', {}), ('WEBP', dict(lossless=True)), ('WEBP', dict(quality=80))])
def test_each_listed_format_decodes_as_pil_decodes_it(fmt, kwargs):
  # Photo-like pixels (smooth, with noise), where JPEG's DCT rounding shows.
  y, x = np.mgrid[0:48, 0:64]
  smooth = np.stack([np.sin(x / 7) * 90 + 128, np.cos(y / 9) * 90 + 128, (x * 3 + y) % 256], -1)
  pixels = np.clip(smooth + np.random.default_rng(0).normal(0, 20, smooth.shape), 0, 255).astype(np.uint8)
  encoded = io.BytesIO()
  Image.fromarray(pixels).save(encoded, format=fmt, **kwargs)
  assert f'.{fmt.lower()}' in folder.IMAGE_EXTENSIONS  # A folder lists it.
  want = np.asarray(Image.open(io.BytesIO(encoded.getvalue())).convert('RGB'))
  np.testing.assert_array_equal(preprocess.decode(tf.constant(encoded.getvalue())).numpy(), want)


def test_a_class_of_webp_images_trains(tmp_path):
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for i in range(4):
      _save(tmp_path / split / 'cat' / f'{i}.png', rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
      _save(tmp_path / split / 'dog' / f'{i}.WEBP', rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
            lossless=True)
  config = make_config(str(tmp_path), dataset='folder')
  assert data.get_info(config).num_train == 8
  labels = np.concatenate([b['label'] for b in take(data.train_iterator(config, local_batch_size=4), 4)])
  assert np.bincount(labels).tolist() == [8, 8]


def test_an_empty_class_folder_is_refused_in_train_and_fine_in_eval(tmp_path):
  for split in ('train', 'test'):
    _save(tmp_path / split / 'cat' / '0.png', np.zeros((8, 8, 3), np.uint8))
  (tmp_path / 'test' / 'dog').mkdir()
  (tmp_path / 'train' / 'dog').mkdir()
  (tmp_path / 'train' / 'dog' / 'notes.txt').write_text('no image')
  _save(tmp_path / 'train' / 'dog' / '.ipynb_checkpoints' / '0.png', np.zeros((8, 8, 3), np.uint8))
  config = make_config(str(tmp_path), dataset='folder')
  expect_error(config, rf"^Class folders of {tmp_path}/train without .jpg/.*/.webp images: 'dog'; put "
               'images in each or remove it$')
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
          (root / split / name / f'{i}.png').write_bytes(b'version https://git-lfs.github.com/spec/v1\n')
        else:
          _save(root / split / name / f'{i}.png', np.zeros((8, 8, 3), np.uint8))
  return make_config(str(root), dataset='folder')


def test_a_split_without_a_readable_image_is_refused_before_the_run_writes(tmp_path):
  lfs_fix = r'\(a git-lfs pointer, not the image\); check that they are images \(a git-lfs checkout needs '
  config = _garbage_folder(tmp_path / 'a', train_garbage=('cat', 'dog'), test_garbage=())
  expect_error(config, rf"^No image of split 'train' decodes: none of 6 sampled, e.g. "
               rf'{tmp_path}/a/train/cat/0.png {lfs_fix}`git lfs pull`\)$')
  # A run stops there, before it writes anything (an endless train stream would skip every file).
  run_config = helpers.load_config('demo', {**helpers.TINY, 'dataset': 'folder',
                                            'data_dir': config.data_dir})
  with pytest.raises(ValueError, match="No image of split 'train' decodes"):
    train_setup.prepare(run_config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()

  config = _garbage_folder(tmp_path / 'b', train_garbage=(), test_garbage=('cat', 'dog'))
  expect_error(config, rf"^No image of split 'test' decodes: .* e.g. {tmp_path}/b/test/cat/0.png")
  # The reason is the decoder's own where a file is not a git-lfs pointer.
  (tmp_path / 'b' / 'test' / 'cat' / '0.png').write_bytes(b'\x89PNG truncated')
  expect_error(config, rf'e.g. {tmp_path}/b/test/cat/0.png \(Unknown image file format. One of JPEG, ')


def test_a_train_class_without_a_readable_image_is_refused(tmp_path):
  config = _garbage_folder(tmp_path / 'a', train_garbage=('dog',), test_garbage=('dog',))
  expect_error(config, rf"^Class 'dog' has no readable train image: none of 3 sampled decodes, e.g. "
               rf'{tmp_path}/a/train/dog/0.png \(a git-lfs pointer, not the image\); check .*, or remove the '
               'class folder$')
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
  why_unreadable = folder._why_unreadable  # pylint: disable=protected-access
  monkeypatch.setattr(folder, '_why_unreadable', lambda path: probed.append(path) or why_unreadable(path))
  data.get_info(make_config(str(tmp_path), dataset='folder'))
  # 3 files of each of 64 classes a split, spread over the sorted ones: the same on every run.
  assert len(probed) == 2 * 64 * 3 and len(set(probed)) == len(probed)
  train = sorted(p for p in probed if '/train/' in p)
  assert train[:6] == [f'{tmp_path}/train/{c}/{i}.png' for c in ('c000', 'c001') for i in (0, 1, 3)]


# Errors: one line, naming the fix.

def expect_error(config, match):
  with pytest.raises(ValueError, match=match) as e:
    data.get_info(config)
  assert '\n' not in str(e.value)


def test_unknown_dataset(data_dir):
  expect_error(make_config(data_dir, dataset='foo'),
               r"^Unknown dataset 'foo': use 'digits' \(bundled, offline\), 'folder' .*imagenet21k")


def test_tfds_dataset_not_prepared(tmp_path):
  expect_error(make_config(str(tmp_path), dataset='cifar10'),
               rf"'cifar10' is not prepared in {tmp_path}: run `tfds build cifar10 --data_dir=")


def test_bad_tfds_version(tmp_path):
  expect_error(make_config(str(tmp_path), dataset='cifar10:0.0.1'), r"Cannot load .*'cifar10:0.0.1'")


def test_unknown_split(data_dir):
  # A run's split names the config field to set.
  expect_error(make_config(data_dir, eval_split='validation'),
               r"^Bad split 'validation' for dataset 'vit_jax_digits': Unknown split 'validation'\. "
               r"Should be one of \['train', 'test'\]; set --config\.eval_split to one of "
               r"\['train', 'test'\] or a slice of one, e\.g\. 'train\[:90%\]'$")
  expect_error(make_config(data_dir, train_split='train[:200%]'),
               r"^Bad split 'train\[:200%\]' for dataset 'vit_jax_digits': Error parsing split "
               r"'train\[:200%\]'\. See format at: .*; set --config\.train_split to one of ")
  for split, match in [('validation', r"Bad split 'validation'.*'test'"),
                       ('train[:200%]', r"Bad split 'train\[:200%\]'")]:
    with pytest.raises(ValueError, match=match) as e:
      data.num_examples(make_config(data_dir), split)
    assert '\n' not in str(e.value)


def test_folder_errors(tmp_path, image_folder):
  expect_error(make_config(None, dataset='folder'), r"'folder' needs config.data_dir")
  expect_error(make_config(str(tmp_path), dataset='folder'),
               rf'{tmp_path}/train does not exist')
  root, _ = image_folder
  expect_error(make_config(root, dataset='folder', eval_split='val'), rf'{root}/val does not exist')
  for split in ('train_split', 'eval_split'):  # A tfds slice is no folder: name the folder to make.
    expect_error(make_config(root, dataset='folder', **{split: 'train[:90%]'}),
                 rf'^Image folder splits are sub-folder names, not slices: {root} has no train\[:90%\]/; '
                 rf'make a folder of class folders \(e.g. {root}/val/\), then --config.eval_split=val$')
  (tmp_path / 'train' / 'cat').mkdir(parents=True)
  (tmp_path / 'test').mkdir()
  expect_error(make_config(str(tmp_path), dataset='folder'), rf'No .* images .* of {tmp_path}/train')
  Image.new('RGB', (8, 8)).save(tmp_path / 'train' / 'cat' / 'a.png')
  (tmp_path / 'test' / 'cow').mkdir()
  expect_error(make_config(str(tmp_path), dataset='folder'), rf'{tmp_path}/test/cow has no counterpart')


def test_bad_preprocessing(data_dir):
  expect_error(make_config(data_dir, pp=dict(crop='center')), r"Unknown config.pp.crop 'center'")
  expect_error(make_config(data_dir, pp=dict(crop='inception', min_area=0.0)), r'min_area')
  expect_error(make_config(data_dir, pp=dict(crop='random', pad=-1)), r'config.pp.pad=-1 must be')
  data.get_info(make_config(data_dir, pp=dict(crop='resize', min_area=0.0)))  # A crop's own fields.
  expect_error(make_config(data_dir, image_size=0), r'image_size')
