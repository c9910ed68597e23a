"""vit_jax.tools.confusion: each class's precision, recall and F1 (against scikit-learn's), the
confusion matrix, the most confident mistakes named as the run's warnings name examples, and the
command's files and one-line errors."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from sklearn import metrics as sk_metrics

import helpers
from vit_jax.tools import calibration, confusion

COMMAND = [sys.executable, '-m', 'vit_jax.tools.confusion']


def _random_predictions(seed: int, classes: int = 7, n: int = 200) -> confusion.Predictions:
  """Labels of classes 0..classes-2 (the last is never in the split) and class 1 never predicted."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, classes - 1, n)
  probabilities = rng.random((n, classes)).astype(np.float32)
  probabilities[np.arange(n), labels] += rng.random(n) < 0.6  # Mostly right.
  probabilities[:, 1] = 0
  names = tuple(f'class_{c}' for c in range(classes))
  return confusion.Predictions(labels, probabilities, [f'example {i}' for i in range(n)], names)


@pytest.mark.parametrize('seed', range(3))
def test_the_metrics_are_scikit_learns(seed):
  predictions = _random_predictions(seed)
  labels, predicted = predictions.labels, predictions.probabilities.argmax(-1)
  classes = range(len(predictions.class_names))
  counts = confusion.confusion_matrix(predictions)
  np.testing.assert_array_equal(
      counts, sk_metrics.confusion_matrix(labels, predicted, labels=list(classes))
  )
  ours = confusion.per_class(counts)
  theirs = sk_metrics.precision_recall_fscore_support(
      labels, predicted, labels=list(classes), zero_division=0
  )
  for name, values in zip(('precision', 'recall', 'f1', 'support'), theirs):
    np.testing.assert_allclose(ours[name], values, rtol=1e-12, err_msg=name)
  report = sk_metrics.classification_report(labels, predicted, output_dict=True, zero_division=0)
  average = confusion.macro_average(ours, counts)
  for name, key in (('precision', 'precision'), ('recall', 'recall'), ('f1', 'f1-score')):
    assert average[name] == pytest.approx(report['macro avg'][key], rel=1e-12), name
  assert average['accuracy'] == pytest.approx(report['accuracy'], rel=1e-12)


def test_a_label_sets_ap_ranks_confident_logits_as_the_run_does():
  """float32 sigmoids of 25, 20 and 18 are all 1.0: tied, the tool's AP was 0.667 where the run's
  eval_map (and scikit-learn on the logits) is 0.583."""
  from vit_jax.tools import classifiers, label_set_report  # pylint: disable=g-import-not-at-top

  logits = np.array([[25.0], [20.0], [18.0], [-3.0]], np.float32)
  labels = np.array([[False], [True], [True], [False]])
  probabilities = classifiers.probabilities(logits, 'sigmoid_xent')
  assert label_set_report.per_class(labels, probabilities, 0.5)['ap'][0] == pytest.approx(2 / 3)
  ap = label_set_report.per_class(labels, probabilities, 0.5, logits)['ap']
  assert ap[0] == pytest.approx(sk_metrics.average_precision_score(labels[:, 0], logits[:, 0]))
  predictions = confusion.Predictions(labels, probabilities, ['a'] * 4, ('c',), None, logits)
  assert 'mAP 0.5833' in confusion.format_report(predictions, 5)


def test_a_softmax_runs_calibration_is_of_its_logits(trained_tiny_run):
  """The logits kept for calibration are those whose softmax the report's probabilities are, and
  the temperature fit to them lowers their NLL."""
  predictions, _, _ = confusion.predict_split(trained_tiny_run, None, None)
  np.testing.assert_allclose(
      calibration.softmax(predictions.logits), predictions.probabilities, atol=1e-6
  )
  labels = predictions.labels
  temperature = calibration.fit_temperature(predictions.logits, labels)
  assert calibration.nll(predictions.logits, labels, temperature) <= calibration.nll(
      predictions.logits, labels
  )
  assert calibration.summary(predictions.logits, labels) in confusion.format_report(predictions, 3)


def test_mistakes_are_the_wrong_predictions_the_most_confident_first():
  predictions = _random_predictions(0)
  wrong = confusion.mistakes(predictions)
  predicted = predictions.probabilities.argmax(-1)
  assert len(wrong) == int((predicted != predictions.labels).sum())
  probabilities = [p for *_, p in wrong]
  assert probabilities == sorted(probabilities, reverse=True)
  for example, label, guess, probability in wrong:
    i = predictions.examples.index(example)
    assert (label, guess) == (f'class_{predictions.labels[i]}', f'class_{predicted[i]}')
    assert probability == pytest.approx(predictions.probabilities[i].max())


def test_the_runs_predictions_are_its_evaluation(trained_tiny_run):
  """The same model, split and preprocessing as the run's last evaluation: its top-1."""
  predictions, step, split = confusion.predict_split(trained_tiny_run, None, None)
  assert (step, split) == (12, 'test') and len(predictions.labels) == 360
  logged = helpers.read_scalars(trained_tiny_run)['eval_top1'][12]
  counts = confusion.confusion_matrix(predictions)
  assert confusion.macro_average(confusion.per_class(counts), counts)['accuracy'] == pytest.approx(
      logged, abs=1e-6
  )
  assert predictions.class_names == tuple('0123456789')


def _on_folder(run: str, folder: str, tmp_path) -> str:
  """A copy of `run` whose data is `folder` (the same digits as image files), read in threads."""
  workdir = helpers.copy_of(run, tmp_path)
  path = os.path.join(workdir, 'config.json')
  config = json.load(open(path))
  config.update(dataset='folder', data_dir=folder, data_workers=0)
  with open(path, 'w') as f:
    json.dump(config, f)
  return workdir


def test_an_image_folders_mistakes_are_named_by_path_and_unreadable_files_left_out(
    trained_tiny_run, sorted_digits_folder, tmp_path
):
  folder = str(tmp_path / 'digits')
  shutil.copytree(sorted_digits_folder, folder)
  with open(os.path.join(folder, 'test', '3', 'zzzz_broken.png'), 'wb') as f:
    f.write(b'not an image')
  on_digits, _, _ = confusion.predict_split(trained_tiny_run, None, None)
  predictions, _, _ = confusion.predict_split(
      _on_folder(trained_tiny_run, folder, tmp_path), None, None
  )
  assert len(predictions.labels) == 360  # The broken file is skipped, as evaluations skip it.
  assert all(os.path.exists(e) and e.startswith(f'{folder}/test/') for e in predictions.examples)
  for example, label, _, _ in confusion.mistakes(predictions):
    assert f'/test/{label}/' in example
  # The folder holds the digits' own pixels: the same results, class by class.
  np.testing.assert_array_equal(
      confusion.confusion_matrix(predictions), confusion.confusion_matrix(on_digits)
  )


def test_data_whose_classes_changed_since_the_run_is_one_line(
    trained_tiny_run, sorted_digits_folder, tmp_path
):
  """A class renamed after training: its images were reported under the old names, each label
  another class's (rc 0); a class added: an IndexError's traceback."""
  folder = str(tmp_path / 'digits')
  shutil.copytree(sorted_digits_folder, folder)
  workdir = _on_folder(trained_tiny_run, folder, tmp_path)
  for split in ('train', 'test'):
    os.rename(os.path.join(folder, split, '0'), os.path.join(folder, split, 'zero'))
  with pytest.raises(
      ValueError,
      match=r'^the data of the run \(folder at .*\) has changed since it trained: 1 class gone '
      r"\('0'\), 1 class new \('zero'\); its labels would name other classes: restore",
  ):
    confusion.predict_split(workdir, None, None)


def test_a_run_is_evaluated_at_another_size_and_patch_size(trained_tiny_run):
  """--image_size / --patch_size: the split prepared at that size for the model fitted to it."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top

  predictions, _, _ = confusion.predict_split(trained_tiny_run, None, None, 16, 8)
  trained = run_dir.at_size(run_dir.load_trained(trained_tiny_run), 16, 8)
  batch = next(data.eval_iterator(trained.config, 'test', local_batch_size=64))
  assert batch['image'].shape[1:3] == (16, 16)
  logits = trained.model.apply(
      {'params': trained.params}, preprocess.model_input(batch['image']), train=False
  )
  np.testing.assert_allclose(predictions.logits[:64], np.asarray(logits), atol=1e-4)
  assert len(predictions.labels) == 360


def test_the_command_prints_the_classes_and_writes_the_tables(trained_tiny_run, tmp_path):
  out = tmp_path / 'out'
  run = subprocess.run(
      [*COMMAND, f'--workdir={trained_tiny_run}', f'--out={out}', '--top=3'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  lines = run.stdout.splitlines()
  assert lines[0] == f"per-class results of step 12 of {trained_tiny_run} on split 'test':"
  assert lines[1].split() == [
      'class',
      'precision',
      'recall',
      'f1',
      'support',
      'most',
      'taken',
      'for',
  ]
  assert lines[5].startswith('macro avg') and re.match(
      r'accuracy 0\.\d{4} \(\d+ of 360\)', lines[6]
  )
  assert sorted(os.listdir(out)) == [
      'calibration.csv',
      'confusion.csv',
      'confusion.png',
      'mistakes.csv',
      'per_class.csv',
  ]
  assert re.match(
      r'calibration: ECE 0\.\d{4}, NLL \d\.\d{4} \(15 bins of confidence\); at temperature '
      r'\d+\.\d{3} \(of the least NLL on this split: predict --temperature\): ECE 0\.\d{4}, NLL ',
      lines[7],
  ), lines[7]
  bins = (out / 'calibration.csv').read_text().splitlines()
  assert bins[0] == 'lower,upper,examples,confidence,accuracy' and len(bins) == 16
  assert sum(int(row.split(',')[2]) for row in bins[1:]) == 360
  rows = (out / 'per_class.csv').read_text().splitlines()
  assert rows[0] == 'class,precision,recall,f1,support' and len(rows) == 11
  assert sum(int(row.split(',')[-1]) for row in rows[1:]) == 360
  matrix = [row.split(',') for row in (out / 'confusion.csv').read_text().splitlines()]
  assert matrix[0] == ['true \\ predicted', *'0123456789']
  assert sum(int(v) for row in matrix[1:] for v in row[1:]) == 360


@pytest.mark.parametrize(
    'args, message',
    [
        (['--top=0'], r'^error: --top=0 must be at least 1$'),
        (['--split=nope'], r"^error: .*'nope'.*set --split to one of \['train', 'test'\]"),
        (['extra'], r"^error: unexpected arguments \['extra'\]"),
        (['--patch_size=3'], r'^error: image_size=8 is not a multiple of the patch size 3 '),
        (['--threshold=1'], r'^error: --threshold=1.0 must be a probability in \(0, 1\)'),
        (
            ['--threshold=0.3'],
            r'^error: --threshold is for a run on label sets; .*drop --threshold$',
        ),
    ],
)
def test_bad_flags_are_one_line_errors(trained_tiny_run, tmp_path, args, message):
  out = tmp_path / 'out'  # Made before the long part, removed again on bad input.
  run = subprocess.run(
      [*COMMAND, f'--workdir={trained_tiny_run}', f'--out={out}', *args],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
  assert re.search(message, run.stderr.strip()), run.stderr
  assert not out.exists()


def test_a_report_piped_into_a_reader_that_stops_writes_its_files_and_ends_quietly(
    trained_tiny_run, tmp_path
):
  out = tmp_path / 'out'
  status, stderr = helpers.run_piped_into_a_reader_that_stops(
      [*COMMAND, f'--workdir={trained_tiny_run}', f'--out={out}']
  )
  assert status == 0 and stderr == '', stderr[-2000:]
  assert len(os.listdir(out)) == 5
