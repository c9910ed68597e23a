"""The training loop's metric writer: log lines, and TensorBoard event files written through
`etils.epath`, so that they go wherever the workdir's checkpoints go (vit_jax/events.py reads them)."""
import os
import socket
import time
from typing import Any, Mapping

from clu import metric_writers
from clu.metric_writers import interface
from etils import epath
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary

from vit_jax import events

_ONLY_SCALARS = "vit_jax's event writer writes scalars and hyper-parameters only"


class EventWriter(interface.MetricWriter):
  """Writes scalars and hyper-parameters to a TensorBoard event file through `etils.epath`.

  clu's SummaryWriter goes through TensorFlow's file system, which reads gs:// only with its own GCS
  client and no longer reads s3:// at all; this one writes wherever the workdir's checkpoints go. Cloud
  storage has no appending, so each flush rewrites the file from its start; a file that outgrows
  `max_file_bytes` is left as it is and the next records go to a new one, which bounds that rewrite.
  """

  def __init__(self, logdir: str, *, flush_secs: float = 30.0, max_file_bytes: int = 1 << 20):
    self._dir = epath.Path(logdir)
    self._dir.mkdir(parents=True, exist_ok=True)
    self._flush_secs = flush_secs
    self._max_file_bytes = max_file_bytes
    self._files = 0
    self._start_file()

  def _start_file(self) -> None:
    # Named like TensorFlow's files (`read_scalars` orders them by the seconds), numbered for the
    # files one process starts within a second.
    self._path = self._dir / (f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.'
                              f'{os.getpid()}.{self._files:04d}.vit_jax')
    self._files += 1
    self._records = bytearray()
    self._written = -1  # Nothing yet: the first flush writes the file even with the header alone.
    self._last_flush = time.monotonic()
    self._add(event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2'))

  def _add(self, event: event_pb2.Event) -> None:
    self._records += events.encode_record(event.SerializeToString())
    if time.monotonic() - self._last_flush >= self._flush_secs:
      self.flush()

  def _add_summary(self, step: int, summary: summary_pb2.Summary) -> None:
    self._add(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

  def write_scalars(self, step: int, scalars: Mapping[str, interface.Scalar]) -> None:
    for tag, value in scalars.items():
      self._add_summary(step, scalar_summary.scalar_pb(tag, np.asarray(value, np.float32)))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._add_summary(0, hparams_summary.hparams_pb(dict(hparams)))

  def write_summaries(self, step, values, metadata=None):
    raise NotImplementedError(_ONLY_SCALARS)

  def write_images(self, step, images):
    raise NotImplementedError(_ONLY_SCALARS)

  def write_videos(self, step, videos):
    raise NotImplementedError(_ONLY_SCALARS)

  def write_audios(self, step, audios, *, sample_rate):
    raise NotImplementedError(_ONLY_SCALARS)

  def write_texts(self, step, texts):
    raise NotImplementedError(_ONLY_SCALARS)

  def write_histograms(self, step, arrays, num_buckets=None):
    raise NotImplementedError(_ONLY_SCALARS)

  def flush(self) -> None:
    if len(self._records) != self._written:
      self._path.write_bytes(bytes(self._records))
      self._written = len(self._records)
    self._last_flush = time.monotonic()
    if self._written >= self._max_file_bytes:
      self._start_file()

  def close(self) -> None:
    self.flush()


def create_writer(workdir: str, *, just_logging: bool) -> metric_writers.MetricWriter:
  """The training loop's writer: log lines, and on the process that writes metrics the event files,
  both from a background thread as in clu's `create_default_writer`."""
  writers = [metric_writers.LoggingWriter()]
  if not just_logging:
    writers.append(EventWriter(workdir))
  return metric_writers.AsyncMultiWriter(writers)
