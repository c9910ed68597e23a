"""benchmarks/accelerator_check.sh, the GPU check, runs every step on CPU in its small mode, and its
helper reads the figures it reports."""

import os
import re
import subprocess
import sys

import pytest

import helpers

sys.path.insert(0, f'{helpers.REPO}/benchmarks')
import accelerator_check  # pylint: disable=g-import-not-at-top,wrong-import-position

STEPS = (
    'wheels',
    'env',
    'normalize',
    'demo',
    'resume',
    'export_predict',
    'finetune',
    'input_pipeline',
    'jpegs',
    'b16_synthetic',
    'b16_folder',
    'l16_synthetic',
)
# The steps only ONLY (or ALL=1) runs, after the ones they need.
OPTIONAL = ('wheels', 'jpegs', 'b16_synthetic', 'b16_fp8', 'l16_fp8', 'b16_folder_at_step')


def _small_check(tmp_path, **env) -> tuple[dict[str, str], str]:
  """Runs the check --small on CPU; asserts every step passed; returns {step: result} in the order
  the steps ran, and the printed output."""
  # As a user runs it: one CPU device (not the tests' 8), the packages already installed.
  xla_flags = os.environ.get('XLA_FLAGS', '').replace(
      '--xla_force_host_platform_device_count=8', ''
  )
  env = {
      **os.environ,
      'JAX_PLATFORMS': 'cpu',
      'XLA_FLAGS': xla_flags,
      'PYTHON': sys.executable,
      'OUT': str(tmp_path / 'out'),
      'WORK': str(tmp_path / 'work'),
      **env,
  }
  run = subprocess.run(
      ['bash', 'benchmarks/accelerator_check.sh', '--small'],
      cwd=helpers.REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=1200,
  )
  rows = [line.split('\t') for line in open(tmp_path / 'out' / 'logs' / 'steps.tsv')]
  failed = {
      name: open(tmp_path / 'out' / 'logs' / f'{name}.log').read()[-2000:]
      for name, status, _, _ in rows
      if status != 'ok'
  }
  assert not failed, failed
  assert run.returncode == 0, run.stderr[-3000:]
  summary = (tmp_path / 'out' / 'summary.md').read_text()
  assert summary.count('| ok |') == len(rows) and summary in run.stdout
  return {name: result for name, _, _, result in rows}, run.stdout


@pytest.mark.slow  # A dozen commands, each its own process: a few minutes on 2 cores.
def test_the_small_check_passes_every_step_on_cpu(tmp_path):
  results, _ = _small_check(tmp_path)
  assert tuple(results) == STEPS
  assert 'the packages import already' in results['wheels']
  assert re.match(
      r'killed after checkpoint \d0 of 100; params bit-identical at step 100 ', results['resume']
  ), results['resume']
  assert 'x the synthetic batches' in results['b16_folder']
  assert os.listdir(tmp_path / 'out' / 'events' / 'demo')  # The curves come back with the summary.


@pytest.mark.slow  # Five commands, each its own process.
def test_the_optional_steps_run_where_only_names_them(tmp_path):
  results, _ = _small_check(tmp_path, ONLY=' '.join(OPTIONAL[1:]))
  assert tuple(results) == OPTIONAL
  assert 'x the synthetic batches' in results['b16_folder_at_step']
  assert os.listdir(tmp_path / 'out' / 'events' / 'b16_at_step')


def test_table_value_reads_a_benchmark_row_under_its_header(tmp_path):
  log = tmp_path / 'log.md'
  log.write_text(
      '# machine: x\n| framework | img/s (median) | MFU |\n|---|---|---|\n'
      '| vit_jax | 3202.10 | 34.1% |\n| timm | 2500.00 | 27.0% |\n'
  )
  assert accelerator_check.table_value(str(log), 'vit_jax', 'img/s (median)') == '3202.10'
  assert accelerator_check.table_value(str(log), 'timm', 'MFU') == '27.0%'
  assert accelerator_check.table_value(str(log), '', 'MFU') == '34.1%'  # The first row.
  with pytest.raises(accelerator_check.CheckFailed, match="no row 'torch'"):
    accelerator_check.table_value(str(log), 'torch', 'MFU')


def test_predictions_count_the_top_label_against_the_file_name(tmp_path):
  log = tmp_path / 'predictions.txt'
  log.write_text(
      '/d/3_0000.png\n  0.9000  3\n  0.0500  8\n/d/7_0001.png\n  0.6000  1\n'
      '/d/0_0002.png\n  0.9900  0\n'
  )
  assert accelerator_check.predictions(str(log)) == '2/3 top-1 right'
