"""python -m vit_jax.tools.report: the curves and the table of runs, from TensorBoard event files written here
with tf.summary (as clu writes them) beside a config.json like a real run's, and from one real run.
"""

import base64
import math
import os
import re
import shutil
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.tools import report
from vit_jax.tools.runs import find_runs, load_run, Run
from vit_jax.train import events

REPORT_CMD = [sys.executable, '-m', 'vit_jax.tools.report']

# Three runs of a sweep over lr.base x total_steps, as launch/sweep.py names their workdirs. The third
# is still going: it has logged up to step 30 and evaluated once.
EVALS = {
    'lr.base=0.001,total_steps=50': {
        'eval_top1': {25: 0.75, 50: 0.5},
        'eval_loss': {25: 1.5, 50: 2.0},
    },
    'lr.base=0.003,total_steps=50': {
        'eval_top1': {25: 0.25, 50: 0.625},
        'eval_loss': {25: 2.5, 50: 1.25},
    },
    'lr.base=0.003,total_steps=100': {'eval_top1': {25: 0.375}, 'eval_loss': {25: 3.0}},
}
LAST_STEPS = {
    'lr.base=0.001,total_steps=50': 50,
    'lr.base=0.003,total_steps=50': 50,
    'lr.base=0.003,total_steps=100': 30,
}


def _write_events(workdir: str, scalars: dict[str, dict[int, float]]) -> None:
  """Scalars step by step, each step's in one write, as the training loop logs them."""
  tf = helpers.tensorflow()
  writer = tf.summary.create_file_writer(workdir)
  with writer.as_default():
    for step in sorted({s for values in scalars.values() for s in values}):
      for tag, values in scalars.items():
        if step in values:
          tf.summary.scalar(tag, values[step], step=step)
  writer.close()


def _write_run(
    workdir: str, lr: float, total_steps: int, last_step: int, evals: dict[str, dict[int, float]]
) -> None:
  os.makedirs(workdir)
  config = helpers.load_config('demo', {'lr.base': lr, 'total_steps': total_steps})
  with open(os.path.join(workdir, 'config.json'), 'w') as f:
    f.write(
        config.to_json_best_effort(indent=2)
    )  # As vit_jax.checkpoints.run_dir.write_run_info writes it.
  steps = range(10, last_step + 1, 10)
  _write_events(
      workdir,
      {
          'train_loss': {s: 2.0 - s / (10 * total_steps) for s in steps},
          'learning_rate': {s: lr * (1 - s / total_steps) for s in steps},
          'grad_norm': {s: 1.0 for s in steps},
          'steps_per_sec': {s: 100.0 for s in steps},
          **evals,
      },
  )


@pytest.fixture(scope='module')
def sweep_root(tmp_path_factory):
  root = str(tmp_path_factory.mktemp('sweep'))
  for name, evals in EVALS.items():
    lr, total_steps = re.fullmatch(r'lr.base=(.*),total_steps=(.*)', name).groups()
    _write_run(os.path.join(root, name), float(lr), int(total_steps), LAST_STEPS[name], evals)
  return root


def _tf_scalars(workdir: str) -> dict[str, dict[int, float]]:
  """TensorFlow's own reading of the event files: what the report's reader must agree with."""
  tf = helpers.tensorflow()
  scalars = {}
  for name in sorted(os.listdir(workdir)):
    if name.startswith('events.out.tfevents.'):
      for event in tf.compat.v1.train.summary_iterator(os.path.join(workdir, name)):
        for value in event.summary.value:
          if value.metadata.plugin_data.plugin_name == 'scalars':
            scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
  return scalars


def _html_cells(path: str) -> list[list[str]]:
  with open(path) as f:
    rows = re.findall(r'<tr>(.*?)</tr>', f.read())
  return [re.findall(r'<t[hd]>(.*?)</t[hd]>', row) for row in rows]


def _run_colors(n: int) -> list[np.ndarray]:
  return [
      np.round(np.array(c) * 255).astype(np.uint8) for c in matplotlib.colormaps['tab10'].colors[:n]
  ]


def test_table_has_each_runs_overrides_last_step_and_final_and_best_eval_metrics(sweep_root):
  runs = [load_run(name, path) for name, path in find_runs([sweep_root])]
  rows = report.table(runs)
  assert [row['run'] for row in rows] == sorted(EVALS)
  assert list(rows[0]) == [
      'run',
      'differing config',
      'last step',
      'eval_loss final',
      'eval_loss best',
      'eval_top1 final',
      'eval_top1 best',
  ]
  for row in rows:
    lr, total_steps = re.fullmatch(r'lr.base=(.*),total_steps=(.*)', row['run']).groups()
    # config.json holds the whole config: the fields the runs differ in are the sweep's overrides.
    assert row['differing config'] == {'lr.base': float(lr), 'total_steps': int(total_steps)}
    assert row['last step'] == LAST_STEPS[row['run']]
    for metric, values in EVALS[row['run']].items():
      assert row[f'{metric} final'] == values[max(values)]
      # Accuracy: the greatest; loss: the least (the final value is neither for the first two runs).
      assert row[f'{metric} best'] == (min if 'loss' in metric else max)(values.values())
  assert rows[0]['eval_top1 best'] == 0.75 and rows[0]['eval_loss best'] == 1.5
  assert report.panels(runs) == ['train_loss', 'learning_rate', 'eval_loss', 'eval_top1']


def test_best_is_the_least_loss_and_the_greatest_of_any_other_metric():
  assert report.best('eval_polyak_loss', [2.0, 1.0, math.nan]) == 1.0
  assert report.best('lossy_test_top1', [0.5, 0.75]) == 0.75  # An evaluator named 'lossy_test'.
  assert report.best('fewshot_5shot', [0.5, math.inf, 0.25]) == 0.5


def test_command_line_writes_the_picture_and_the_page_and_prints_only_their_paths(
    sweep_root, tmp_path
):
  out = tmp_path / 'out'
  run = subprocess.run(
      [*REPORT_CMD, sweep_root, f'--out={out}'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.splitlines() == [f'{out}/report.png', f'{out}/report.html']
  # No TensorFlow or absl banners (matplotlib speaks once per machine, when it builds its font cache).
  assert [line for line in run.stderr.splitlines() if 'font cache' not in line] == []

  image = np.asarray(Image.open(out / 'report.png').convert('RGB'))
  width, height = report.figure_inches(4, 3)  # 4 panels in 2 rows of 3, 3 runs in the legend.
  assert image.shape == (round(height * report.DPI), round(width * report.DPI), 3)
  present = [np.all(image == color, axis=-1).any() for color in _run_colors(4)]
  assert present == [True, True, True, False]  # A colour a run, no fourth.
  assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50

  with open(out / 'report.html') as f:
    page = f.read()
  png = base64.b64encode((out / 'report.png').read_bytes()).decode()
  assert f'src="data:image/png;base64,{png}"' in page
  assert _html_cells(str(out / 'report.html')) == [
      [
          'run',
          'differing config',
          'last step',
          'eval_loss final',
          'eval_loss best',
          'eval_top1 final',
          'eval_top1 best',
      ],
      [
          'lr.base=0.001,total_steps=50',
          'lr.base=0.001, total_steps=50',
          '50',
          '2',
          '1.5',
          '0.5',
          '0.75',
      ],
      [
          'lr.base=0.003,total_steps=100',
          'lr.base=0.003, total_steps=100',
          '30',
          '3',
          '3',
          '0.375',
          '0.375',
      ],
      [
          'lr.base=0.003,total_steps=50',
          'lr.base=0.003, total_steps=50',
          '50',
          '1.25',
          '1.25',
          '0.625',
          '0.625',
      ],
  ]


def test_a_sweep_root_expands_to_its_runs_and_a_workdir_is_one_run(sweep_root, tmp_path):
  found = find_runs([sweep_root])
  assert found == [(name, report.epath.Path(sweep_root) / name) for name in sorted(EVALS)]
  one = os.path.join(sweep_root, 'lr.base=0.001,total_steps=50')
  assert find_runs([one]) == [('lr.base=0.001,total_steps=50', report.epath.Path(one))]
  # Sweeps under a root: paths under it; runs named alike in two roots: their full paths.
  for group in ('a', 'b'):
    shutil.copytree(one, tmp_path / 'root' / group / 'run')
  # An export beside them (the walk-through's exported/demo) is no run: its config.json is its own.
  (tmp_path / 'root' / 'exported' / 'demo').mkdir(parents=True)
  for name in ('config.json', 'model.npz', 'model.jaxexport', 'timm/config.json', 'peft/x.json'):
    (tmp_path / 'root' / 'exported' / 'demo' / name).parent.mkdir(exist_ok=True)
    (tmp_path / 'root' / 'exported' / 'demo' / name).write_text('{}')
  assert [name for name, _ in find_runs([str(tmp_path / 'root')])] == ['a/run', 'b/run']
  assert [name for name, _ in find_runs([str(tmp_path / 'root' / g) for g in 'ab'])] == [
      str(tmp_path / 'root' / g / 'run') for g in 'ab'
  ]
  # Passed itself, an export's timm/ passed for a run named timm.
  with pytest.raises(ValueError, match=r"^'.*/exported/demo' holds an export, not a run: pass"):
    find_runs([str(tmp_path / 'root' / 'exported' / 'demo')])


@pytest.mark.parametrize('cut', [2, 9, 30])
def test_a_run_whose_last_record_is_cut_short_still_reports(sweep_root, tmp_path, cut):
  """A resumed run writes a second event file (it wins the steps both have); this one is being written
  and ends in half a record."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(os.path.join(sweep_root, 'lr.base=0.001,total_steps=50'), workdir)
  (first,) = [name for name in os.listdir(workdir) if name.startswith('events.out.tfevents.')]
  _write_events(
      str(tmp_path / 'resumed'), {'train_loss': {50: 9.0, 60: 8.0}, 'eval_top1': {60: 0.875}}
  )
  created = int(first.split('.')[3]) + 100
  second = os.path.join(workdir, f'events.out.tfevents.{created}.host.123.0.v2')
  shutil.move(os.path.join(tmp_path / 'resumed', os.listdir(tmp_path / 'resumed')[0]), second)
  assert (
      events.read_scalars(workdir)['eval_top1']
      == _tf_scalars(workdir)['eval_top1']
      == {25: 0.75, 50: 0.5, 60: 0.875}
  )  # The last record, about to be cut.
  with open(second, 'rb+') as f:
    f.truncate(os.path.getsize(second) - cut)

  scalars = events.read_scalars(workdir)
  assert scalars['eval_top1'] == {25: 0.75, 50: 0.5}
  assert scalars['train_loss'][50] == 9.0 and scalars['train_loss'][60] == 8.0
  paths = report.report([workdir], str(tmp_path / 'out'))
  assert paths == [str(tmp_path / 'out' / 'report.png'), str(tmp_path / 'out' / 'report.html')]
  assert _html_cells(paths[1])[1][2:] == ['60', '2', '1.5', '0.5', '0.75']


USAGE = 'WORKDIR [WORKDIR ...] --out=DIR | --pivot=ROW_FIELD,COLUMN_FIELD [--metric=M]'


@pytest.mark.parametrize(
    'args,error',
    [
        (
            ['{tmp}/nothing', '--out={tmp}/out'],
            "error: '{tmp}/nothing' does not exist: pass run workdirs or the root of a sweep",
        ),
        (
            ['{tmp}/empty', '--out={tmp}/out'],
            "error: '{tmp}/empty' holds no run: neither it nor any directory under it has a config.json or "
            'events.out.tfevents.* files',
        ),
        (
            ['{tmp}/started', '--out={tmp}/out'],
            'error: no run in {tmp}/started has logged its train loss or an eval metric yet (its '
            'events.out.tfevents.* files)',
        ),
        *(
            (
                [f'{{tmp}}/{name}', '--out={tmp}/out'],
                f'error: {{tmp}}/{name}/config.json is not the config a vit_jax run writes (a JSON '
                f'object of its fields{said}): pass the workdirs of runs',
            )
            for name, said in [
                ('listed', ''),
                (
                    'broken',
                    ': Expecting property name enclosed in double quotes: line 1 column 2 (char 1)',
                ),
            ]
        ),
        (['--out={tmp}/out'], 'error: no WORKDIR given: use ' + USAGE),
        (['{tmp}/started'], 'error: no --out or --pivot given: use ' + USAGE),
        (
            ['{tmp}/started', '--pivot=lr.base,total_steps,seed'],
            'error: --pivot=lr.base,total_steps,seed names 3 fields: give a row and a column field, e.g. '
            '--pivot=model.posemb,model.posemb_where',
        ),
        (
            ['{tmp}/started', '--out={tmp}/out', '--metric=eval_top5'],
            'error: --metric picks what a --pivot table shows, and none is asked for: add '
            '--pivot=ROW_FIELD,COLUMN_FIELD, or drop --metric (the report shows every eval metric)',
        ),
    ],
    ids=[
        'missing',
        'no-run',
        'no-metrics-yet',
        'config-list',
        'config-not-json',
        'no-workdir',
        'no-out',
        'pivot-fields',
        'metric',
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, error):
  (tmp_path / 'empty' / 'sub').mkdir(parents=True)
  (tmp_path / 'started').mkdir()
  (tmp_path / 'started' / 'config.json').write_text('{}')  # A run that has not logged anything yet.
  for name, text in [('listed', '[]'), ('broken', '{bad')]:
    (tmp_path / name).mkdir()
    (tmp_path / name / 'config.json').write_text(text)
  run = subprocess.run(
      [*REPORT_CMD, *(a.format(tmp=tmp_path) for a in args)],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  assert run.stderr.splitlines() == [error.format(tmp=tmp_path)]
  assert run.stdout == ''
  assert not (tmp_path / 'out').exists()


def test_a_real_run_reports_what_its_loop_logged(trained_tiny_run, tmp_path):
  expected = _tf_scalars(trained_tiny_run)
  assert events.read_scalars(trained_tiny_run) == expected
  run = subprocess.run(
      [*REPORT_CMD, trained_tiny_run, f'--out={tmp_path}'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.splitlines() == [f'{tmp_path}/report.png', f'{tmp_path}/report.html']
  runs = [load_run(*found) for found in find_runs([trained_tiny_run])]
  assert report.panels(runs) == [
      'train_loss',
      'learning_rate',
      'eval_loss',
      'eval_top1',
      'eval_top5',
  ]
  (row,) = report.table(runs)
  assert row['last step'] == 12 and row['differing config'] == {}
  assert row['eval_top1 final'] == expected['eval_top1'][12]
  cells = _html_cells(f'{tmp_path}/report.html')
  assert cells[1][:3] == [os.path.basename(trained_tiny_run), '', '12']
  assert cells[1][5] == f'{expected["eval_top1"][12]:.4g}'
  with Image.open(tmp_path / 'report.png') as image:
    width, height = report.figure_inches(5, 1)
    assert image.size == (round(width * report.DPI), round(height * report.DPI))
    assert np.all(np.asarray(image.convert('RGB')) == _run_colors(1)[0], axis=-1).any()


def test_pivot_lays_a_sweep_out_by_two_config_fields():
  runs = [
      Run('a', {'lr.base': 0.1, 'total_steps': 10}, {'eval_top1': {5: 0.2, 10: 0.25}}),
      Run('b', {'lr.base': 0.1, 'total_steps': 20}, {'eval_top1': {20: 0.5}}),
      Run('c', {'lr.base': 0.3, 'total_steps': 10}, {}),  # Not evaluated yet.
      Run('d', {'total_steps': 20}, {'eval_top1': {20: 0.125}}),
  ]
  assert report.pivot(runs, 'lr.base', 'total_steps').splitlines() == [
      '| eval_top1: lr.base (rows), total_steps (columns) | 10 | 20 |',
      '|---|---|---|',
      '| 0.1 | 0.2500 | 0.5000 |',
      '| 0.3 | - | - |',
      '| (default) | - | 0.1250 |',
  ]
  with pytest.raises(ValueError, match=r'^two runs have lr.base=0.1, total_steps=10: pass roots'):
    report.pivot(runs + runs[:1], 'lr.base', 'total_steps')


def test_a_resumed_run_drops_what_the_interrupted_run_logged_after_its_checkpoint(tmp_path):
  """The interrupted run logged up to step 40 (an eval at 30) but saved its last checkpoint at 20; the
  resumed run, in a later file, has logged step 30 so far. Steps 30 and 40 of the old file are of a
  trajectory no longer there: the run is at step 30, its last eval the one at 20."""
  workdir = tmp_path / 'run'
  _write_events(
      str(tmp_path / 'old'),
      {'train_loss': {10: 2.0, 20: 1.5, 30: 1.25, 40: 1.0}, 'eval_top1': {20: 0.5, 30: 0.9}},
  )
  _write_events(str(tmp_path / 'new'), {'train_loss': {30: 1.375}})
  workdir.mkdir()
  for created, part in ((1000, 'old'), (2000, 'new')):
    (name,) = os.listdir(tmp_path / part)
    shutil.move(
        str(tmp_path / part / name), str(workdir / f'events.out.tfevents.{created}.host.1.0.v2')
    )
  assert events.read_scalars(str(workdir)) == {
      'train_loss': {10: 2.0, 20: 1.5, 30: 1.375},
      'eval_top1': {20: 0.5},
  }
  (row,) = report.table([load_run('run', workdir)])
  assert row['last step'] == 30 and row['eval_top1 final'] == 0.5 and row['eval_top1 best'] == 0.5


def test_pivot_on_a_field_no_run_has_or_a_metric_none_logged_is_one_line_naming_it():
  runs = [
      Run('a', {'lr.base': 0.1, 'lr.warmup_steps': 5, 'seed': 0}, {'eval_top1': {5: 0.25}}),
      Run('b', {'lr.base': 0.3, 'lr.warmup_steps': 5, 'seed': 0}, {'eval_top1': {5: 0.5}}),
  ]
  # 'lr' is a group of fields (config.json's are flat) and 'sede' a typo: both were '(default)' in every
  # run, 'two runs have lr=(default), seed=0' or a one-row table.
  with pytest.raises(
      ValueError,
      match=r"^--pivot field 'lr' is in no run's config: the fields under it "
      r'are lr.base, lr.warmup_steps$',
  ):
    report.pivot(runs, 'lr', 'seed')
  with pytest.raises(
      ValueError, match=r"^--pivot field 'sede' is in no run's config: pass a dotted"
  ):
    report.pivot(runs, 'lr.base', 'sede')
  with pytest.raises(
      ValueError, match=r"^no run logged 'eval_top_1': use --metric= one of eval_top1$"
  ):
    report.pivot(runs, 'lr.base', 'seed', 'eval_top_1')
  assert report.pivot(runs, 'lr.base', 'seed').splitlines()[2:] == [
      '| 0.1 | 0.2500 |',
      '| 0.3 | 0.5000 |',
  ]
