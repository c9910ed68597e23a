"""The loop's event writer (train/event_writer.py), read back by TensorFlow and TensorBoard."""
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from tensorboard.util import tensor_util

from vit_jax import events
from vit_jax.train import event_writer


def _write(writer, steps):
  for step in steps:
    writer.write_scalars(step, {'train_loss': 1.0 / (step + 1), 'learning_rate': np.float32(step) * 1e-3})


def test_tensorboard_reads_what_the_writer_writes(tmp_path):
  writer = event_writer.EventWriter(str(tmp_path))
  writer.write_hparams({'lr.base': '0.001', 'variant': 'ViT-B_16'})
  _write(writer, range(5))
  writer.close()
  [path] = os.listdir(tmp_path)
  assert path.startswith('events.out.tfevents.')
  # TensorFlow's record reader checks both CRCs of every record.
  assert sum(1 for _ in tf.data.TFRecordDataset(str(tmp_path / path))) == 1 + 1 + 2 * 5
  accumulator = event_accumulator.EventAccumulator(str(tmp_path))
  accumulator.Reload()
  assert {e.step: float(tensor_util.make_ndarray(e.tensor_proto))
          for e in accumulator.Tensors('train_loss')} == pytest.approx({s: 1 / (s + 1) for s in range(5)})
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
    assert sum(1 for _ in tf.data.TFRecordDataset(str(tmp_path / name))) > 1
  assert sorted(events.read_scalars(str(tmp_path))['train_loss']) == list(range(23))


def test_a_writer_flushes_by_itself_after_flush_secs(tmp_path):
  writer = event_writer.EventWriter(str(tmp_path), flush_secs=0.0)
  _write(writer, [7])
  assert events.read_scalars(str(tmp_path))['train_loss'] == {7: pytest.approx(1 / 8)}


def test_only_the_first_process_writes_event_files(tmp_path):
  for just_logging in (True, False):
    writer = event_writer.create_writer(str(tmp_path / str(just_logging)), just_logging=just_logging)
    writer.write_scalars(1, {'train_loss': 0.5})
    writer.close()
  assert not (tmp_path / 'True').exists()
  assert events.read_scalars(str(tmp_path / 'False')) == {'train_loss': {1: 0.5}}
