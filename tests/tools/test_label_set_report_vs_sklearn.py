"""The confusion tool on a run of label sets (multi-label): each class's AP, precision, recall and F1
at a threshold against scikit-learn's, the mistakes, and the command's report and files."""

import os
import subprocess
import sys

import numpy as np
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
  assert sorted(os.listdir(out)) == ['mistakes.csv', 'per_class.csv']
  rows = [row.split(',') for row in (out / 'per_class.csv').read_text().splitlines()]
  assert rows[0] == ['class', 'ap', 'precision', 'recall', 'f1', 'support'] and len(rows) == 13
  predicted = predictions.probabilities >= 0.3
  recall = sk_metrics.recall_score(predictions.labels, predicted, average=None, zero_division=0)
  np.testing.assert_allclose([float(row[3]) for row in rows[1:]], recall, atol=1e-6)
  assert [int(row[5]) for row in rows[1:]] == predictions.labels.sum(0).tolist()
  mistakes = (out / 'mistakes.csv').read_text().splitlines()
  assert mistakes[0] == 'example,class,mistake,probability'
  assert len(mistakes) - 1 == int(np.sum(predicted != predictions.labels))
