"""The training loop's metric writer: log lines, and TensorBoard event files written through
`etils.epath`, so that they go wherever the workdir's checkpoints go (vit_jax/train/events.py reads them).

Written here rather than with clu's metric writers: importing those imports all of Keras (through
TensorBoard's hparams Keras callback), 1.5 s of every command's start.
"""

from concurrent import futures
import os
import socket
import time
from typing import Any, Mapping, Protocol, Sequence

from absl import logging
from etils import epath
import ml_collections
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary

from vit_jax.train import events, wandb_writer


class MetricWriter(Protocol):

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    ...

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    ...

  def flush(self) -> None:
    ...

  def close(self) -> None:
    ...


class EventWriter:
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
    self._path = self._dir / (
        f'events.out.tfevents.{int(time.time())}.{socket.gethostname()}.'
        f'{os.getpid()}.{self._files:04d}.vit_jax'
    )
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

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    for tag, value in scalars.items():
      self._add_summary(step, scalar_summary.scalar_pb(tag, np.asarray(value, np.float32)))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._add_summary(0, hparams_summary.hparams_pb(dict(hparams)))

  def flush(self) -> None:
    if len(self._records) != self._written:
      self._path.write_bytes(bytes(self._records))
      self._written = len(self._records)
    self._last_flush = time.monotonic()
    if self._written >= self._max_file_bytes:
      self._start_file()

  def close(self) -> None:
    self.flush()


class LogWriter:
  """One log line per write: `[step] name=value, ...` (values to 6 significant digits)."""

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    logging.info(
        '[%d] %s',
        step,
        ', '.join(
            f'{k}={v:.6g}' if isinstance(v, float) else f'{k}={v}'
            for k, v in sorted(scalars.items())
        ),
    )

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    logging.debug('[Hyperparameters] %s', dict(hparams))  # config.json holds them too.

  def flush(self) -> None:
    pass

  def close(self) -> None:
    pass


class BackgroundWriter:
  """Writes through `writers`, in order, from one background thread, so that a slow file system
  never holds up the steps. A write's error is raised by the next `flush` (or `close`)."""

  def __init__(self, writers: Sequence[MetricWriter]):
    self._writers = list(writers)
    self._thread = futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix='metric_writer')
    self._pending: list[futures.Future] = []

  def _submit(self, write: str, *args) -> None:
    self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
    self._pending += [self._thread.submit(getattr(w, write), *args) for w in self._writers]

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    self._submit('write_scalars', step, dict(scalars))

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._submit('write_hparams', dict(hparams))

  def flush(self) -> None:
    pending, self._pending = self._pending, []
    for future in pending:
      future.result()
    for writer in self._writers:
      writer.flush()

  def close(self) -> None:
    try:
      self.flush()
      for writer in self._writers:
        writer.close()
    finally:
      self._thread.shutdown()


def create_writer(
    workdir: str, config: ml_collections.ConfigDict, *, just_logging: bool
) -> BackgroundWriter:
  """The training loop's writer: log lines, and on the process that writes metrics the event files
  and, with config.wandb.project, a Weights & Biases run (wandb_writer.py)."""
  writers: list[MetricWriter] = [LogWriter()]
  if not just_logging:
    writers.append(EventWriter(workdir))
    if wandb_writer.enabled(config):
      writers.append(wandb_writer.WandbWriter(workdir, config))
  return BackgroundWriter(writers)
