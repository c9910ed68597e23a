"""The train order on class-sorted data: every batch is mixed, every epoch visits every example once.

Sources written in class order, as users bring them: an image folder (folders list files class by
class) and a tfds dataset prepared (as ArrayRecord) with shuffling disabled; and the bundled digits,
served from memory.
"""

import collections

import numpy as np
import pytest
from scipy import stats
import tensorflow_datasets as tfds

import helpers
from helpers import as_uint8, assert_same_batches, multiset, take
import tfds_fixtures
from vit_jax import data
from vit_jax.data import digits
from vit_jax.train import loop, setup as train_setup

SPLITS = digits.split_arrays()
TRAIN_LABELS = SPLITS['train'][1]


class ClassSortedDigits(tfds_fixtures.DigitsBuilder, skip_registration=True):
  """The digits written in class order, and kept in that order by tfds."""

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(features=super()._info().features, disable_shuffling=True)

  def _generate_examples(self, images, labels):
    for key, i in enumerate(np.argsort(labels, kind='stable')):
      yield key, {'image': tfds_fixtures.png(images[i]), 'label': labels[i]}


@pytest.fixture(scope='module')
def sources(tmp_path_factory, sorted_digits_folder):
  """{source name: config overrides}: the class-sorted digits as a folder and as ArrayRecord, and the
  digits in memory (in the stratified split's order)."""
  data_dir = str(tmp_path_factory.mktemp('sorted'))
  return {
      'folder': dict(dataset='folder', data_dir=sorted_digits_folder),
      'array_record': dict(
          dataset=tfds_fixtures.prepare(ClassSortedDigits, data_dir), data_dir=data_dir
      ),
      'digits': dict(data_dir=None),
  }


SOURCES = ['folder', 'array_record', 'digits']


def make_config(source, **overrides):
  return helpers.data_config(**{**source, **overrides})


def test_the_sources_are_class_sorted(sources):
  """The premise: read in order, the sorted sources' first quarter holds only the first classes."""
  for overrides in (sources['folder'], sources['array_record']):
    labels = next(data.eval_iterator(make_config(overrides), 'test', local_batch_size=360))['label']
    assert np.all(np.diff(labels) >= 0) and set(labels[:90]) <= {0, 1, 2}


def assert_mixed(labels, where):
  """The batch's class histogram fits the split's class frequencies (chi-square, fixed seed)."""
  expected = np.bincount(TRAIN_LABELS, minlength=10) / len(TRAIN_LABELS) * len(labels)
  p = stats.chisquare(np.bincount(labels, minlength=10), expected).pvalue
  assert p > 1e-3, f'{where}: batch classes {np.bincount(labels, minlength=10)}, p={p:.2g}'


@pytest.mark.parametrize('name', SOURCES)
@pytest.mark.parametrize('process_count', [1, 2])
def test_batches_are_mixed_from_the_first_on(sources, name, process_count):
  """Global batches of 128, in the first epoch and (resumed) in the third; every host's part of a
  batch is mixed too."""
  config = make_config(sources[name])
  steps_per_epoch = len(TRAIN_LABELS) // 128
  hosts = []
  for process_index in range(process_count):
    kwargs = dict(
        local_batch_size=128 // process_count,
        process_index=process_index,
        process_count=process_count,
    )
    later = data.train_iterator(config, start_step=2 * steps_per_epoch + 5, **kwargs)
    hosts.append(
        [b['label'] for b in take(data.train_iterator(config, **kwargs), 3) + [next(later)]]
    )
  for step, where in enumerate(['batch 0', 'batch 1', 'batch 2', 'a resumed batch of epoch 2']):
    assert_mixed(np.concatenate([host[step] for host in hosts]), f'{name}, {where}')
    for process_index, host in enumerate(hosts):
      assert_mixed(host[step], f'{name}, {where}, host {process_index} of {process_count}')


@pytest.mark.parametrize('name', SOURCES)
def test_every_epoch_visits_every_example_once(sources, name):
  # 1437 = 3 * 479: three batches are one epoch.
  config = make_config(sources[name])
  batches = take(data.train_iterator(config, local_batch_size=479), 9)
  orders = []
  for epoch in range(3):
    images = np.concatenate([as_uint8(b['image']) for b in batches[3 * epoch : 3 * epoch + 3]])
    labels = np.concatenate([b['label'] for b in batches[3 * epoch : 3 * epoch + 3]])
    assert multiset(images, labels) == multiset(*SPLITS['train']), f'epoch {epoch}'
    orders.append(labels)
  assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])


@pytest.mark.parametrize('name', ['folder', 'digits'])
def test_repeated_augmentation_shows_each_image_in_a_row_and_each_epoch_once_in_three(
    sources, name
):
  """config.aug_repeats=3: positions 3k..3k+2 are one image (the same pixels unaugmented, the same
  label but other pixels with random crops); three epochs of positions visit the split once, each
  image three times (1437 = 3 * 479: nine batches of 479)."""
  plain = take(
      data.train_iterator(make_config(sources[name], aug_repeats=3), local_batch_size=479), 9
  )
  images = np.concatenate([as_uint8(b['image']) for b in plain])
  labels = np.concatenate([b['label'] for b in plain])
  by_three = images.reshape(-1, 3, *images.shape[1:])
  assert (by_three == by_three[:, :1]).all()
  assert (labels.reshape(-1, 3) == labels[::3, None]).all()
  assert multiset(images[::3], labels[::3]) == multiset(*SPLITS['train'])
  # The first epoch of positions is a third of the split: not its first third in the split's order.
  assert not np.array_equal(labels[:1437:3], TRAIN_LABELS[:479])
  cropped = take(
      data.train_iterator(
          make_config(sources[name], aug_repeats=3, pp={'crop': 'inception', 'min_area': 0.3}),
          local_batch_size=479,
      ),
      3,
  )
  crops = np.concatenate([as_uint8(b['image']) for b in cropped])
  crop_labels = np.concatenate([b['label'] for b in cropped])
  assert (crop_labels.reshape(-1, 3) == crop_labels[::3, None]).all()
  triples = crops.reshape(-1, 3, *crops.shape[1:])
  assert np.mean([len({t.tobytes() for t in triple}) == 3 for triple in triples]) > 0.9


@pytest.mark.parametrize('name', ['folder', 'array_record'])
@pytest.mark.parametrize('process_count', [2, 3])
def test_random_access_shards_are_disjoint_balanced_and_cover_the_split(
    sources, name, process_count
):
  config = make_config(sources[name])
  union = collections.Counter()
  for process_index in range(process_count):
    size = len(range(process_index, len(TRAIN_LABELS), process_count))
    # One batch of the shard's size is one epoch of that host's shard.
    batch = next(
        data.train_iterator(
            config, local_batch_size=size, process_index=process_index, process_count=process_count
        )
    )
    union += multiset(as_uint8(batch['image']), batch['label'])
    # Strided shards of a class-sorted list hold each class's share to within one example.
    share = np.bincount(TRAIN_LABELS, minlength=10) / process_count
    assert np.all(np.abs(np.bincount(batch['label'], minlength=10) - share) <= 1)
  assert union == multiset(*SPLITS['train'])


def test_a_process_of_several_shards_draws_each_epochs_order_once_a_shard(sources):
  """A batch's rows switch between the process's shards: with one order cached for two, each shard
  drew its epoch's permutation again for every few rows (27 times over an epoch of 6 shards)."""
  from vit_jax.data import order  # pylint: disable=g-import-not-at-top

  config = make_config(sources[SOURCES[0]], data_shards=6)
  order._permutation.cache_clear()  # pylint: disable=protected-access
  take(data.train_iterator(config, local_batch_size=48, start_step=0), 4)
  assert order._permutation.cache_info().misses <= 2 * 6  # pylint: disable=protected-access


@pytest.mark.parametrize('name', SOURCES)
def test_global_batches_depend_on_data_shards_not_on_hosts(sources, name):
  config = make_config(sources[name], data_shards=4)
  one_host = take(data.train_iterator(config, local_batch_size=32, start_step=40), 2)
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
            2,
        )
        for i in range(process_count)
    ]
    for step, batch in enumerate(one_host):
      for key in ('image', 'label'):
        np.testing.assert_array_equal(
            np.concatenate([host[step][key] for host in hosts]), batch[key]
        )


@pytest.mark.parametrize('name', SOURCES)
@pytest.mark.parametrize('process_index,process_count', [(0, 1), (1, 2)])
def test_resume_is_bitwise_identical(sources, name, process_index, process_count):
  config = make_config(sources[name], pp=dict(crop='inception', flip=True))
  kwargs = dict(local_batch_size=100, process_index=process_index, process_count=process_count)
  reference = take(data.train_iterator(config, **kwargs), 20)
  for start in (
      3,
      7,
      15,
  ):  # Mid-epoch, at an epoch's edge (batch 7 spans epochs 0 and 1 of 719), later.
    resumed = take(data.train_iterator(config, start_step=start, **kwargs), 3)
    assert_same_batches(resumed, reference[start : start + 3])


@pytest.mark.parametrize('name', SOURCES)
def test_resuming_far_into_a_run_skips_arithmetically(sources, name):
  """Resuming at step 10^9 reads nothing before it (it would take hours otherwise) and continues
  the stream of the step before it."""
  config = make_config(sources[name])
  step = 10**9
  before = take(data.train_iterator(config, local_batch_size=32, start_step=step - 1), 2)[1]
  at = next(data.train_iterator(config, local_batch_size=32, start_step=step))
  assert_same_batches([at], [before])


@pytest.mark.parametrize('name', SOURCES)
def test_eval_visits_each_example_once(sources, name):
  config = make_config(sources[name])
  seen = collections.Counter()
  for process_index in range(3):
    for b in data.eval_iterator(
        config, 'test', local_batch_size=50, process_index=process_index, process_count=3
    ):
      seen += multiset(as_uint8(b['image'][b['mask']]), b['label'][b['mask']])
  assert seen == multiset(*SPLITS['test'])


@pytest.mark.slow
def test_training_on_a_class_sorted_folder_learns(tmp_path, sorted_digits_folder):
  """The demo recipe, shortened, on the digits as a class-sorted image folder. With a window of 64
  consecutive files (an old order) every batch held one or two classes and top-1 stayed near chance.
  """
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'folder',
          'data_dir': sorted_digits_folder,
          'total_steps': 150,
          'batch_size': 64,
          'lr.base': 3e-3,
          'lr.warmup_steps': 10,
          'eval_every_steps': 150,
          'log_every_steps': 50,
          'checkpoint_every_steps': 150,
      },
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert metrics['eval_top1'] > 0.6  # Chance is 0.1.
