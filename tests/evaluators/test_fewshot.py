"""Few-shot linear evaluation: the closed-form fit, the shot sampling, the evaluator and the command."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image
from sklearn import linear_model

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import run_dir, saved_state
from vit_jax.evaluators import fewshot, knn
from vit_jax.tasks import classification
from vit_jax.train import loop, setup as train_setup


def _blobs(rng, num_classes, per_class, dim, spread):
  """Features of `num_classes` Gaussian clusters with centres `spread` apart, and their labels."""
  centres = rng.normal(0, spread, (num_classes, dim))
  labels = np.repeat(np.arange(num_classes), per_class)
  return centres[labels] + rng.normal(0, 1, (len(labels), dim)), labels


def test_separable_features_are_classified_almost_perfectly():
  rng = np.random.default_rng(0)
  x, y = _blobs(rng, 10, 80, 32, spread=5.0)
  train_x, train_y, test_x, test_y = x[::2], y[::2], x[1::2], y[1::2]
  accuracies = fewshot.linear_fewshot_accuracy(
      train_x, train_y, test_x, test_y, shots=(1, 5, 25), seeds=3, l2_reg=4.0
  )
  assert list(accuracies) == [1, 5, 25]
  assert min(accuracies.values()) > 0.97, accuracies


def test_features_unrelated_to_the_labels_score_chance():
  rng = np.random.default_rng(0)
  train_x, test_x = rng.normal(size=(500, 32)), rng.normal(size=(3000, 32))
  train_y, test_y = np.repeat(np.arange(10), 50), rng.integers(0, 10, 3000)
  accuracies = fewshot.linear_fewshot_accuracy(
      train_x, train_y, test_x, test_y, shots=(1, 10, 25), seeds=3, l2_reg=4.0
  )
  for accuracy in accuracies.values():
    assert 0.07 < accuracy < 0.13, accuracies


def test_the_fit_is_ridge_regression_to_plus_minus_one_targets_with_a_free_bias():
  rng = np.random.default_rng(1)
  x, y = _blobs(rng, 5, 26, 8, spread=1.0)
  train = np.arange(len(y)) % 13 == 0  # Two of each class's 26.
  train_x, train_y, test_x, test_y = x[train], y[train], x[~train], y[~train]
  mean, std = train_x.mean(0), train_x.std(0) + 1e-5
  reference = linear_model.Ridge(alpha=3.0, fit_intercept=True).fit(
      (train_x - mean) / std, 2 * np.eye(5)[train_y] - 1
  )
  expected = np.mean(reference.predict((test_x - mean) / std).argmax(-1) == test_y)
  assert fewshot.fit_and_score(train_x, train_y, test_x, test_y, 5, l2_reg=3.0) == expected
  assert 0.2 < expected < 1.0  # A test set where the fit makes mistakes: a comparison of substance.


def test_shots_are_drawn_per_class_by_seed():
  labels = np.repeat(np.arange(4), 10)
  chosen = fewshot.sample_shots(labels, 3, 4, np.random.default_rng(7))
  assert np.bincount(labels[chosen]).tolist() == [3, 3, 3, 3] and len(set(chosen)) == 12
  np.testing.assert_array_equal(
      chosen, fewshot.sample_shots(labels, 3, 4, np.random.default_rng(7))
  )
  assert set(chosen) != set(fewshot.sample_shots(labels, 3, 4, np.random.default_rng(8)))
  assert set(chosen) < set(fewshot.sample_shots(labels, 5, 4, np.random.default_rng(7)))  # Nested.
  with pytest.raises(
      ValueError, match='class 0 has 10 readable train examples, fewer than 11 shots'
  ):
    fewshot.sample_shots(labels, 11, 4, np.random.default_rng(0))


def test_the_loop_evaluator_and_the_command_agree_on_the_tiny_run(trained_tiny_run):
  config, _ = run_dir.load_run_info(trained_tiny_run)
  params, _ = saved_state.restore_params(saved_state.find_checkpoint(trained_tiny_run)[0])
  mesh = sharding.make_mesh((('data', -1),))  # The 8 test devices, as the loop has them.
  evaluator = fewshot.FewShotEvaluator(
      'fewshot',
      None,
      config=config,
      model=classification.features_model(config, helpers.model_config(config)),
      mesh=mesh,
      num_classes=10,
      shots=(1, 10),
      seeds=2,
      l2_reg=config.fewshot.l2_reg,
  )
  params = jax.device_put(params, sharding.replicated(mesh))  # Params with a head too.
  metrics = evaluator(params)
  print(f'\nfew-shot accuracy of the tiny run on the digits (chance 0.1): {metrics}')
  assert list(metrics) == ['1shot', '10shot']
  assert metrics['10shot'] > 0.4
  neighbours = knn.KnnEvaluator(
      'knn',
      None,
      config=config,
      model=classification.features_model(config, helpers.model_config(config)),
      mesh=mesh,
      ks=(1, 10),
      temperature=0.07,
  )
  knn_metrics = neighbours(params)
  neighbours.close()
  print(f'k-NN accuracy: {knn_metrics}')
  assert list(knn_metrics) == ['1nn', '10nn'] and knn_metrics['10nn'] > 0.4

  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.fewshot',
          f'--workdir={trained_tiny_run}',
          '--shots=1,10',
          '--seeds=2',
          '--knn=1,10',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  print(run.stdout)
  fewshot_part, knn_part = run.stdout.split('weighted k-NN accuracy (temperature 0.07):')
  table = dict(re.findall(r'^\s+(\d+)\s+([0-9.]+)$', fewshot_part, re.MULTILINE))
  assert float(table['1']) == pytest.approx(metrics['1shot'], abs=1e-4)
  assert float(table['10']) == pytest.approx(metrics['10shot'], abs=1e-4)
  assert 'of step 12 of' in run.stdout
  table = dict(re.findall(r'^\s+(\d+)\s+([0-9.]+)$', knn_part, re.MULTILINE))
  assert float(table['1']) == pytest.approx(knn_metrics['1nn'], abs=1e-4)
  assert float(table['10']) == pytest.approx(knn_metrics['10nn'], abs=1e-4)


def test_the_command_uses_the_runs_fewshot_settings_where_no_flag_is_given(
    trained_tiny_run, tmp_path
):
  # A run logging fewshot_* with its own settings: the command left to its defaults measures the same.
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  info = json.loads(open(os.path.join(workdir, 'config.json')).read())
  settings = dict(
      shots=[2], seeds=1, l2_reg=0.01, train_split='train[:300]', eval_split='train[300:400]'
  )
  info['fewshot'].update(settings)
  # And k-NN, on other splits.
  knn_splits = dict(train_split='train[100:500]', eval_split='test[:50]')
  info['knn'] = dict(every_steps=4, ks=[3], temperature=0.5, **knn_splits)
  open(os.path.join(workdir, 'config.json'), 'w').write(json.dumps(info))
  from vit_jax.tools import fewshot as command  # pylint: disable=g-import-not-at-top

  accuracies, used = command.evaluate_checkpoint(workdir)
  knn_accuracies = used.pop('knn')
  assert used == {
      'step': 12,
      'image_size': 8,
      'shots': (2,),
      'seeds': 1,
      'l2_reg': 0.01,
      'temperature': 0.5,
  }
  config, _ = run_dir.load_run_info(workdir)
  params, _ = saved_state.restore_params(saved_state.find_checkpoint(workdir)[0])
  mesh = sharding.make_mesh((('data', -1),))
  evaluator = fewshot.FewShotEvaluator(
      'fewshot',
      None,
      config=config,
      model=classification.features_model(config, helpers.model_config(config)),
      mesh=mesh,
      num_classes=10,
      **settings,
  )
  params = jax.device_put(params, sharding.replicated(mesh))
  assert accuracies == evaluator.accuracies(params)
  neighbours = knn.KnnEvaluator(
      'knn',
      None,
      config=config,
      model=classification.features_model(config, helpers.model_config(config)),
      mesh=mesh,
      ks=(3,),
      temperature=0.5,
      **knn_splits,
  )
  assert knn_accuracies == neighbours.accuracies(params)
  neighbours.close()
  _, used = command.evaluate_checkpoint(workdir, l2_reg=4.0, knn=(1,), temperature=0.1)
  assert used['l2_reg'] == 4.0 and list(used['knn']) == [1] and used['temperature'] == 0.1


def test_in_the_loop_shots_a_class_cannot_fill_are_nan_and_the_run_goes_on(
    trained_tiny_run, caplog
):
  # On tfds the class counts are known only once the features are read: the first evaluation.
  config, _ = run_dir.load_run_info(trained_tiny_run)
  params, _ = saved_state.restore_params(saved_state.find_checkpoint(trained_tiny_run)[0])
  mesh = sharding.make_mesh((('data', -1),))
  evaluator = fewshot.FewShotEvaluator(
      'fewshot',
      None,
      config=config,
      model=classification.features_model(config, helpers.model_config(config)),
      mesh=mesh,
      num_classes=10,
      shots=(1, 6),
      seeds=1,
      l2_reg=4.0,
      train_split='train[:40]',
  )  # 1 to 6 images a class.
  params = jax.device_put(params, sharding.replicated(mesh))
  metrics = evaluator(params)
  assert 0.0 <= metrics['1shot'] <= 1.0 and np.isnan(metrics['6shot'])
  assert re.search(
      r"fewshot: class \d of 'train\[:40\]' has \d readable images, too few for 6 "
      'shots: not measured',
      caplog.text,
  )
  with pytest.raises(ValueError, match='readable train examples, fewer than 6 shots'):
    evaluator.accuracies(params)  # The command: a one-line error.


@pytest.mark.parametrize(
    'flag, error',
    [
        (
            '--shots=1,many',
            'error: --shots=1,many must be positive integers, e.g. --shots=1,5,10,25',
        ),
        ('--knn=0,20', 'error: --knn=0,20 must be positive integers, e.g. --knn=10,20'),
        ('--knn=5000', 'error: k=5000 neighbours of 1437 train examples: use 1 <= k <= 1437'),
        (
            '--temperature=inf',
            'error: --temperature=inf must be positive and finite, e.g. --temperature=0.07',
        ),
        ('--l2_reg=nan', 'error: --l2_reg=nan must be positive and finite, e.g. --l2_reg=4'),
        (  # The tiny run measured no k-NN.
            '--temperature=0.1',
            'error: --temperature weighs the k-NN votes, and no k-NN is measured (the run measured '
            'none): add --knn=10,20, or drop --temperature',
        ),
        (
            '--patch_size=3',
            'error: image_size=8 is not a multiple of the patch size 3 (in input pixels): use a '
            'multiple, e.g. 6',
        ),
    ],
)
def test_command_line_bad_shots_or_neighbours_is_one_line(trained_tiny_run, flag, error):
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.fewshot', f'--workdir={trained_tiny_run}', flag],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  assert run.stderr.strip().splitlines() == [error]


def test_the_loop_runs_every_evaluator_on_the_parameters_and_their_polyak_average(
    tmp_path, data_dir
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'polyak_decay': 0.5,
          'fewshot.every_steps': 6,
          'fewshot.shots': (1, 5),
          'fewshot.seeds': 2,
          'knn.every_steps': 6,
          'knn.ks': (1, 10),
      },
  )
  # A minival held out of train beside the test split, and a second few-shot evaluation.
  config.evals.minival = dict(type='classification', split='train[90%:]', every_steps=4)
  config.evals.fewshot_minival = dict(
      type='fewshot',
      every_steps=12,
      shots=(2,),
      seeds=1,
      l2_reg=4.0,
      train_split='train[:90%]',
      eval_split='train[90%:]',
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'run')))
  scalars = helpers.read_scalars(str(tmp_path / 'run'))
  for name in ('fewshot_1shot', 'fewshot_5shot', 'fewshot_polyak_1shot', 'fewshot_polyak_5shot'):
    assert sorted(scalars[name]) == [6, 12], name
  for name in ('minival_top1', 'minival_loss', 'minival_polyak_top1'):
    assert sorted(scalars[name]) == [4, 8, 12], name
  for name in ('knn_1nn', 'knn_10nn', 'knn_polyak_1nn', 'knn_polyak_10nn'):
    assert sorted(scalars[name]) == [6, 12], name
  assert scalars['knn_10nn'][12] > 0.3 and scalars['knn_polyak_10nn'][12] > 0.3
  assert sorted(scalars['fewshot_minival_2shot']) == sorted(scalars['eval_top1']) == [12]
  assert scalars['fewshot_5shot'][12] > 0.3  # Chance is 0.1.
  assert scalars['fewshot_polyak_5shot'][12] > 0.3
  # The Polyak average is another model than the last parameters: the loop measured both.
  assert scalars['eval_polyak_loss'][12] != scalars['eval_loss'][12]
  assert metrics['minival_top1'] == pytest.approx(scalars['minival_top1'][12])


def test_fewshot_shots_beyond_the_data_is_a_clear_error(tmp_path):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': str(tmp_path / 'tfds'),
          'fewshot.every_steps': 6,
          'fewshot.shots': (1, 500),
      },
  )
  with pytest.raises(
      ValueError, match=r'500 shots of 10 classes need more than the 1437 images of .train.'
  ):
    train_setup.prepare(config, str(tmp_path / 'run'))


def test_an_image_folder_class_short_of_shots_is_a_one_line_error_at_the_start(tmp_path):
  rng = np.random.default_rng(0)
  for split in ('train', 'test'):
    for name, count in {'apple': 10, 'bean': 2, 'cherry': 10}.items():
      (tmp_path / 'images' / split / name).mkdir(parents=True)
      for i in range(count):
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
            tmp_path / 'images' / split / name / f'{i}.png'
        )
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'folder',
          'data_dir': str(tmp_path / 'images'),
          'fewshot.every_steps': 6,
          'fewshot.shots': (1, 5),
      },
  )
  with pytest.raises(
      ValueError,
      match=re.escape(
          "1 of the classes of 'train' have fewer than 5 images: " 'bean (2); use fewer shots'
      ),
  ):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()
  config.fewshot.shots = (1, 2)
  train_setup.prepare(config, str(tmp_path / 'run'))


def test_a_fewshot_evaluator_without_splits_reads_the_runs(tmp_path, data_dir):
  # train_split and eval_split are optional (unset: the run's); left out of a config.evals entry they
  # were an AttributeError "'train_split'".
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.fewshot_run = dict(type='fewshot', every_steps=4, shots=(1, 5), seeds=1, l2_reg=4.0)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  (evaluator,) = [e for e in setup.evaluators if e.name == 'fewshot_run']
  assert evaluator.every_steps == 4


@pytest.mark.parametrize(
    'fields, error',
    [
        (
            {'seeds': 3.0},
            r'needs seeds >= 1 \(a whole number\)',
        ),  # Was range(3.0) at the first evaluation.
        (
            {'shots': 5},
            r'shots=5 must be positive numbers of images per class',
        ),  # Was min(5): TypeError.
        (
            {'shots': (1, 2.5)},
            r'shots=\(1, 2.5\) must be positive numbers',
        ),  # Was a slice error, later.
        # True passed as 1 (1 shot, 1 seed, l2 1.0), logged as x_Trueshot.
        ({'shots': (True,)}, r'shots=\(True,\) must be positive numbers'),
        ({'seeds': True}, r'needs seeds >= 1 \(a whole number\) and l2_reg > 0'),
        ({'l2_reg': True}, r'needs seeds >= 1 \(a whole number\) and l2_reg > 0'),
        ({'every_steps': True}, r"^Evaluator 'fewshot_x': every_steps=True must be a number"),
        (  # Was a traceback at its first evaluation, after the run had trained and saved.
            {'eval_split': 'test[:0]'},
            r"^Evaluator 'fewshot_x': split 'test\[:0\]' has no examples: set "
            r'config.evals.fewshot_x.eval_split',
        ),
    ],
)
def test_fewshot_seeds_and_shots_of_the_wrong_type_are_one_line_errors(
    tmp_path, data_dir, fields, error
):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.fewshot_x = {
      'type': 'fewshot',
      'every_steps': 4,
      'shots': (1, 5),
      'seeds': 1,
      'l2_reg': 4.0,
      'train_split': 'train',
      'eval_split': 'test',
      **fields,
  }
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


def test_fewshot_and_knn_at_another_patch_or_image_size_measure_the_resampled_model(
    trained_tiny_run, tmp_path
):
  """config.evals entries of type fewshot / knn with patch_size or image_size (FlexiViT's transfer at
  every patch size): the features of the model fitted as it runs, the numbers of the run fine-tuned
  to that size with no step (resampled once on the host, as config.init_from does)."""
  shots = {'shots': (1, 2), 'seeds': 1, 'l2_reg': 4.0}
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'total_steps': 0, 'init_from': trained_tiny_run, 'keep_head': True}
  )
  config.evals.fs_p2 = dict(type='fewshot', every_steps=1, patch_size=2, **shots)
  config.evals.knn_16 = dict(type='knn', every_steps=1, ks=(5,), image_size=16)
  config.evals.fs = dict(type='fewshot', every_steps=1, **shots)  # At the run's own size.
  measured = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'sized')))
  for name, kind, size_fields, evaluator in (
      ('fs_p2', 'fewshot', {'model.patch_size': 2}, {f'fewshot.{k}': v for k, v in shots.items()}),
      ('knn_16', 'knn', {'image_size': 16}, {'knn.ks': (5,)}),
  ):
    reference = helpers.load_config(
        'demo',
        {
            **helpers.TINY,
            **size_fields,
            **evaluator,
            f'{kind}.every_steps': 1,
            'total_steps': 0,
            'init_from': trained_tiny_run,
            'keep_head': True,
        },
    )
    expected = loop.train_and_evaluate(train_setup.prepare(reference, str(tmp_path / name)))
    metrics = [m for m in expected if m.startswith(f'{kind}_')]
    assert metrics
    for metric in metrics:
      assert measured[metric.replace(kind, name, 1)] == pytest.approx(expected[metric], abs=1e-6)
  # The model at its own size scores otherwise: the size is not ignored.
  assert any(measured[f'fs_p2_{n}shot'] != measured[f'fs_{n}shot'] for n in (1, 2))
  # The command at those sizes: the parameters fitted once on the host, the same numbers.
  from vit_jax.tools import fewshot as command  # pylint: disable=g-import-not-at-top

  accuracies, used = command.evaluate_checkpoint(trained_tiny_run, **shots, patch_size=2, knn=())
  assert used['image_size'] == 8
  for n in (1, 2):
    assert accuracies[n] == pytest.approx(measured[f'fs_p2_{n}shot'], abs=1e-6)
  _, used = command.evaluate_checkpoint(trained_tiny_run, **shots, image_size=16, knn=(5,))
  assert used['image_size'] == 16
  assert used['knn'][5] == pytest.approx(measured['knn_16_5nn'], abs=1e-6)


@pytest.mark.parametrize(
    'fields,message',
    [
        (
            {'type': 'fewshot', 'shots': (1,), 'seeds': 1, 'l2_reg': 4.0, 'patch_size': 3},
            r"^Evaluator 'hi': image_size=8 must be a multiple of the patch size 3",
        ),
        (
            {'type': 'knn', 'image_size': 10},
            r"^Evaluator 'hi': image_size=10 must be a multiple of the patch size 4",
        ),
    ],
)
def test_fewshot_and_knn_sizes_the_patches_do_not_tile_are_one_line_errors(
    tmp_path, fields, message
):
  config = helpers.load_config('demo', helpers.TINY)
  config.evals.hi = dict(every_steps=1, **fields)
  with pytest.raises(ValueError, match=message):
    train_setup.prepare(config, str(tmp_path / 'run'))
