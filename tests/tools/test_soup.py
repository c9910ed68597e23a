"""vit_jax.tools.soup: a uniform soup is the mean of its checkpoints (low-rank adapters folded), its
scores are the runs' own evaluations, a greedy soup keeps what helps, the soup's directory is read
by the tools and refused by training, and the one-line errors."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import run_dir, saved_state
from vit_jax.models import lora
from vit_jax.runtime import workdir_files
from vit_jax.tools import confusion, soup, soup_ingredients
from vit_jax.tools import runs as runs_lib

# The sweep is trained once, in one worker (a module fixture is set up in each worker its tests go to).
pytestmark = pytest.mark.xdist_group('soup_sweep')
COMMAND = [sys.executable, '-m', 'vit_jax.tools.soup']
# Runs of a sweep, each fine-tuned for 4 steps from the tiny run: another learning rate and seed, and
# one with low-rank adapters (its soup ingredient is the plain model they fold into).
SWEEP = {
    'lr_0.01': {'lr.base': 1e-2, 'seed': 1},
    'lr_0.03': {'lr.base': 3e-2, 'seed': 2},
    'lora': {'lr.base': 3e-2, 'seed': 3, 'model.lora_rank': 4},
}


@pytest.fixture(scope='module')
def sweep(trained_tiny_run, tmp_path_factory):
  from vit_jax.train import loop, setup  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp('soup_sweep')
  for name, overrides in SWEEP.items():
    config = helpers.load_config(
        'demo',
        {
            **helpers.TINY,
            'data_dir': str(root / 'tfds'),
            'init_from': trained_tiny_run,
            'total_steps': 4,
            'eval_every_steps': 4,
            **overrides,
        },
    )
    loop.train_and_evaluate(setup.prepare(config, str(root / 'runs' / name)))
  return str(root / 'runs')


def _folded_params(workdir: str) -> dict[str, np.ndarray]:
  """A run's parameters as restored from its checkpoint, adapters folded (run_dir.load_params)."""
  return helpers.flat_params(run_dir.load_params(workdir)[0])


def test_a_uniform_soup_is_the_mean_of_the_checkpoints(sweep, tmp_path):
  checkpoint_dirs = soup_ingredients.find_ingredients([sweep], None)
  assert [saved_state.workdir_of(d) for d in checkpoint_dirs] == [
      os.path.join(sweep, name) for name in sorted(SWEEP)
  ]
  made = soup.make_soup(checkpoint_dirs, 'uniform')
  assert made.score is None and made.warnings == []
  soup.write(str(tmp_path / 'soup'), made, 'uniform')
  # Written inside the sweep's root, it is not one of the sweep's runs; named, it is an input.
  soup.write(os.path.join(sweep, 'soup'), made, 'uniform')
  try:
    assert soup_ingredients.find_ingredients([sweep], None) == checkpoint_dirs
    assert len(soup_ingredients.find_ingredients([sweep, os.path.join(sweep, 'soup')], None)) == 4
    # Nor one of report's runs (it listed an empty row, and --pivot met the first run twice).
    assert [name for name, _ in runs_lib.find_runs([sweep])] == sorted(SWEEP)
  finally:
    shutil.rmtree(os.path.join(sweep, 'soup'))
  runs = [_folded_params(os.path.join(sweep, name)) for name in SWEEP]
  lora_checkpoint = saved_state.find_checkpoint(os.path.join(sweep, 'lora'))[0]
  assert lora.has_adapters(saved_state.restore_params(lora_checkpoint)[0])
  trained = run_dir.load_trained(str(tmp_path / 'soup'))
  assert trained.parameters == 'raw' and trained.step == 4
  assert trained.model_config['lora_rank'] is None  # The plain model the adapters fold into.
  written = helpers.flat_params(trained.params)
  assert written.keys() == runs[0].keys()
  for name, value in written.items():
    np.testing.assert_allclose(
        value, np.mean([run[name] for run in runs], 0), atol=1e-7, err_msg=name
    )
  # Runs without adapters: the soup's adapter fields stay unset as theirs (report showed them as
  # differing config of every run).
  plain = soup.make_soup([d for d in checkpoint_dirs if '/lora/' not in d], 'uniform')
  soup.write(str(tmp_path / 'plain_soup'), plain, 'uniform')
  model = json.load(open(tmp_path / 'plain_soup' / 'config.json'))['model']
  assert model['lora_targets'] is None and model['lora_dropout'] is None
  # What config.init_from reads from it is the same.
  for name, value in helpers.flat_params(run_dir.load_params(str(tmp_path / 'soup'))[0]).items():
    np.testing.assert_array_equal(value, written[name], err_msg=name)


def test_the_scores_are_the_runs_evaluations(sweep, tmp_path):
  """Each checkpoint's score on the test split is its run's eval_top1, and the soup's is what the
  confusion tool measures of the written soup."""
  made = soup.make_soup(soup_ingredients.find_ingredients([sweep], None), 'uniform', 'test')
  assert made.split == 'test' and all(t.in_soup for t in made.ingredients)
  for tasted in made.ingredients:
    logged = helpers.read_scalars(saved_state.workdir_of(tasted.checkpoint_dir))['eval_top1'][4]
    assert tasted.score == pytest.approx(logged, abs=1e-6), tasted.checkpoint_dir
  assert len({t.score for t in made.ingredients}) > 1  # The runs differ.
  soup.write(str(tmp_path / 'soup'), made, 'uniform')
  predictions, step, _ = confusion.predict_split(str(tmp_path / 'soup'), None, 'test')
  counts = confusion.confusion_matrix(predictions)
  accuracy = confusion.macro_average(confusion.per_class(counts), counts)['accuracy']
  assert step == 4 and made.score == pytest.approx(accuracy, abs=1e-6)
  record = json.loads((tmp_path / 'soup' / workdir_files.SOUP).read_text())
  assert record['score'] == made.score and record['metric'] == 'top1'
  assert [i['score'] for i in record['ingredients']] == [t.score for t in made.ingredients]


def test_a_report_split_scores_the_inputs_and_the_soup_and_decides_nothing(sweep, tmp_path):
  """A greedy soup picked on the train split, reported on the test split: each input's report is
  its run's eval_top1, the soup's what the confusion tool measures of it; the same soup as without
  the report split."""
  checkpoint_dirs = soup_ingredients.find_ingredients([sweep], None)
  made = soup.make_soup(checkpoint_dirs, 'greedy', 'train', report_split='test')
  alone = soup.make_soup(checkpoint_dirs, 'greedy', 'train')
  assert [t.in_soup for t in made.ingredients] == [t.in_soup for t in alone.ingredients]
  assert made.score == alone.score and alone.reported is None
  for tasted in made.ingredients:
    logged = helpers.read_scalars(saved_state.workdir_of(tasted.checkpoint_dir))['eval_top1'][4]
    assert tasted.reported == pytest.approx(logged, abs=1e-6), tasted.checkpoint_dir
  soup.write(str(tmp_path / 'soup'), made, 'greedy')
  predictions, _, _ = confusion.predict_split(str(tmp_path / 'soup'), None, 'test')
  assert made.reported == pytest.approx(
      np.mean(predictions.probabilities.argmax(-1) == predictions.labels), abs=1e-6
  )
  record = json.loads((tmp_path / 'soup' / workdir_files.SOUP).read_text())
  assert (record['report_split'], record['reported']) == ('test', made.reported)
  assert (
      soup.format_report(made, 'greedy')
      .splitlines()[-1]
      .endswith(f"top-1 {made.reported:.4f} on split 'test' (reported)")
  )
  with pytest.raises(ValueError, match=r'^--report_split=train is the split the soup is scored on'):
    soup.make_soup(checkpoint_dirs, 'greedy', 'train', report_split='train')


def test_a_greedy_soup_adds_in_order_of_score_what_does_not_lower_it(trained_tiny_run, monkeypatch):
  """Checkpoints of one parameter w, scored -|w - 1|: 1.05 first, then 0.9 (0.975 scores better),
  not 1.2 (1.05 scores worse than 0.975) nor 5."""
  real = run_dir.load_trained(trained_tiny_run)
  values = {'a': 1.2, 'b': 0.9, 'c': 5.0, 'd': 1.05}
  monkeypatch.setattr(
      soup,
      'load',
      lambda name: dataclasses.replace(
          real, params={'w': np.float32([values[name]])}, checkpoint_dir=name
      ),
  )
  scored = []

  def scorer(trained, split):
    assert (trained.checkpoint_dir, split) == ('a', real.config.eval_split)
    return lambda params: scored.append(params['w'][0]) or -abs(float(params['w'][0]) - 1)

  monkeypatch.setattr(soup.classifiers, 'split_scorer', scorer)
  made = soup.make_soup(list(values), 'greedy')
  assert [t.in_soup for t in made.ingredients] == [False, True, False, True]
  assert [t.score for t in made.ingredients] == pytest.approx([-0.2, -0.1, -4.0, -0.05])
  assert made.model.checkpoint_dir == 'd'  # The best's run is the soup's.
  assert [t.with_it for t in made.ingredients] == pytest.approx(
      [-0.05, -0.025, -1.3166667, None], abs=1e-6
  )
  assert made.model.params['w'] == pytest.approx([0.975], abs=1e-6)
  assert made.score == pytest.approx(-0.025, abs=1e-6)
  # Each alone, then with 0.9, with 1.2, with 5; the soup scored again as it is written.
  assert scored == pytest.approx([1.2, 0.9, 5.0, 1.05, 0.975, 1.05, 2.3166667, 0.975], abs=1e-6)


def test_a_greedy_soup_of_runs_is_no_worse_than_its_best(sweep, tmp_path):
  made = soup.make_soup(soup_ingredients.find_ingredients([sweep], None), 'greedy')
  best = max(made.ingredients, key=lambda t: t.score)
  assert best.in_soup and made.score >= best.score
  assert made.model.checkpoint_dir == best.checkpoint_dir
  in_soup = [_folded_params(t.checkpoint_dir) for t in made.ingredients if t.in_soup]
  for name, value in helpers.flat_params(made.model.params).items():
    np.testing.assert_allclose(value, np.mean([p[name] for p in in_soup], 0), atol=1e-7)


def test_other_models_are_refused_in_one_line(trained_tiny_run):
  real = run_dir.load_trained(trained_tiny_run)
  deeper = real.config.copy_and_resolve_references()
  deeper.model.num_layers = 3
  for other, says in (
      (
          dataclasses.replace(
              real, config=deeper, model_config={**real.model_config, 'num_layers': 3}
          ),
          'model.num_layers: 3 here, 2 there',
      ),
      (
          dataclasses.replace(real, model_config={**real.model_config, 'classifier': 'gap'}),
          "model.classifier: 'gap' here, 'token' there",
      ),
      (
          dataclasses.replace(
              real, info=dataclasses.replace(real.info, class_names=tuple('abcdefghij'))
          ),
          'class names',
      ),
      (
          dataclasses.replace(real, params={**real.params, 'extra': np.zeros(1)}),
          "parameter extra: (1,) here, 'none' there",
      ),
  ):
    with pytest.raises(ValueError, match='is not the model of') as error:
      soup_ingredients.check_same_model(real, dataclasses.replace(other, checkpoint_dir='other'))
    assert says in str(error.value) and '\n' not in str(error.value)


def test_a_step_beside_checkpoint_directories_is_refused_in_one_line(trained_tiny_run):
  checkpoint = os.path.join(trained_tiny_run, 'checkpoints', '12')
  with pytest.raises(
      ValueError,
      match=f'^--step=8 picks a checkpoint of each run, and {checkpoint} is a checkpoint',
  ):
    soup_ingredients.find_ingredients([checkpoint, trained_tiny_run], '8')


def test_runs_of_another_start_are_warned_of(trained_tiny_run, sweep):
  """The sweep's runs start from the tiny run's checkpoint; the tiny run from scratch."""
  checkpoint_dirs = soup_ingredients.find_ingredients(
      [trained_tiny_run, os.path.join(sweep, 'lr_0.01')], None
  )
  made = soup.make_soup(checkpoint_dirs, 'uniform')
  assert len(made.warnings) == 1 and 'config.init_from' in made.warnings[0]
  # Checkpoints of one run started from the same parameters, whatever its init_from.
  one_run = soup_ingredients.find_ingredients(
      [os.path.join(trained_tiny_run, 'checkpoints', step) for step in ('8', '12')], None
  )
  assert soup.make_soup(one_run, 'uniform').warnings == []


def test_two_runs_from_scratch_are_warned_of_as_such(trained_tiny_run, tmp_path):
  shutil.copytree(trained_tiny_run, tmp_path / 'again')
  checkpoint_dirs = soup_ingredients.find_ingredients(
      [trained_tiny_run, str(tmp_path / 'again')], None
  )
  [warning] = soup.make_soup(checkpoint_dirs, 'uniform').warnings
  assert ' are two runs trained from scratch (no config.init_from): the average' in warning


def test_training_in_a_soup_is_refused(trained_tiny_run, tmp_path):
  from vit_jax.train import setup  # pylint: disable=g-import-not-at-top

  out = str(tmp_path / 'soup')
  soup.write(
      out,
      soup.make_soup(
          soup_ingredients.find_ingredients(
              [os.path.join(trained_tiny_run, 'checkpoints', s) for s in ('8', '12')], None
          ),
          'uniform',
      ),
      'uniform',
  )
  before = helpers.files_of(out)
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': str(tmp_path / 'tfds')})
  with pytest.raises(
      ValueError, match=f'--workdir={out} holds a model soup .*--config.init_from={out}'
  ):
    setup.prepare(config, out)
  assert helpers.files_of(out) == before


@pytest.mark.slow  # The command and predict in processes of their own: make test-all's.
def test_the_command(trained_tiny_run, sweep, tmp_path):
  """A greedy soup of a sweep's root, read by predict; then the one-line errors."""
  out = str(tmp_path / 'soup')
  done = subprocess.run(
      [*COMMAND, f'--out={out}', '--recipe=greedy', sweep],
      capture_output=True,
      text=True,
      cwd=helpers.REPO,
  )
  assert done.returncode == 0, done.stderr
  lines = done.stdout.splitlines()
  for line, name in zip(lines, sorted(SWEEP)):
    assert re.match(rf'(in |out)  {sweep}/{name}/checkpoints/4  top-1 0\.\d{{4}}', line), line
  assert re.match(
      r"greedy soup of [123] of 3 checkpoints: top-1 0\.\d{4} on split 'test'$", lines[3]
  ), lines[3]
  assert lines[4] == f'wrote {out}/checkpoints/4: read it with --workdir={out}'
  checkpoints = [os.path.join(trained_tiny_run, 'checkpoints', s) for s in ('8', '12')]
  image = os.path.join(tmp_path, 'digit.png')
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  Image.fromarray(digits.split_arrays()['test'][0][0]).save(image)
  predicted = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.predict', f'--workdir={out}', image],
      capture_output=True,
      text=True,
      cwd=helpers.REPO,
  )
  assert predicted.returncode == 0 and predicted.stdout.startswith(image), predicted.stderr
  for args, says in (
      ([f'--out={out}', *checkpoints], f'--out={out} is not an empty directory: name a new one'),
      (
          [f'--out={tmp_path}/new', checkpoints[0]],
          'a soup averages two or more checkpoints, and',
      ),
      ([f'--out={tmp_path}/new', checkpoints[0], checkpoints[0]], 'is named twice'),
      ([f'--out={tmp_path}/new'], 'no runs or checkpoints given: use --out=DIR'),
      (
          [f'--out={tmp_path}/new', checkpoints[0], str(tmp_path / 'missing')],
          'does not exist: pass run workdirs or the root of a sweep',
      ),
      (
          [f'--out={tmp_path}/new', '--recipe=best', *checkpoints],
          'flag --recipe=best: value should be one of <uniform|greedy>',
      ),
  ):
    failed = subprocess.run([*COMMAND, *args], capture_output=True, text=True, cwd=helpers.REPO)
    assert (
        failed.returncode == 2 and failed.stderr.startswith('error: ') and says in failed.stderr
    ), (args, failed.stderr)
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr
  assert not os.path.exists(f'{tmp_path}/new')
