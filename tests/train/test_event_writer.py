"""The loop's writers (train/event_writer.py: event files read back by TensorFlow and TensorBoard, log
lines, the background thread) and its pace (train/pace.py)."""

import logging
import os
import threading

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

import helpers

from vit_jax import defaults
from vit_jax.train import events
from vit_jax.train import event_writer, pace


def _write(writer, steps):
  for step in steps:
    writer.write_scalars(
        step, {'train_loss': 1.0 / (step + 1), 'learning_rate': np.float32(step) * 1e-3}
    )


def test_tensorboard_reads_what_the_writer_writes(tmp_path):
  writer = event_writer.EventWriter(str(tmp_path))
  writer.write_hparams({'lr.base': '0.001', 'variant': 'ViT-B_16'})
  _write(writer, range(5))
  writer.close()
  [path] = os.listdir(tmp_path)
  assert path.startswith('events.out.tfevents.')
  # TensorFlow's record reader checks both CRCs of every record.
  tf = helpers.tensorflow()
  assert sum(1 for _ in tf.data.TFRecordDataset(str(tmp_path / path))) == 1 + 1 + 2 * 5
  accumulator = event_accumulator.EventAccumulator(str(tmp_path))
  accumulator.Reload()
  assert {
      e.step: float(tensor_util.make_ndarray(e.tensor_proto))
      for e in accumulator.Tensors('train_loss')
  } == pytest.approx({s: 1 / (s + 1) for s in range(5)})
  [hparams] = accumulator.Tensors('_hparams_/session_start_info')
  assert hparams.step == 0
  content = accumulator.SummaryMetadata('_hparams_/session_start_info').plugin_data.content
  start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
  assert start.hparams['variant'].string_value == 'ViT-B_16'
  assert events.read_scalars(str(tmp_path))['learning_rate'][4] == pytest.approx(4e-3)


def test_each_flush_leaves_a_whole_file_and_a_full_one_is_followed_by_another(tmp_path):
  writer = event_writer.EventWriter(str(tmp_path), flush_secs=1e9, max_file_bytes=1000)
  _write(writer, range(3))
  assert os.listdir(tmp_path) == []  # Nothing written before a flush.
  writer.flush()
  assert events.read_scalars(str(tmp_path))['train_loss'].keys() == {0, 1, 2}
  _write(writer, range(3, 20))
  writer.flush()  # Over 1000 bytes: the next records go to a new file.
  _write(writer, range(20, 23))
  writer.close()
  files = sorted(os.listdir(tmp_path))
  assert len(files) == 2
  for name in files:
    assert sum(1 for _ in helpers.tensorflow().data.TFRecordDataset(str(tmp_path / name))) > 1
  assert sorted(events.read_scalars(str(tmp_path))['train_loss']) == list(range(23))


def test_a_writer_flushes_by_itself_after_flush_secs(tmp_path):
  writer = event_writer.EventWriter(str(tmp_path), flush_secs=0.0)
  _write(writer, [7])
  assert events.read_scalars(str(tmp_path))['train_loss'] == {7: pytest.approx(1 / 8)}


def test_only_the_first_process_writes_event_files(tmp_path):
  for just_logging in (True, False):
    writer = event_writer.create_writer(
        str(tmp_path / str(just_logging)), defaults.get_config(), just_logging=just_logging
    )
    writer.write_scalars(1, {'train_loss': 0.5})
    writer.close()
  assert not (tmp_path / 'True').exists()
  assert events.read_scalars(str(tmp_path / 'False')) == {'train_loss': {1: 0.5}}


def test_the_log_writer_prints_one_line_per_write(caplog):
  caplog.set_level(logging.DEBUG)  # The hyperparameters at --verbosity=1 only.
  writer = event_writer.LogWriter()
  writer.write_scalars(8, {'train_loss': 0.123456789, 'skipped_steps': 2})
  writer.write_hparams({'variant': 'ViT-B_16'})
  assert caplog.messages == [
      '[8] skipped_steps=2, train_loss=0.123457',
      "[Hyperparameters] {'variant': 'ViT-B_16'}",
  ]


class _Recorder:

  def __init__(self, fail_at=None):
    self.calls, self._fail_at = [], fail_at

  def write_scalars(self, step, scalars):
    if step == self._fail_at:
      raise OSError(f'disk full at {step}')
    self.calls.append((threading.current_thread().name, step, scalars))

  def write_hparams(self, hparams):
    self.calls.append(('hparams', hparams))

  def flush(self):
    self.calls.append('flush')

  def close(self):
    self.calls.append('close')


def test_the_background_writer_writes_in_order_off_the_main_thread_and_raises_at_flush():
  first, second = _Recorder(), _Recorder(fail_at=3)
  writer = event_writer.BackgroundWriter([first, second])
  scalars = {'train_loss': 1.0}
  for step in range(1, 6):
    writer.write_scalars(step, scalars)
  scalars['train_loss'] = 2.0  # The writer wrote a copy.
  with pytest.raises(OSError, match='disk full at 3'):
    writer.flush()
  assert [step for _, step, _ in first.calls] == [1, 2, 3, 4, 5]
  assert [step for _, step, _ in second.calls] == [1, 2, 4, 5]
  assert {name for name, _, _ in first.calls} == {'metric_writer_0'}
  assert all(s == {'train_loss': 1.0} for _, _, s in first.calls)
  writer.write_hparams({'lr': '0.1'})
  writer.close()
  assert first.calls[5:] == [('hparams', {'lr': '0.1'}), 'flush', 'close']


class _Clock:

  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_pace_reports_steps_per_second_from_the_second_call_and_the_time_in_timed_parts(
    monkeypatch, caplog
):
  caplog.set_level(logging.INFO)
  clock = _Clock()
  monkeypatch.setattr(pace.time, 'monotonic', clock)
  recorder = _Recorder()
  run_pace = pace.Pace(total_steps=10, every_steps=4, writer=recorder)
  clock.now = 160.0  # Compiling.
  run_pace(1)
  for step in range(2, 11):
    clock.now += 0.5
    if step == 8:
      with run_pace.timed('eval', after=np.zeros(3)):
        clock.now += 7.0
    run_pace(step)
  steps = {step: scalars for _, step, scalars in recorder.calls}
  assert steps.keys() == {4, 8, 10}
  assert steps[4] == {'steps_per_sec': 2.0, 'uptime': 61.5, 'input_wait': 0.0}
  assert steps[8] == {'steps_per_sec': pytest.approx(4 / 9), 'uptime': 70.5, 'input_wait': 0.0}
  assert steps[10] == {'steps_per_sec': 2.0, 'uptime': 71.5, 'input_wait': 0.0}
  assert caplog.messages == [
      'Progress: 2.0 steps/s, 40.0% (4/10), ETA 0:03',
      'Progress: 0.4 steps/s, 80.0% (8/10), ETA 0:04 (1:10 so far: 9.9% eval)',
      'Progress: 2.0 steps/s, 100.0% (10/10), ETA 0:00 (1:12 so far: 9.8% eval)',
  ]


def test_pace_reports_the_share_of_time_waiting_for_input_and_warns_once_where_it_is_large(
    monkeypatch, caplog
):
  caplog.set_level(logging.INFO)
  clock = _Clock()
  monkeypatch.setattr(pace.time, 'monotonic', clock)
  monkeypatch.setattr(pace, 'on_accelerator', lambda: True)  # On CPU the log only says it.
  recorder = _Recorder()
  run_pace = pace.Pace(total_steps=16, every_steps=4, writer=recorder)
  # Seconds each step's batch took to come: before the clock starts (step 1) it is not counted.
  waits = {1: 30.0, 2: 0.01, 3: 0.01, 4: 0.01, 5: 0.1, 6: 0.1, 7: 0.1, 8: 0.1}
  waits |= {step: 1.5 for step in range(9, 17)}
  for step in range(1, 17):
    with run_pace.waiting_for_input():
      clock.now += waits[step]
    clock.now += 0.5  # The step.
    run_pace(step)
  steps = {step: scalars['input_wait'] for _, step, scalars in recorder.calls}
  assert steps == {
      4: pytest.approx(0.03 / 1.53),
      8: pytest.approx(0.4 / 2.4),
      12: pytest.approx(0.75),
      16: pytest.approx(0.75),
  }
  progress = [m for m in caplog.messages if m.startswith('Progress')]
  assert [m.split('ETA ')[1].partition(', ')[2] for m in progress] == [
      '',
      '17% of it waiting for input',
      '75% of it waiting for input',
      '75% of it waiting for input',
  ]
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert warnings == [
      'The train steps waited for input 75% of the time of steps 9-12: the input pipeline is '
      'slower than the model; docs/speed.md says what speeds it up (more config.data_workers, '
      'pp.reducing_gap for large JPEGs, the data on a local disk)'
  ]
