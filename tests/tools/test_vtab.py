"""VTAB-1k: configs/vtab.py for every task, its labels, the sweep file, and python -m vit_jax.tools.vtab on
a sweep root of tiny runs. The VTAB datasets are not downloadable here, so a few are prepared (as
ArrayRecord, their images as PNG files) in a temporary data_dir with random images under
their tfds names and versions, with the real datasets' features (the registered builders' own), and
the runs read them through configs/vtab.py."""

import csv
import dataclasses
import math
import os
import pickle
import re
import subprocess
import sys

import ml_collections
import numpy as np
import pytest
import tensorflow_datasets as tfds

import helpers
import tfds_fixtures
from configs import vtab as vtab_config
from vit_jax import data
from vit_jax.tools import vtab
from vit_jax.tools.runs import find_runs, load_run, Run
from vit_jax.data import images as data_images
from vit_jax.data import preprocess
from vit_jax.data import tfds_source
from vit_jax.data import vtab as vtab_data
from vit_jax.train import loop, setup as train_setup
import sweep

# Small stand-ins for the VTAB splits, in the layout each task's splits have.
_HELD_OUT = dict(
    train800='train[:32]', val200='train[32:48]', train800val200='train[:32]+train[32:48]'
)
FAKE_SPLITS = {
    'svhn': {**_HELD_OUT, 'test': 'test'},
    'eurosat': {**_HELD_OUT, 'test': 'train[48:]'},
    'dsprites_loc': {**_HELD_OUT, 'test': 'train[48:]'},
    'dsprites_ori': {**_HELD_OUT, 'test': 'train[48:]'},
    'clevr_dist': {**_HELD_OUT, 'test': 'validation'},
}
# The sweep root's runs: (task, phase, lr), a group each and two structured tasks; two head sizes
# (10 and 16 classes), so the tiny model compiles twice.
RUNS = [
    ('svhn', '', 0.001),
    ('svhn', '', 0.01),
    ('eurosat', '', 0.01),
    ('eurosat', ',final', 0.01),
    ('dsprites_loc', '', 0.01),
    ('dsprites_ori', '', 0.003),
]
STEPS = 4


def _dsprites(rng: np.random.RandomState) -> dict:
  example = {'image': (rng.rand(64, 64, 1) > 0.5).astype(np.uint8)}  # 0/1 pixels, as dSprites.
  for name, classes in (
      ('orientation', 40),
      ('scale', 6),
      ('shape', 3),
      ('x_position', 32),
      ('y_position', 32),
  ):
    example[f'label_{name}'], example[f'value_{name}'] = rng.randint(classes), rng.rand()
  return example


def _clevr(rng: np.random.RandomState) -> dict:
  n = rng.randint(3, 11)
  objects = {
      '3d_coords': rng.rand(n, 3),
      'color': rng.randint(8, size=n),
      'material': rng.randint(2, size=n),
      'pixel_coords': rng.rand(n, 3) * 4 + 7,
      'rotation': rng.rand(n),
      'shape': rng.randint(3, size=n),
      'size': rng.randint(2, size=n),
  }
  return {
      'file_name': 'x.png',
      'image': rng.randint(256, size=(12, 16, 3), dtype=np.uint8),
      'objects': {
          k: np.asarray(v, np.float32 if v.dtype == float else np.int64) for k, v in objects.items()
      },
      'question_answer': {'answer': [], 'question': []},
  }


# tfds name: (split sizes, an example from a random state): the real features, random values.
FAKE_DATASETS = {
    'svhn_cropped': (
        {'train': 48, 'test': 16},
        lambda rng: {
            'id': 'x',
            'image': rng.randint(256, size=(32, 32, 3), dtype=np.uint8),
            'label': rng.randint(10),
        },
    ),
    'eurosat/rgb': (
        {'train': 64},
        lambda rng: {
            'filename': 'x',
            'image': rng.randint(256, size=(64, 64, 3), dtype=np.uint8),
            'label': rng.randint(10),
        },
    ),
    'dsprites': ({'train': 64}, _dsprites),
    'clevr': ({'train': 48, 'validation': 16}, _clevr),
}


def fake_examples(tfds_name: str, split: str) -> list[dict]:
  sizes, example = FAKE_DATASETS[tfds_name]
  rng = np.random.RandomState(len(split))
  return [example(rng) for _ in range(sizes[split])]


def _prepare_fake(tfds_name: str, data_dir: str, file_format: str = 'array_record') -> None:
  """A dataset of random examples prepared as the registered builder `tfds_name` (its features),
  which tfds.builder then reads as the real one."""
  name, _, builder_config = tfds_name.partition('/')

  class Fake(tfds.builder_cls(name), skip_registration=True):
    code_path = None  # Nothing to download, so no checksums to look for.

    def _split_generators(self, dl_manager):
      del dl_manager
      return {split: self._generate_examples(split) for split in FAKE_DATASETS[tfds_name][0]}

    def _generate_examples(self, split):
      for key, example in enumerate(fake_examples(tfds_name, split)):
        yield key, {**example, 'image': tfds_fixtures.png(example['image'])}

  Fake.name = name
  Fake(config=builder_config or None, data_dir=data_dir).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False), file_format=file_format
  )


@pytest.fixture(scope='module')
def vtab_data_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('vtab_tfds'))
  for tfds_name in FAKE_DATASETS:
    _prepare_fake(tfds_name, path)
  return path


def tiny_config(task: str, phase: str, lr: float, data_dir: str):
  """configs/vtab.py:<task><phase> with a tiny model, a few steps and the fake data's splits."""
  config = vtab_config.get_config(task + phase)
  splits = FAKE_SPLITS[task]
  config.train_split = splits['train800val200' if phase else 'train800']
  config.eval_split = splits['test']
  if not phase:
    config.evals.val200.split, config.evals.val200.every_steps = splits['val200'], STEPS
  config.update(
      dict(
          data_dir=data_dir,
          image_size=8,
          batch_size=16,
          eval_batch_size=16,
          total_steps=STEPS,
          eval_every_steps=STEPS,
          log_every_steps=2,
          checkpoint_every_steps=STEPS,
          init_from=None,
          dtype='float32',
          variant=helpers.TINY['variant'],
      )
  )
  config.model.update(
      {k.split('.')[1]: v for k, v in helpers.TINY.items() if k.startswith('model.')}
  )
  config.pp.pad = 1 if config.pp.crop == 'random' else 0  # The crop's padding, at 8 px.
  config.lr.base, config.lr.warmup_steps = lr, 1
  return config


# The slow tests of these runs share one xdist worker, which trains them once (not once a worker).
VTAB_ROOT_GROUP = pytest.mark.xdist_group('vtab_root')


@pytest.fixture(scope='module')
def vtab_root(vtab_data_dir, tmp_path_factory):
  """A sweep root of tiny finished runs (RUNS), named as launch/sweep.py names them."""
  root = tmp_path_factory.mktemp('vtab_root')
  for task, phase, lr in RUNS:
    workdir = root / sweep.run_name({'config': f'configs/vtab.py:{task}{phase}', 'lr.base': lr})
    loop.train_and_evaluate(
        train_setup.prepare(tiny_config(task, phase, lr, vtab_data_dir), str(workdir))
    )
  return str(root)


@pytest.mark.parametrize('task', list(vtab_data.TASKS))
def test_every_task_builds_both_phases_without_data(task):
  config, final = vtab_config.get_config(task), vtab_config.get_config(f'{task},final')
  splits = vtab_data.TASKS[task].splits
  assert config.dataset == final.dataset == f'vtab/{task}'
  assert config.dataset in data.sources.SOURCES
  assert (config.train_split, config.evals.val200.split, config.eval_split) == (
      splits['train800'],
      splits['val200'],
      splits['test'],
  )
  # The final run trains on the sweep's train800 and val200 images and evaluates nothing else.
  assert final.train_split == f'{splits["train800"]}+{splits["val200"]}' == splits['train800val200']
  assert final.eval_split == splits['test'] and 'val200' not in final.evals
  assert (
      config.image_size,
      config.batch_size,
      config.total_steps,
      config.optim.name,
      config.optim.momentum,
      config.lr.base,
  ) == (384, 512, 2500, 'sgd', 0.9, 0.01)
  if vtab_data.TASKS[task].group == 'structured':  # Labels of positions, counts and distances.
    assert (config.pp.crop, config.pp.flip) == ('resize', False)


def test_the_groups_are_vtabs():
  groups = {
      group: [name for name, task in vtab_data.TASKS.items() if task.group == group]
      for group in vtab_data.GROUPS
  }
  assert [len(names) for names in groups.values()] == [7, 4, 8]


def test_unknown_task_or_phase_is_a_one_line_error_naming_the_valid_ones():
  with pytest.raises(
      ValueError,
      match=r"^Unknown VTAB task 'cifar': use one of caltech101, cifar100, " r'.*smallnorb_elev',
  ):
    vtab_config.get_config('cifar')
  with pytest.raises(ValueError, match=r"Unknown VTAB phase 'last'.*cifar100,final"):
    vtab_config.get_config('cifar100,last')
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/vtab.py:cifar', '--workdir=unused'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  [line] = run.stderr.splitlines()
  assert re.fullmatch(
      r'error: configs/vtab\.py:\d+: get_config raised ValueError: Unknown VTAB task '
      rf"'cifar': use one of {re.escape(', '.join(vtab_data.TASKS))} "
      r'\(e\.g\. --config=configs/vtab\.py:cifar100\)',
      line,
  ), line


def test_sweep_file_is_every_task_at_each_learning_rate():
  sweep_file = os.path.join(helpers.REPO, 'configs/sweeps/vtab_lr.py')
  commands = sweep.commands(sweep_file, '/runs', [])
  expected = [
      (f'--config=configs/vtab.py:{task}', f'--config.lr.base={lr}')
      for task in vtab_data.TASKS
      for lr in (0.001, 0.003, 0.01, 0.03)
  ]
  assert [tuple(cmd[3:4] + cmd[5:]) for cmd in commands] == expected  # No --config.config.
  assert commands[0][4] == '--workdir=/runs/config=configs_vtab.py_caltech101,lr.base=0.001'


def _numpy_labels(task: str, example: dict) -> int:
  """task_adaptation's labels (its data/dsprites.py, clevr.py, kitti.py), in NumPy."""
  if task == 'dsprites_loc':
    return int(np.floor(example['label_x_position'] / 2.0))
  if task == 'dsprites_ori':
    return int(np.floor(example['label_orientation'] / 2.5))
  if task == 'clevr_count':
    return len(example['objects']['size']) - 3
  if task == 'clevr_dist':
    distance = example['objects']['pixel_coords'][:, 2].min()
    return int(np.max(np.flatnonzero(np.array([0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0]) < distance)))
  if task == 'kitti_dist':
    objects = example['objects']
    depths = np.append(objects['location'][objects['type'] < 3, 2], 1000.0)
    return int(np.max(np.flatnonzero(np.array([-100.0, 8.0, 20.0, 999.0]) < depths.min())))
  raise ValueError(task)


def test_computed_labels_are_task_adaptations():
  rng = np.random.RandomState(0)
  cases = {
      'dsprites_loc': [_dsprites(rng) for _ in range(50)],
      'dsprites_ori': [_dsprites(rng) for _ in range(50)],
      'clevr_count': [_clevr(rng) for _ in range(20)],
      'clevr_dist': [_clevr(rng) for _ in range(50)],
      'kitti_dist': [
          {
              'objects': {
                  'type': rng.randint(8, size=n),
                  'location': (rng.rand(n, 3) * 40).astype(np.float32),
              }
          }
          for n in [0, 1, 1, 3, 5, 9] * 8
      ],
  }
  for task, examples in cases.items():
    label = vtab_data.TASKS[task].label
    values = [label.fn(ex) for ex in examples]
    # As tfds' numpy parser gives a Sequence feature: a list of its values (of arrays for vectors).
    as_lists = [
        {**ex, 'objects': {k: list(v) for k, v in ex['objects'].items()}} if 'objects' in ex else ex
        for ex in examples
    ]
    assert [label.fn(ex) for ex in as_lists] == values, task
    assert values == [_numpy_labels(task, ex) for ex in examples], task
    assert set(values) <= set(range(len(label.class_names))), task


@pytest.mark.parametrize('task', ['dsprites_loc', 'clevr_dist', 'svhn'])
def test_the_pipeline_reads_each_tasks_images_and_labels(task, vtab_data_dir):
  """Through the data pipeline, from the prepared files: the labels of every example (tfds shuffled
  them, so as multisets), and dSprites' 0/1 pixels as black and white."""
  config = tiny_config(task, '', 0.01, vtab_data_dir)
  config.image_size = 64  # dSprites' own size: the eval resize keeps every pixel.
  tfds_name = vtab_data.TASKS[task].tfds_name.split(':')[0]
  split = 'train'
  labels, images = [], []
  for batch in data.eval_iterator(config, split, local_batch_size=16):
    labels += batch['label'][batch['mask']].tolist()
    images.append(batch['image'][batch['mask']])
  label = vtab_data.TASKS[task].label
  examples = fake_examples(tfds_name, split)
  expected = [ex['label'] if label == 'label' else _numpy_labels(task, ex) for ex in examples]
  assert sorted(labels) == sorted(expected)
  if task == 'dsprites_loc':
    assert set(np.unique(preprocess.model_input(np.concatenate(images)))) <= {-1.0, 1.0}


@pytest.mark.parametrize(
    'task', ['svhn', 'eurosat', 'dsprites_loc', 'dsprites_ori', 'clevr_count', 'clevr_dist']
)
def test_the_source_gives_each_example_its_image_and_label(task, vtab_data_dir):
  """VtabSource alone, on every split of the task: each loaded image is a prepared one, pixel for
  pixel (PNG; dSprites' 0/1 as 0/255, grey as RGB), with that example's label."""
  task_info = vtab_data.TASKS[task]
  source = vtab_data.make_source(
      task, ml_collections.ConfigDict({'data_dir': vtab_data_dir}), 'label'
  )
  source = pickle.loads(pickle.dumps(source))  # As grain's worker processes get it.
  builder = tfds.builder(task_info.tfds_name, data_dir=vtab_data_dir)
  tfds_name = task_info.tfds_name.split(':')[0]
  sizes = FAKE_DATASETS[tfds_name][0]
  by_image = {}  # Image bytes as loaded -> the task's label.
  for split in sizes:
    for ex in fake_examples(tfds_name, split):
      image = np.broadcast_to(ex['image'], ex['image'].shape[:2] + (3,))
      label = ex['label'] if task_info.label == 'label' else _numpy_labels(task, ex)
      by_image[(image * 255 if task_info.binary_image else image).tobytes()] = label
  for split in FAKE_SPLITS.get(task, FAKE_SPLITS['clevr_dist']).values():
    records = source.examples(split)
    loaded = [source.load(records.read(k)) for k in range(records.num_records)]
    assert len(loaded) == builder.info.splits[split].num_examples
    for example in loaded:
      image = data_images.rgb(data_images.pixels(example['image']))  # Greyscale: [h, w, 1].
      assert image.dtype == np.uint8 and image.shape[2] == 3
      assert example['label'].dtype == np.int32
      assert by_image[image.tobytes()] == example['label'], split
  assert source.class_names == (
      task_info.label.class_names
      if isinstance(task_info.label, vtab_data.Label)
      else tuple(builder.info.features[task_info.label].names)
  )
  assert source.describe(source.examples('train[:32]').read(3)) == (
      f'example 3 of split train[:32] of {tfds_name.split("/")[0]}'
  )


def test_a_task_on_a_dataset_without_its_label_feature_is_a_one_line_error(vtab_data_dir):
  config = tiny_config('svhn', '', 0.01, vtab_data_dir)
  with pytest.raises(ValueError) as error:
    vtab_data.make_source('svhn', config, 'coarse_label')
  assert str(error.value) == (
      "VTAB task 'svhn' has one label an image, not a label feature "
      "'coarse_label': leave the evaluator's label_feature unset"
  )
  builder = tfds.builder('svhn_cropped', data_dir=vtab_data_dir)
  task = dataclasses.replace(vtab_data.TASKS['svhn'], label='label_azimuth')
  with pytest.raises(
      ValueError,
      match=r"^Dataset 'svhn_cropped' 3\.\d+\.\d+ has no ClassLabel feature "
      r"'label_azimuth': prepare the version VTAB reads, "
      r'svhn_cropped:3\.\*\.\*$',
  ):
    vtab_data.VtabSource(task, builder)


def test_a_task_prepared_as_tfrecord_reads_once_converted(tmp_path):
  """A registered dataset (as the real VTAB ones) prepared as TFRecord: the one-line error, then
  read through the ArrayRecord files the conversion writes beside the TFRecord ones."""
  helpers.tensorflow()  # tfds writes TFRecord files, and the conversion reads them, with it.
  data_dir = str(tmp_path)
  _prepare_fake('svhn_cropped', data_dir, 'tfrecord')
  config = ml_collections.ConfigDict({'data_dir': data_dir})
  builder = tfds.builder('svhn_cropped', data_dir=data_dir)
  with pytest.raises(
      ValueError,
      match=r"^tensorflow_datasets dataset 'svhn_cropped' in "
      rf'{builder.data_dir} is prepared as tfrecord, .* and '
      rf'`python -m vit_jax.tools.to_array_record {builder.data_dir}`$',
  ):
    vtab_data.make_source('svhn', config, 'label')
  assert tfds_source.to_array_record(builder.data_dir)
  source = pickle.loads(pickle.dumps(vtab_data.make_source('svhn', config, 'label')))
  records = source.examples('test')
  labels = [int(source.load(records.read(k))['label']) for k in range(records.num_records)]
  assert sorted(labels) == sorted(ex['label'] for ex in fake_examples('svhn_cropped', 'test'))


def _run(root: str, task: str, phase: str, lr: float) -> dict[str, dict[int, float]]:
  return helpers.read_scalars(
      os.path.join(
          root, sweep.run_name({'config': f'configs/vtab.py:{task}{phase}', 'lr.base': lr})
      )
  )


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@VTAB_ROOT_GROUP
def test_table_has_the_best_val200_rate_and_the_logged_test_top1(vtab_root):
  rows = vtab.table([load_run(n, p) for n, p in find_runs([vtab_root])])
  by_task = {row.task: row for row in rows if row.task != 'mean'}
  assert list(by_task) == list(vtab_data.TASKS)
  # svhn: two rates; the better val200 wins (the lower one on a tie); no final run.
  runs = {lr: _run(vtab_root, 'svhn', '', lr) for lr in (0.001, 0.01)}
  best = max(sorted(runs), key=lambda lr: runs[lr]['val200_top1'][STEPS])
  assert (by_task['svhn'].lr, by_task['svhn'].source) == (best, 'sweep run')
  assert by_task['svhn'].val200_top1 == runs[best]['val200_top1'][STEPS]
  assert by_task['svhn'].test_top1 == runs[best]['eval_top1'][STEPS]
  # eurosat: the final run's test top-1 at the chosen rate, beside the sweep run's val200.
  sweep_run, final_run = _run(vtab_root, 'eurosat', '', 0.01), _run(
      vtab_root, 'eurosat', ',final', 0.01
  )
  assert by_task['eurosat'].source == 'final run' and by_task['eurosat'].lr == 0.01
  assert by_task['eurosat'].val200_top1 == sweep_run['val200_top1'][STEPS]
  assert by_task['eurosat'].test_top1 == final_run['eval_top1'][STEPS]
  assert 'val200_top1' not in final_run
  assert (
      by_task['dsprites_ori'].test_top1
      == _run(vtab_root, 'dsprites_ori', '', 0.003)['eval_top1'][STEPS]
  )
  assert by_task['dmlab'] == vtab.Row('structured', 'dmlab')  # No run: an empty row.


def _logged_run(
    name: str, lr: float, test: float, val200: float | None = None, last_step: int = 10
) -> Run:
  """A run as load_run reads it: a sweep run when it has a val200 top-1, else a final run."""
  config = {'dataset': 'vtab/dtd', 'lr.base': lr, 'total_steps': 10}
  scalars = {'eval_top1': {last_step: test}}
  if val200 is not None:
    config['evals.val200.split'] = 'validation[:200]'
    scalars['val200_top1'] = {last_step: val200}
  return Run(name, config, scalars)


def test_the_rate_is_chosen_on_val200_and_the_final_run_at_it_gives_the_test_top1():
  sweep_runs = [
      _logged_run('a', 0.03, test=0.1, val200=0.5),
      _logged_run('b', 0.001, test=0.2, val200=0.5),
      _logged_run('c', 0.01, test=0.9, val200=0.4),
  ]
  # Equally good rates: the lowest. A final run at another rate is not the task's result.
  for finals in ([], [_logged_run('f', 0.01, test=0.8)]):
    assert vtab.task_row('dtd', sweep_runs, finals) == vtab.Row(
        'natural', 'dtd', 0.001, 0.5, 0.2, 'sweep run', 'b'
    )
  final = _logged_run('g', 0.001, test=0.7)
  assert vtab.task_row('dtd', sweep_runs, [final]) == vtab.Row(
      'natural', 'dtd', 0.001, 0.5, 0.7, 'final run', 'g'
  )
  assert vtab.task_row('dtd', [], [final]) == vtab.Row(
      'natural', 'dtd', 0.001, None, 0.7, 'final run', 'g'
  )
  with pytest.raises(
      ValueError, match=r'^VTAB task dtd has 2 final runs at lr 0.001: g, h: leave one'
  ):
    vtab.task_row('dtd', sweep_runs, [final, _logged_run('h', 0.001, test=0.6)])
  # Runs that have not evaluated their last step are not counted.
  unfinished = [
      _logged_run('u', 0.01, test=0.3, val200=0.9, last_step=5),
      _logged_run('v', 0.01, test=0.3, last_step=5),
  ]
  assert vtab.vtab_runs(unfinished)['dtd'] == {'sweep': [], 'final': []}


def test_shared_selection_takes_the_one_rate_with_the_best_mean_val200():
  def run(task, lr, val200, test):
    logged = _logged_run(f'{task}_{lr:g}', lr, test=test, val200=val200)
    return dataclasses.replace(logged, config={**logged.config, 'dataset': f'vtab/{task}'})

  # dtd alone would take 0.01 and svhn 0.001; over both, 0.001 is better (0.7 vs 0.6 mean).
  runs = [
      run('dtd', 0.001, 0.6, 0.1),
      run('dtd', 0.01, 0.7, 0.2),
      run('svhn', 0.001, 0.8, 0.3),
      run('svhn', 0.01, 0.5, 0.4),
      run('svhn', 0.03, 0.99, 0.5),
  ]
  found = vtab.vtab_runs(runs)
  assert vtab.shared_rate(found) == 0.001  # 0.03 was not swept on dtd.
  rows = {row.task: row for row in vtab.table(runs, 'shared') if row.task != 'mean'}
  assert (rows['dtd'].lr, rows['dtd'].test_top1, rows['svhn'].lr, rows['svhn'].test_top1) == (
      0.001,
      0.1,
      0.001,
      0.3,
  )
  per_task = {row.task: row for row in vtab.table(runs) if row.task != 'mean'}
  assert (per_task['dtd'].lr, per_task['svhn'].lr) == (0.01, 0.03)
  with pytest.raises(ValueError, match=r'^no learning rate was swept on all of the 2 swept tasks '):
    vtab.table([runs[0], runs[3]], 'shared')  # dtd at 0.001 only, svhn at 0.01 only.
  with pytest.raises(ValueError, match=r'^unknown --select=best: use one of per_task, shared$'):
    vtab.table(runs, 'best')


def test_a_non_finite_val200_is_never_the_best_rate():
  """max() keeps a NaN it meets first: the lowest rate, sorted first, won with a NaN val200 top-1."""
  runs = [
      _logged_run('a', 0.001, test=0.1, val200=math.nan),
      _logged_run('b', 0.01, test=0.7, val200=0.8),
      _logged_run('c', 0.03, test=0.5, val200=0.5),
  ]
  assert vtab.task_row('dtd', runs, []) == vtab.Row(
      'natural', 'dtd', 0.01, 0.8, 0.7, 'sweep run', 'b'
  )
  assert vtab.shared_rate(vtab.vtab_runs(runs)) == 0.01


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@VTAB_ROOT_GROUP
def test_group_means_are_the_numpy_means_of_their_task_rows(vtab_root):
  rows = vtab.table([load_run(n, p) for n, p in find_runs([vtab_root])])
  tasks = [row for row in rows if row.task != 'mean']
  means = {row.group: row for row in rows if row.task == 'mean'}
  assert list(means) == [*vtab_data.GROUPS, 'all']
  for group, mean in means.items():
    values = [
        row.test_top1 for row in tasks if group in ('all', row.group) and row.test_top1 is not None
    ]
    assert mean.test_top1 == np.mean(values)
    size = len(tasks) if group == 'all' else sum(row.group == group for row in tasks)
    assert mean.source == f'{len(values)} of {size} tasks'
  assert [means[g].source for g in means] == [
      '1 of 7 tasks',
      '1 of 4 tasks',
      '2 of 8 tasks',
      '4 of 19 tasks',
  ]


@pytest.mark.slow  # Tens of seconds of training (vtab_root's 6 runs): make test-all's.
@VTAB_ROOT_GROUP
def test_command_line_prints_the_table_and_writes_markdown_and_csv(vtab_root, tmp_path):
  out = tmp_path / 'out'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.vtab', vtab_root, f'--out={out}'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stderr == ''
  markdown = (out / 'vtab.md').read_text()
  assert run.stdout == f'{markdown}\n{out}/vtab.md\n{out}/vtab.csv\n'
  rows = vtab.table([load_run(n, p) for n, p in find_runs([vtab_root])])
  assert markdown == vtab.to_markdown(rows)
  assert len(markdown.splitlines()) == 2 + len(rows)
  with open(out / 'vtab.csv') as f:
    written = list(csv.DictReader(f))
  assert [(r['group'], r['task']) for r in written] == [(row.group, row.task) for row in rows]
  for line, row in zip(written, rows):  # The logged numbers, exactly.
    assert line['test_top1'] == ('' if row.test_top1 is None else repr(row.test_top1))


def test_a_root_without_finished_vtab_runs_is_a_one_line_error(tmp_path):
  for name, config in (
      ('demo', helpers.load_config('demo')),
      ('vtab', vtab_config.get_config('dtd')),
  ):
    (tmp_path / name).mkdir()
    (tmp_path / name / 'config.json').write_text(
        config.to_json_best_effort()
    )  # Nothing logged yet.
  with pytest.raises(ValueError) as error:
    vtab.vtab_table([str(tmp_path)], str(tmp_path / 'out'))
  assert str(error.value) == (
      'no finished VTAB run: none has a config.json with dataset vtab/<task> '
      '(configs/vtab.py:TASK) and its test top-1 at its last step'
  )
  assert not (tmp_path / 'out').exists()
