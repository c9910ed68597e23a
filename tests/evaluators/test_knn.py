"""Weighted k-NN evaluation (DINO's): against scikit-learn's neighbours on any mesh, the votes' formula,
the evaluator's checks."""

import numpy as np
import pytest
from sklearn import neighbors

import helpers
import local
from vit_jax import sharding
from vit_jax.evaluators import knn
from vit_jax.train import setup as train_setup


def _overlapping_classes(rng, num_classes, n, dim):
  """Features of clusters that overlap (a k-NN classifier is right about half the time), labels."""
  centres = rng.normal(0, 0.6, (num_classes, dim))
  labels = rng.integers(0, num_classes, n)
  return centres[labels] + rng.normal(0, 1, (n, dim)), labels


def _sklearn_predictions(train_x, train_y, test_x, k, temperature):
  # Cosine distance is 1 - similarity: DINO's weights exp(similarity / T) as a function of it.
  classifier = neighbors.KNeighborsClassifier(
      n_neighbors=k,
      metric='cosine',
      algorithm='brute',
      weights=lambda distance: np.exp((1 - distance) / temperature),
  )
  return classifier.fit(train_x, train_y).predict(test_x)


@pytest.mark.parametrize('axes', [(('data', -1),), (('data', 2), ('fsdp', 4))])
@pytest.mark.parametrize('temperature', [0.07, 1.0])
def test_predictions_are_sklearns_weighted_cosine_neighbours_on_any_mesh(axes, temperature):
  rng = np.random.default_rng(0)
  x, y = _overlapping_classes(rng, 6, 904, 24)
  train_x, train_y, test_x, test_y = x[:701], y[:701], x[701:], y[701:]
  mesh = sharding.make_mesh(axes)
  similarities, indices = knn.nearest(train_x, test_x, 20, mesh)
  accuracies = knn.knn_accuracy(
      train_x, train_y, test_x, test_y, ks=(1, 5, 20), temperature=temperature, mesh=mesh
  )
  for k in (1, 5, 20):
    votes = knn.weighted_votes(similarities[:, :k], train_y[indices[:, :k]], 6, temperature)
    expected = _sklearn_predictions(train_x, train_y, test_x, k, temperature)
    np.testing.assert_array_equal(votes.argmax(-1), expected)
    assert accuracies[k] == np.mean(expected == test_y)
  assert 0.3 < accuracies[20] < 0.9, accuracies  # Mistakes to agree on: a comparison of substance.


def test_neighbours_are_sklearns_across_chunks_and_with_k_beyond_a_devices_share(monkeypatch):
  # 50 train examples over 8 devices: 7 a device, fewer than k = 20 (each device's share is padded);
  # 4 chunks of 16 queries, the last padded.
  monkeypatch.setattr(knn, '_SIMILARITIES_PER_DEVICE', 16 * 20)
  rng = np.random.default_rng(1)
  train_x, test_x = rng.normal(size=(50, 8)), rng.normal(size=(61, 8))
  similarities, indices = knn.nearest(train_x, test_x, 20, sharding.make_mesh((('data', -1),)))
  distances, expected = (
      neighbors.NearestNeighbors(n_neighbors=20, metric='cosine', algorithm='brute')
      .fit(train_x)
      .kneighbors(test_x)
  )
  np.testing.assert_array_equal(indices, expected)
  np.testing.assert_allclose(similarities, 1 - distances, atol=1e-6)
  assert (np.diff(similarities, axis=1) <= 0).all()  # Most similar first.


@pytest.mark.parametrize('mesh', [(('data', -1),), (('data', 2), ('tensor', 4))])
def test_the_evaluator_keeps_the_train_features_where_the_devices_computed_them(data_dir, mesh):
  """The train split's features stay split over the devices of the batch axes (the last batch's
  padding rows marked -1), and measure what the same features on the host do."""
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'knn.every_steps': 4, 'knn.ks': (1, 10)}
  )
  config.mesh = mesh
  evaluator, model = helpers.evaluator(config, 'knn')
  mesh = sharding.make_mesh(config.mesh)
  params = helpers.random_params(model, config.image_size)
  try:
    on_devices, labels = evaluator.features.on_devices(params, 'train')
    host, host_labels = evaluator.features(params, 'train')
    test = evaluator.features(params, 'test')
    measured = evaluator.accuracies(params)
  finally:
    evaluator.close()
  shards = sharding.num_batch_shards(mesh)
  assert {s.data.shape[0] for s in on_devices.addressable_shards} == {len(labels) // shards}
  assert len(labels) > len(host_labels) == (labels >= 0).sum() == 1437  # Padding rows of the last.
  rows = np.asarray(on_devices)[labels >= 0]
  order, host_order = np.lexsort(rows.T), np.lexsort(host.T)  # The same rows, in their own order.
  np.testing.assert_array_equal(rows[order], host[host_order])
  np.testing.assert_array_equal(labels[labels >= 0][order], host_labels[host_order])
  expected = knn.knn_accuracy(host, host_labels, *test, ks=(1, 10), temperature=0.07, mesh=mesh)
  assert measured == pytest.approx(expected, abs=1 / 360) and measured[10] > 0.1


def test_the_temperature_decides_between_one_close_neighbour_and_two_farther_ones():
  similarities = np.array([[0.9, 0.5, 0.45]])
  labels = np.array([[0, 1, 1]])
  # exp(0.9 / T) against exp(0.5 / T) + exp(0.45 / T): the close one wins at 0.07, the two at 1.
  votes = knn.weighted_votes(similarities, labels, 3, 0.07)
  np.testing.assert_allclose(  # Relative to the closest's weight.
      votes * np.exp(0.9 / 0.07),
      [[np.exp(0.9 / 0.07), np.exp(0.5 / 0.07) + np.exp(0.45 / 0.07), 0]],
  )
  assert votes.argmax() == 0
  assert knn.weighted_votes(similarities, labels, 3, 1.0).argmax() == 1
  # Near 0 the closest neighbour decides, where exp(similarity / T) overflows float64 (T < 1/709).
  with np.errstate(over='raise'):
    assert knn.weighted_votes(similarities, labels, 3, 1e-4).argmax() == 0


def test_features_of_any_scale_are_normalised_and_k_beyond_the_train_set_is_an_error():
  rng = np.random.default_rng(2)
  train_x, test_x = rng.normal(size=(30, 5)), rng.normal(size=(9, 5))
  mesh = sharding.make_mesh((('data', -1),))
  scaled = knn.nearest(train_x * rng.uniform(0.1, 100, (30, 1)), test_x * 1e3, 4, mesh)
  for got, expected in zip(scaled, knn.nearest(train_x, test_x, 4, mesh)):
    np.testing.assert_allclose(got, expected, atol=1e-6)
  with pytest.raises(ValueError, match=r'^k=31 neighbours of 30 train examples: use 1 <= k <= 30$'):
    knn.nearest(train_x, test_x, 31, mesh)


@pytest.mark.parametrize(
    'fields, error',
    [
        ({'knn.ks': (0, 20)}, r'^config.knn.ks=\(0, 20\) must be positive numbers of neighbours'),
        ({'knn.ks': (2.5,)}, r'^config.knn.ks=\(2.5,\) must be positive'),
        ({'knn.ks': ()}, r'^config.knn.ks=\(\) must be positive'),
        ({'knn.ks': (True,)}, r'^config.knn.ks=\(True,\) must be positive'),  # Was k=1.
        ({'knn.temperature': 0.0}, r'^config.knn.temperature=0.0 must be > 0, e.g. 0.07'),
        ({'knn.temperature': float('inf')}, r'^config.knn.temperature=inf must be > 0'),
        (
            {'knn.ks': (20, 5000)},
            r"^config.knn.ks=\(20, 5000\): 5000 neighbours of the 1437 images of 'train': "
            r'use fewer, e.g. ks=\(20,\)$',
        ),
        (  # It said "use fewer, e.g. ks=(0,)".
            {'knn.train_split': 'train[:0]'},
            r"^Evaluator 'knn': split 'train\[:0\]' has no examples: set config.knn.train_split",
        ),
        (
            {'knn.eval_split': 'test[:0]'},
            r"^Evaluator 'knn': split 'test\[:0\]' has no examples: set config.knn.eval_split",
        ),
        ({'knn.every_steps': 0}, r"^Evaluator 'knn': every_steps=0 must be a number of steps >= 1"),
    ],
)
def test_bad_knn_settings_are_one_line_errors_before_the_run_starts(
    tmp_path, data_dir, fields, error
):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'knn.every_steps': 4, **fields}
  )
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
    'fields, error',
    [
        (dict(ks=(0,)), r'^config.evals.neighbours.ks=\(0,\) must be positive numbers'),
        (dict(temperature='warm'), r'^config.evals.neighbours.temperature=warm must be > 0'),
        (
            dict(k=20),
            r"^Evaluator 'neighbours' has no field k: its fields are type, every_steps, ks, "
            'temperature',
        ),
    ],
)
def test_bad_settings_of_a_knn_evaluator_in_evals_are_one_line_errors(
    tmp_path, data_dir, fields, error
):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.neighbours = dict(type='knn', every_steps=4, **fields)
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


@pytest.mark.slow  # 40 s: three runs of the tiny model.
def test_one_process_an_fsdp_mesh_and_two_processes_measure_the_same_knn_and_fewshot_accuracy(
    tmp_path, data_dir
):
  """The features come back in the split's order whoever read which rows: a seed's few-shot shots
  are the same examples (two hosts drew other shots, 0.35 for 0.40 at 1 shot)."""
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'data_shards': 2,
      'knn.every_steps': 12,
      'knn.ks': '(1,10,50)',
      'fewshot.every_steps': 12,
      'fewshot.shots': '(1,5)',
  }
  measured = {}
  for name, mesh in [
      ('data8', "(('data', 8),)"),
      ('data2_fsdp4', "(('data', 2), ('fsdp', 4))"),
      ('data4_tensor2', "(('data', 4), ('tensor', 2))"),  # The train features' rows twice each.
  ]:
    workdir = str(tmp_path / name)
    run = helpers.run_main('configs/demo.py', workdir, {**overrides, 'mesh': mesh}, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    measured[name] = helpers.read_scalars(workdir)
  workdir = str(tmp_path / 'two_hosts')
  args = helpers.main_args('configs/demo.py', workdir, overrides)[3:]
  assert local.launch(args, num_processes=2, devices_per_process=4, timeout=600) == 0
  measured['two_hosts'] = helpers.read_scalars(workdir)
  reference = measured['data8']
  assert reference['knn_10nn'][12] > 0.3  # Chance is 0.1.
  for name, scalars in measured.items():
    for k in (1, 10, 50):
      # One image of the 360 may flip where the meshes' sums round otherwise.
      assert scalars[f'knn_{k}nn'] == pytest.approx(reference[f'knn_{k}nn'], abs=1 / 360), name
    for shots in (1, 5):
      assert scalars[f'fewshot_{shots}shot'] == pytest.approx(
          reference[f'fewshot_{shots}shot'], abs=1 / 360
      ), name
