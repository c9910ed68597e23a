"""The confusion tool on a run of label sets (multi-label): each class's AP, precision, recall and F1
at a threshold and its threshold of the best F1 against scikit-learn's, the mistakes, the command's
report and files, and predict's label sets at those thresholds."""

import os
import subprocess
import sys

import numpy as np
from PIL import Image
import pytest
from sklearn import metrics as sk_metrics

import helpers
from vit_jax.tools import confusion, label_set_report
from vit_jax.train import loop, setup as train_setup

pytest.importorskip('datasets')


@pytest.fixture(scope='module')
def label_set_run(tmp_path_factory):
  """The workdir of a 12-step tiny run on the digits' label sets (a Parquet list column)."""
  root = tmp_path_factory.mktemp('label_set_run')
  config = helpers.load_config('demo', helpers.label_set_digits_parquet(root / 'data_root'))
  loop.train_and_evaluate(train_setup.prepare(config, str(root / 'run')))
  return str(root / 'run')


@pytest.mark.parametrize('threshold', [0.3, 0.5])
def test_the_metrics_are_scikit_learns(threshold):
  rng = np.random.default_rng(0)
  labels = rng.random((300, 9)) < 0.3
  labels[:, 8] = False  # A class without a positive: no AP, precision 0 where it is predicted.
  probabilities = np.clip(0.4 * labels + 0.7 * rng.random(labels.shape), 0, 1).astype(np.float32)
  predicted = probabilities >= threshold
  ours = label_set_report.per_class(labels, probabilities, threshold)
  theirs = sk_metrics.precision_recall_fscore_support(labels, predicted, zero_division=0)
  for name, values in zip(('precision', 'recall', 'f1', 'support'), theirs):
    np.testing.assert_allclose(ours[name], values, err_msg=name)
  np.testing.assert_allclose(
      ours['ap'][:8],
      [sk_metrics.average_precision_score(labels[:, c], probabilities[:, c]) for c in range(8)],
  )
  assert np.isnan(ours['ap'][8])
  average = label_set_report.averages(ours, labels, probabilities, threshold)
  macro = sk_metrics.precision_recall_fscore_support(
      labels, predicted, average='macro', zero_division=0
  )
  assert [average[m] for m in ('precision', 'recall', 'f1')] == pytest.approx(macro[:3])
  assert average['subset_accuracy'] == pytest.approx(sk_metrics.accuracy_score(labels, predicted))
  assert average['map'] == pytest.approx(np.mean(ours['ap'][:8]))


def test_mistakes_are_the_wrong_decisions_the_most_confident_first():
  labels = np.array([[True, False, False], [False, True, True]])
  probabilities = np.array([[0.9, 0.8, 0.1], [0.45, 0.05, 0.7]])
  assert label_set_report.mistakes(labels, probabilities, 0.5) == [
      (1, 1, 'missed', pytest.approx(0.05)),
      (0, 1, 'wrong', pytest.approx(0.8)),
  ]


def test_the_command_reports_a_label_set_run(label_set_run, tmp_path):
  predictions, _, _ = confusion.predict_split(label_set_run, None, None)
  assert predictions.labels.shape == (360, 12) and predictions.labels.dtype == bool
  out = tmp_path / 'out'
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.confusion',
          f'--workdir={label_set_run}',
          f'--out={out}',
          '--top=3',
          '--threshold=0.3',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  lines = run.stdout.splitlines()
  assert lines[1].split() == ['class', 'ap', 'precision', 'recall', 'f1', 'support']
  assert lines[5].startswith('macro avg')
  assert lines[6].startswith('mAP ') and lines[6].endswith(
      'a class predicted at a probability >= 0.3'
  )
  assert lines[7].startswith('macro F1 ') and "at each class's threshold of its best F1" in lines[7]
  assert sorted(os.listdir(out)) == ['mistakes.csv', 'per_class.csv', 'thresholds.csv']
  rows = [row.split(',') for row in (out / 'per_class.csv').read_text().splitlines()]
  assert rows[0] == ['class', 'ap', 'precision', 'recall', 'f1', 'support'] and len(rows) == 13
  predicted = predictions.probabilities >= 0.3
  recall = sk_metrics.recall_score(predictions.labels, predicted, average=None, zero_division=0)
  np.testing.assert_allclose([float(row[3]) for row in rows[1:]], recall, atol=1e-6)
  assert [int(row[5]) for row in rows[1:]] == predictions.labels.sum(0).tolist()
  mistakes = (out / 'mistakes.csv').read_text().splitlines()
  assert mistakes[0] == 'example,class,mistake,probability'
  assert len(mistakes) - 1 == int(np.sum(predicted != predictions.labels))


def test_each_class_threshold_of_the_best_f1_is_scikit_learns():
  rng = np.random.default_rng(1)
  for examples, ties in ((60, None), (400, 8)):
    probabilities = rng.random((examples, 9)).astype(np.float32)
    if ties:  # Equal probabilities are predicted together: only the last of them is a threshold.
      probabilities = np.round(probabilities * ties) / ties
    labels = rng.random((examples, 9)) < 0.3
    labels[:, -1] = False
    thresholds, f1 = label_set_report.f1_thresholds(labels, probabilities)
    assert np.isinf(thresholds[-1]) and f1[-1] == 0
    for c in range(8):
      precision, recall, _ = sk_metrics.precision_recall_curve(labels[:, c], probabilities[:, c])
      with np.errstate(invalid='ignore'):
        best = np.nanmax(2 * precision * recall / (precision + recall))
      assert f1[c] == pytest.approx(best)
      assert sk_metrics.f1_score(labels[:, c], probabilities[:, c] >= thresholds[c]) == (
          pytest.approx(f1[c])
      )


def test_predict_prints_the_classes_at_their_thresholds(label_set_run, tmp_path):
  """thresholds.csv of the confusion tool, read by predict: each image's classes at or above their
  threshold, as the thresholds pick them from the probabilities predict prints for every class."""
  from vit_jax.tools import classifiers, predict  # pylint: disable=g-import-not-at-top

  predictions, _, _ = confusion.predict_split(label_set_run, None, None)
  out = str(tmp_path)
  confusion.write_files(predictions, out)
  classifier = classifiers.load_run(label_set_run)
  thresholds = label_set_report.read_thresholds(
      os.path.join(out, 'thresholds.csv'), classifier.class_names
  )
  expected, _ = label_set_report.f1_thresholds(predictions.labels, predictions.probabilities)
  np.testing.assert_allclose(thresholds, expected, rtol=1e-7)
  images = tmp_path / 'images'
  images.mkdir()
  rng = np.random.default_rng(0)
  for k in range(3):
    Image.fromarray(rng.integers(0, 256, (8, 8, 3), np.uint8)).save(images / f'{k}.png')
  paths = predict.find_images([str(images)])
  all_probs = {path: dict(top) for path, top in predict.predict(paths, classifier, top_k=12)}
  for path, chosen in predict.predict(paths, classifier, thresholds=thresholds):
    names = [name for name, _ in chosen]
    expected_names = [
        name
        for name, p in sorted(all_probs[path].items(), key=lambda item: -item[1])
        if p >= thresholds[classifier.class_names.index(name)]
    ]
    assert names == expected_names
  with pytest.raises(ValueError, match=r'holds thresholds of 12 classes, not of this model.s 3'):
    label_set_report.read_thresholds(os.path.join(out, 'thresholds.csv'), ('a', 'b', 'c'))
  # Above every probability: no class, said so.
  (none,) = predict.predict(paths[:1], classifier, thresholds=np.full(12, np.inf))
  assert predict.format_prediction(*none) == f'{paths[0]}\n  no class'
  edited = tmp_path / 'edited.csv'
  edited.write_text('class,threshold\n' + ''.join(f'{n},nan\n' for n in classifier.class_names))
  with pytest.raises(ValueError, match=r'holds thresholds that are no probability \(.*: nan'):
    label_set_report.read_thresholds(str(edited), classifier.class_names)
  with pytest.raises(
      ValueError, match=r'^--threshold picks a set of classes an image, .*softmax_xent'
  ):
    label_set_report.prediction_thresholds('softmax_xent', ('a', 'b'), 0.5, None)


def test_a_soup_of_label_set_checkpoints_is_scored_by_its_mean_ap(label_set_run):
  """The soup tool's score of a run on label sets is scikit-learn's mean AP over the classes with a
  positive, of the confusion tool's probabilities; at the step the run evaluated, its eval_map."""
  from vit_jax.tools import soup  # pylint: disable=g-import-not-at-top

  checkpoints = [os.path.join(label_set_run, 'checkpoints', step) for step in ('8', '12')]
  made = soup.make_soup(checkpoints, 'uniform', 'test')
  for tasted in made.ingredients:
    predictions, _, _ = confusion.predict_split(label_set_run, tasted.step, 'test')
    labels = predictions.labels
    aps = [
        sk_metrics.average_precision_score(labels[:, c], predictions.probabilities[:, c])
        for c in range(labels.shape[1])
        if labels[:, c].any()
    ]
    # The soup ranks by logits; float32 sigmoids tie a few of them, which AP counts together.
    assert tasted.score == pytest.approx(np.mean(aps), abs=1e-4), tasted.step
  logged = helpers.read_scalars(label_set_run)['eval_map'][12]
  # The run's logits came from 8 devices: rounded otherwise, a near tie may rank the other way.
  assert made.ingredients[1].score == pytest.approx(logged, abs=2e-5)
  assert (
      soup.format_report(made, 'uniform')
      .splitlines()[-1]
      .startswith('uniform soup of 2 of 2 checkpoints: mAP 0.')
  )


def test_a_sigmoid_trained_model_has_no_temperature(label_set_run, tmp_path):
  predictions, _, _ = confusion.predict_split(label_set_run, None, None)
  assert predictions.logits is None  # No softmax to calibrate: the report says nothing of it.
  Image.new('RGB', (8, 8)).save(tmp_path / 'x.png')
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.predict',
          f'--workdir={label_set_run}',
          '--temperature=2',
          str(tmp_path / 'x.png'),
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2 and run.stderr.strip() == (
      'error: --temperature calibrates a softmax, and this model was trained with loss '
      "'sigmoid_xent' (a sigmoid a class): drop --temperature"
  )
