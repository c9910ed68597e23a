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
OPTIONAL = (
    'wheels',
    'demo',
    'finetune',
    'lora',
    'soup',
    'flexi',
    'mae',
    'jpegs',
    'b16_synthetic',
    'b16_fp8',
    'b16_lora',
    'b16_patch_dropout',
    'l16_fp8',
    'b16_folder_at_step',
    'out_of_memory',
)
# Two of the suite's tests for the `tests` step: one runs on any device, one needs 8.
SOME_TESTS = (
    'tests/data/test_uint8_batches.py::test_the_device_normalises_every_level_to_the_hosts_bits '
    'tests/train/test_sharding.py::test_partition_rules_combine_tensor_and_fsdp'
)


def _small_check(tmp_path, **env) -> tuple[dict[str, str], str]:
  """Runs the check --small on CPU; asserts every step passed; returns {step: result} in the order
  the steps ran, and the printed output."""
  # As a user runs it: one CPU device (not the tests' 8), the packages already installed.
  env = {
      **helpers.on_devices(1),
      'JAX_PLATFORMS': 'cpu',
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
  rows = [line.rstrip('\n').split('\t') for line in open(tmp_path / 'out' / 'logs' / 'steps.tsv')]
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
  assert re.search(r'; [\d.]+% waiting for input$', results['b16_folder']), results['b16_folder']
  assert os.listdir(tmp_path / 'out' / 'events' / 'demo')  # The curves come back with the summary.


@pytest.mark.slow  # A dozen commands, each its own process.
def test_the_optional_steps_run_where_only_names_them(tmp_path):
  results, _ = _small_check(tmp_path, ONLY=' '.join(OPTIONAL[1:]))
  assert tuple(results) == OPTIONAL
  assert 'x the synthetic batches' in results['b16_folder_at_step']
  assert os.listdir(tmp_path / 'out' / 'events' / 'b16_at_step')
  assert re.fullmatch(
      r'eval_top1 [\d.]+ at step 20 eval_polyak_top1 [\d.]+ at step 20 export: \d+/20 top-1 right',
      results['lora'],
  ), results['lora']
  assert os.listdir(tmp_path / 'out' / 'events' / 'demo_lora')
  assert re.fullmatch(
      r"uniform soup of 2 of 2 checkpoints: top-1 [\d.]+ on split 'test' calibration: ECE [\d.]+",
      results['soup'],
  ), results['soup']
  assert re.fullmatch(
      r'eval_top1 [\d.]+ at step 60 p2_top1 [\d.]+ at step 60 p8_top1 [\d.]+ at step 60',
      results['flexi'],
  ), results['flexi']
  assert re.fullmatch(r'eval_loss [\d.]+ at step 60', results['mae']), results['mae']
  assert re.fullmatch(
      r'exit 1: error: the train step needs [\d.]+ GiB of memory a device beyond .*',
      results['out_of_memory'],
  ), results['out_of_memory']


@pytest.mark.slow  # The suite in a process of its own.
def test_the_tests_step_runs_a_selection_of_the_suite_and_counts_what_it_skips(tmp_path):
  results, _ = _small_check(tmp_path, ONLY='tests', TESTS=SOME_TESTS, VIT_JAX_TEST_DEVICES='1')
  assert tuple(results) == ('wheels', 'tests')
  assert results['tests'] == (
      f'{SOME_TESTS}: 1 passed, 0 failed, 0 errors, 1 skipped (1 for want of devices)'
  )
  assert (tmp_path / 'out' / 'tests_failures.md').read_text() == ''


def test_train_rate_gives_the_median_rate_and_input_wait_after_the_first_window(monkeypatch):
  from vit_jax.train import events  # pylint: disable=g-import-not-at-top

  scalars = {
      'images_per_sec': {10: 5.0, 20: 100.0, 30: 110.0, 40: 90.0},
      'input_wait': {10: 0.9, 20: 0.02, 30: 0.04, 40: 0.03},  # The first window: the compile.
  }
  monkeypatch.setattr(events, 'read_scalars', lambda workdir: scalars)
  assert accelerator_check.train_rate('run', synthetic=200.0) == (
      "100.0 images/s (median of 3 windows, 90.0-110.0), 0.50x the synthetic batches' 200.0; "
      '3.0% waiting for input'
  )


def test_test_results_count_the_outcomes_and_list_failures_by_cause(tmp_path):
  junit = tmp_path / 'tests.xml'
  junit.write_text(
      '<testsuites><testsuite>'
      '<testcase classname="tests.a" name="test_ok"/>'
      '<testcase classname="tests.a" name="test_mesh"><skipped message="needs 8 devices of gpu; '
      'there are 1"/></testcase>'
      '<testcase classname="tests.a" name="test_slow"><skipped message="slow"/></testcase>'
      '<testcase classname="tests.b" name="test_x"><failure message="AssertionError: 1 != 2&#10;'
      'more"/></testcase>'
      '<testcase classname="tests.b" name="test_y"><failure message="AssertionError: 1 != 2"/>'
      '</testcase>'
      '<testcase classname="" name="tests.c"><error message="collection failure">'
      "ModuleNotFoundError: No module named 'tensorflow'</error></testcase>"
      '</testsuite></testsuites>'
  )
  failures = tmp_path / 'failures.md'
  with pytest.raises(
      accelerator_check.CheckFailed,
      match=r'^1 passed, 2 failed, 1 errors, 2 skipped \(1 for want of devices\); 2 causes in ',
  ):
    accelerator_check.test_results(str(junit), str(failures))
  assert failures.read_text() == (
      '- 2: AssertionError: 1 != 2\n  - tests.b::test_x\n  - tests.b::test_y\n'
      '- 1: collection failure\n  - tests.c\n'
  )
  junit.write_text('<testsuites><testsuite></testsuite></testsuites>')
  with pytest.raises(accelerator_check.CheckFailed, match='no test ran'):
    accelerator_check.test_results(str(junit), str(failures))


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
