"""The scalars a run wrote to its TensorBoard event files (train/event_writer.py), read without
TensorFlow and while the run is still writing them."""

import struct
from typing import Iterator

from etils import epath
from google.protobuf import message
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

EVENTS = 'events.out.tfevents.*'


def lower_is_better(metric: str) -> bool:
  """Whether a logged eval metric is better lower: a loss (a name ending in 'loss': the evaluator's own
  name may hold the word, as 'lossy_test_top1'); else higher (top1, top5, map, fewshot_5shot...)."""
  return metric.endswith('loss')


def encode_record(data: bytes) -> bytes:
  """One TFRecord, as `read_events` reads them: length, its masked CRC-32C, the data, its CRC."""
  header = struct.pack('<Q', len(data))
  return (
      header
      + struct.pack('<I', masked_crc32c(header))
      + data
      + struct.pack('<I', masked_crc32c(data))
  )


def read_events(data: bytes) -> Iterator[event_pb2.Event]:
  """The events of an event file's bytes (TFRecords: length, its CRC, the record, its CRC), up to the
  first incomplete or unreadable record: a running writer may have written half of its last one."""
  offset = 0
  while offset + 12 <= len(data):
    (length,) = struct.unpack_from('<Q', data, offset)
    if offset + 12 + length + 4 > len(data):
      return
    try:
      yield event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
    except message.DecodeError:
      return
    offset += 12 + length + 4


def _created(path: epath.Path) -> tuple[int, str]:
  """events.out.tfevents.<seconds>.<host>...: a resumed run's new file sorts after the old ones."""
  seconds = path.name.split('.')[3]
  return (int(seconds) if seconds.isdigit() else 0, path.name)


def _scalars(event: event_pb2.Event) -> list[tuple[str, float]]:
  """(tag, value) of each scalar in an event."""
  found = []
  for value in event.summary.value:
    if value.HasField('simple_value'):  # TF1-style summaries.
      found.append((value.tag, value.simple_value))
    elif value.metadata.plugin_data.plugin_name == 'scalars':  # tf.summary.scalar, as clu writes.
      found.append((value.tag, float(tensor_util.make_ndarray(value.tensor))))
  return found


def read_scalars(workdir: str) -> dict[str, dict[int, float]]:
  """tag -> step -> value of every scalar in `workdir`'s event files, in the order they were written.

  A resumed run restarts from its last checkpoint, and its new file (a later one) goes back to steps
  the interrupted run had logged after that checkpoint: a scalar at a step before the latest one seen
  drops every value logged at that step or after it (TensorBoard's purge of orphaned data), which the
  resumed run logs again. So a later file wins a step, and what only the interrupted run logged after
  its checkpoint (its last steps, an evaluation) is not reported as the run's.
  """
  scalars: dict[str, dict[int, float]] = {}
  latest = None
  for path in sorted(epath.Path(workdir).glob(EVENTS), key=_created):
    for event in read_events(path.read_bytes()):
      found = _scalars(event)
      if not found:  # The file's header, hyper-parameters: no step of the curves.
        continue
      if latest is not None and event.step < latest:
        for steps in scalars.values():
          for step in [step for step in steps if step >= event.step]:
            del steps[step]
      latest = event.step
      for tag, value in found:
        scalars.setdefault(tag, {})[event.step] = value
  return {tag: steps for tag, steps in scalars.items() if steps}
