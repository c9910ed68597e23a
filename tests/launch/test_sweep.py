"""launch/sweep.py: sweep files expand into runs with their own workdirs."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.train import wandb_writer
import sweep


def test_lists_in_a_dict_are_a_product_and_dicts_concatenate():
  runs = sweep.expand([{'lr.base': [0.1, 0.2], 'total_steps': [5, 6], 'seed': 0}, {'seed': 1}])
  assert runs == [
      {'lr.base': 0.1, 'total_steps': 5, 'seed': 0},
      {'lr.base': 0.1, 'total_steps': 6, 'seed': 0},
      {'lr.base': 0.2, 'total_steps': 5, 'seed': 0},
      {'lr.base': 0.2, 'total_steps': 6, 'seed': 0},
      {'seed': 1},
  ]
  assert (
      sweep.run_name({'lr.base': 0.1, 'mesh': (('data', -1),)})
      == 'lr.base=0.1,mesh=___data_,_-1_,_'
  )


def test_shipped_sweep_prints_one_command_per_run():
  out = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          '--sweep=configs/sweeps/demo_lr_steps.py',
          '--workdir=/runs',
          '--print',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      check=True,
  ).stdout.splitlines()
  assert len(out) == 6
  assert out[0].endswith(
      '-m vit_jax.main --config=configs/demo.py '
      '--workdir=/runs/lr.base=0.0003,total_steps=1000 --config.lr.base=0.0003 '
      '--config.total_steps=1000'
  )


def test_a_sweep_gives_evaluators_as_vit_jax_main_takes_them(tmp_path):
  """evals.NAME=dict(...), in the sweep file or after --: it was 'no field of the config'."""
  sweep_file = tmp_path / 'evals.py'
  sweep_file.write_text(
      "CONFIG = 'configs/demo.py'\n"
      'def get_sweep():\n'
      "  return [{'seed': [1, 2], 'evals.minival': dict(type='classification', split='train[:5]',"
      ' every_steps=2)}]\n'
  )
  extra = "--config.evals.knn2=dict(type='knn', every_steps=4)"
  out = subprocess.run(
      [sys.executable, 'launch/sweep.py', f'--sweep={sweep_file}', '--workdir=/runs', '--print'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
  )
  assert out.returncode == 0, out.stderr
  assert len(out.stdout.splitlines()) == 2 and '--config.evals.minival=' in out.stdout
  out = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          f'--sweep={sweep_file}',
          '--workdir=/runs',
          '--print',
          '--',
          extra,
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
  )
  assert out.returncode == 0, out.stderr


@pytest.mark.slow  # Two runs in subprocesses: make test-all's.
def test_sweep_runs_each_config_in_its_own_workdir(tmp_path):
  sweep_file = tmp_path / 'tiny_sweep.py'
  sweep_file.write_text(
      "CONFIG = 'configs/demo.py'\n\ndef get_sweep():\n" "  return [{'lr.base': [0.001, 0.003]}]\n"
  )
  tiny = {**helpers.TINY, 'total_steps': 2, 'data_dir': str(tmp_path / 'tfds')}
  run = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          f'--sweep={sweep_file}',
          f'--workdir={tmp_path / "runs"}',
          '--',
          *(f'--config.{k}={v}' for k, v in tiny.items()),
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  for lr in ('0.001', '0.003'):
    config, _ = run_dir.load_run_info(str(tmp_path / 'runs' / f'lr.base={lr}'))
    assert config.lr.base == float(lr) and config.total_steps == 2


def test_slurm_mode_writes_the_runs_file_that_the_array_job_reads(tmp_path):
  out = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          '--sweep=configs/sweeps/demo_lr_steps.py',
          f'--workdir={tmp_path}',
          '--slurm=--nodes=1 --gpus-per-node=0',
          '--print',
          '--',
          '--config.seed=1',
          '--config.model.hidden_size=64',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      check=True,
  ).stdout
  # Submitted from here, with this Python: the runs' relative paths are this directory's.
  assert out.strip() == (
      f'sbatch --array=0-5 --output={tmp_path}/slurm-%A_%a.out '
      f'--export=ALL,VIT_JAX_PYTHON={sys.executable} --nodes=1 --gpus-per-node=0 '
      f'{helpers.REPO}/launch/slurm.sbatch --sweep_runs={tmp_path}/sweep_runs.txt'
  )
  lines = (tmp_path / 'sweep_runs.txt').read_text().splitlines()
  assert len(lines) == 6
  # Line 2 is what array element 2 runs: the sbatch script's own parsing of it (bash, as SLURM runs it).
  parsed = subprocess.run(
      [
          'bash',
          '-c',
          'mapfile -t runs < "$1"; eval "set -- ${runs[2]}"; printf "%s\\n" "$@"',
          'bash',
          str(tmp_path / 'sweep_runs.txt'),
      ],
      capture_output=True,
      text=True,
      check=True,
  ).stdout.splitlines()
  assert parsed == [
      '--config=configs/demo.py',
      f'--workdir={tmp_path}/lr.base=0.001,total_steps=1000',
      '--config.lr.base=0.001',
      '--config.total_steps=1000',
      '--config.seed=1',
      '--config.model.hidden_size=64',
  ]
  # sweep.json lists the runs by workdir: W&B groups them under the sweep's folder name.
  listed = json.loads((tmp_path / 'sweep.json').read_text())
  assert listed['sweep'] == f'{helpers.REPO}/configs/sweeps/demo_lr_steps.py'
  assert listed['runs']['lr.base=0.001,total_steps=1000'] == parsed
  assert len(listed['runs']) == 6
  assert wandb_writer.sweep_group(f'{tmp_path}/lr.base=0.001,total_steps=1000') == tmp_path.name
  assert wandb_writer.sweep_group(f'{tmp_path}/another_run') is None
  assert wandb_writer.sweep_group(str(tmp_path)) is None


def test_an_argument_for_every_run_that_sets_a_swept_field_is_one_line_and_runs_nothing(tmp_path):
  run = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          '--sweep=configs/sweeps/demo_lr_steps.py',
          f'--workdir={tmp_path}',
          '--',
          '--config.seed=1',
          '--config.total_steps=20',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert (
      run.returncode == 2
      and run.stdout == ''
      and run.stderr
      == (
          "error: --config.total_steps=20 (after --) sets 'total_steps', which the sweep file sets (1000, "
          "2000): the runs would differ only in their folder names; change 'total_steps' in the sweep "
          'file, or leave the flag out\n'
      )
  )
  assert not list(tmp_path.iterdir())


def test_the_fields_an_argument_for_every_run_may_not_set():
  runs = sweep.expand([{'lr.base': [0.1, 0.2], 'config': 'configs/demo.py'}])
  for arg in (
      '--config.lr.base=1',
      '--config.lr={}',
      '--config=configs/x.py',
      '--workdir=/w',
      # absl's other spellings: every run in one workdir, or the same value in each.
      '-workdir=/w',
      '-config.lr.base=1',
      '--noconfig.lr.base',
  ):
    with pytest.raises(sweep.SweepError, match='which the sweep file sets'):
      sweep.check_extra_args(runs, [arg])
  sweep.check_extra_args(runs, ['--config.lr.warmup_steps=5', '--config.seed=1', '--verbosity=1'])


@pytest.mark.parametrize(
    'sweep_text, extra, error',
    [
        ('CONFIG = 1\n', [], r'must define get_sweep\(\) returning a list of dicts'),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return {'seed': [1, 2]}\n",
            [],
            r'must define get_sweep\(\) returning a list of dicts',
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'seed': []}]\n",
            [],
            'has no runs',
        ),
        ("def get_sweep():\n  return [{'seed': [1, 2]}]\n", [], 'names no config: set CONFIG = '),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'lr.bas': [1, 2]}]\n",
            [],
            r"'lr\.bas' is no field of the config of --config=configs/demo\.py: did you mean "
            r"'lr\.base'\?",
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'seed': [1, 2]}]\n",
            ['--config.totl_steps=5'],
            r"'totl_steps' is no field .* did you mean 'total_steps'\?",
        ),
        (
            "CONFIG = 'configs/nonexistent.py'\ndef get_sweep():\n  return [{'seed': [1, 2]}]\n",
            [],
            r'config file configs/nonexistent\.py of --sweep=.* does not exist',
        ),
        (  # The same folder name: '%' and '_' are both '_' in it.
            "CONFIG = 'configs/demo.py'\n"
            "def get_sweep():\n  return [{'train_split': ['train[:50%]', 'train[:50_]']}]\n",
            [],
            r"two runs of the sweep would share the workdir 'train_split=train__50__'",
        ),
        (  # Two workdirs, one run.
            "CONFIG = 'configs/demo.py'\n"
            "def get_sweep():\n  return [{'seed': 1, 'lr.base': 0.1}, {'lr.base': 0.1, 'seed': 1}]\n",
            [],
            r"the sweep runs \{'lr.base': 0.1, 'seed': 1\} twice \(as \{'seed': 1, 'lr.base': 0.1\} too\)",
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'seed': [1, 1]}]\n",
            [],
            r"the sweep runs \{'seed': 1\} twice",
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'seed': [1, 2]}]\n",
            ['--config=configs/mae_demo.py'],
            r"sets 'config', which the sweep file sets \(its CONFIG\)",
        ),
        (  # Each run failed at its start; with [2, 'x'] the first trained to its end first.
            "CONFIG = 'configs/demo.py'\n"
            "def get_sweep():\n  return [{'total_steps': [2, 'x'], 'lr.base': [0.1]}]\n",
            [],
            r"the sweep sets total_steps='x' \(run \{'total_steps': 'x', 'lr.base': 0.1\}\): "
            r'config.total_steps takes an integer',
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'model.hidden_size': 32.5}]\n",
            [],
            r'the sweep sets model.hidden_size=32.5 .*: config.model.hidden_size takes an integer',
        ),
        (  # Tracebacks of the sweep file's own code.
            'import no_such_module\n',
            [],
            r"cannot load --sweep=.*: ModuleNotFoundError: No module named 'no_such_module'",
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{'seed': 1 / 0}]\n",
            [],
            r'cannot load --sweep=.*: ZeroDivisionError: division by zero',
        ),
        (
            "CONFIG = 'configs/demo.py'\ndef get_sweep():\n  return [{1: [2]}]\n",
            [],
            r'must define get_sweep\(\) returning a list of dicts of config overrides by field name',
        ),
    ],
)
def test_a_sweep_that_cannot_run_as_asked_is_one_line_before_any_run(
    sweep_text, extra, error, tmp_path
):
  (tmp_path / 'sweep.py').write_text(sweep_text)
  run = subprocess.run(
      [
          sys.executable,
          'launch/sweep.py',
          f'--sweep={tmp_path / "sweep.py"}',
          f'--workdir={tmp_path / "runs"}',
          '--slurm',
          '--',
          *extra,
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert run.returncode == 2 and run.stdout == '', run.stderr
  assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith('error: '), run.stderr
  assert re.search(error, run.stderr), run.stderr
  assert not (tmp_path / 'runs').exists()


@pytest.mark.parametrize(
    'root, slurm, error',
    [
        ('a_file', None, r"--workdir='.*a_file' is not writable \(it is a file, not a directory\)"),
        (
            'gs://bucket/sweep',
            '--slurm',
            r'--slurm needs a --workdir on a file system the nodes share',
        ),
    ],
)
def test_a_sweep_root_it_cannot_write_is_one_line_before_any_run(root, slurm, error, tmp_path):
  """A root that is a file was a traceback after the checks; with --slurm a URL root made a local
  folder 'gs:' holding the job's runs file."""
  (tmp_path / 'a_file').write_text('')
  run = subprocess.run(
      [
          sys.executable,
          os.path.join(helpers.REPO, 'launch', 'sweep.py'),
          f'--sweep={helpers.REPO}/configs/sweeps/demo_lr_steps.py',
          f'--workdir={root}',
          *([slurm] if slurm else []),
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert run.returncode == 2 and run.stdout == '', run.stderr
  assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith('error: '), run.stderr
  assert re.search(error, run.stderr), run.stderr
  assert sorted(os.listdir(tmp_path)) == ['a_file']


def test_print_alone_writes_nothing(tmp_path):
  """Its commands may run where the root is another folder (a cluster's)."""
  run = subprocess.run(
      [
          sys.executable,
          os.path.join(helpers.REPO, 'launch', 'sweep.py'),
          f'--sweep={helpers.REPO}/configs/sweeps/demo_lr_steps.py',
          '--workdir=runs',
          '--print',
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert run.returncode == 0 and len(run.stdout.splitlines()) == 6, run.stderr
  assert os.listdir(tmp_path) == []


def test_a_missing_sweep_file_is_one_line(tmp_path):
  with pytest.raises(sweep.SweepError, match=r'^cannot load --sweep=.*No such file'):
    sweep.commands(str(tmp_path / 'none.py'), str(tmp_path), [])


# A stand-in for a run: it stops as vit_jax.main does on SIGTERM (saves, exits 75), and counts the
# signals it got.
_RUN = """
import signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append('TERM'))
signal.signal(signal.SIGINT, lambda *_: got.append('INT'))
open(sys.argv[1], 'w').write('started')
deadline = time.time() + 30
while not got and time.time() < deadline:
  time.sleep(0.05)
time.sleep(0.5)  # Saving: a second signal here would be a second stop.
open(sys.argv[1], 'w').write(','.join(got))
sys.exit(75 if got else 0)
"""


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_sweep_reaches_its_run_once_as_sigterm_and_the_sweep_waits(
    signum, tmp_path
):
  marker = tmp_path / 'marker'

  def signal_once_started():
    deadline = time.time() + 30
    while not marker.exists() and time.time() < deadline:
      time.sleep(0.05)
    os.kill(os.getpid(), signum)  # To the sweep only: a terminal's Ctrl-C would reach both.

  # Python's handlers, as in a terminal (tests in the background have SIGINT ignored, which the
  # sweep leaves ignored).
  handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  signal.signal(signal.SIGINT, signal.default_int_handler)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  try:
    threading.Thread(target=signal_once_started, daemon=True).start()
    status, signals = sweep.run_one([sys.executable, '-c', _RUN, str(marker)])
    assert (status, signals) == (75, 1)
    assert marker.read_text() == 'TERM'
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Given back.
  finally:
    for s, handler in handlers.items():
      signal.signal(s, handler)
