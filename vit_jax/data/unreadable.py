"""Naming the examples a source could not read.

An image folder drops an unreadable file where it decodes it (`FolderSource.load`), at the cost of a
plain parallel map: TensorFlow cannot catch a decoding error inside one element, and a dataset per
element to do so costs three times as much as decoding. The file is named here instead, from the gap
it leaves in the stream positions, which run on by one from example to example otherwise; a check
per batch (or per example) is cheap, and the name comes from the position through the stream's order.
Each file is named once per process: an endless train stream meets it again every epoch, and a log of
the same names over and over hides everything else.
"""
import threading
from typing import Callable

from absl import logging
import numpy as np
import tensorflow as tf

# The files named so far in this process, and the lock that makes naming one happen once.
_named: set[str] = set()
_named_lock = threading.Lock()


def _name_once(name: str) -> None:
  with _named_lock:
    if name in _named:
      return
    _named.add(name)
  logging.warning('Skipping unreadable image file %s', name)


def name_dropped(ds: tf.data.Dataset, first: int,
                 records_at: Callable[[tf.Tensor], tf.Tensor]) -> tf.data.Dataset:
  """`ds` without 'position', logging a warning that names each example missing from it (once a
  process: `_name_once`).

  Each element's 'position' (scalar, or [b] for a batch) runs on from `first` but for dropped
  examples; `records_at(positions)` is the record (an image's path) at each of these positions. A drop
  is seen at the next element that `ds` yields.
  """

  def warn(missing: tf.Tensor) -> bool:
    for name in records_at(missing).numpy():
      _name_once(name.decode())
    return True

  def check(expected: tf.Tensor, element: dict[str, tf.Tensor]):
    positions = tf.reshape(element['position'], [1, -1])
    span = tf.range(expected, positions[0, -1] + 1)[None]
    missing = tf.sets.difference(span, positions).values
    warned = tf.cond(tf.size(missing) > 0,
                     lambda: tf.reshape(tf.py_function(warn, [missing], tf.bool), []),
                     lambda: tf.constant(True))
    with tf.control_dependencies([warned]):
      following = tf.identity(positions[0, -1] + 1)
    return following, {k: v for k, v in element.items() if k != 'position'}

  return ds.scan(np.int64(first), check)
