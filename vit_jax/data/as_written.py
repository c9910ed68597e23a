"""`as_written(fn)`: a function for tf.data traced as it is written, without AutoGraph.

tf.data runs AutoGraph on each function given to `map`, `flat_map` or `interleave`: it rewrites the
Python source of that function and of everything it calls, so that Python `if`s and loops over
tensors become graph ops. The pipeline's functions branch with `tf.cond`, `tf.switch_case` and
`tf.where` and never on a tensor's value in Python, so the rewrite changes nothing, and for the
preprocessing chain it was half of building a train pipeline (1.5-1.7 s with it, 0.8-0.9 s without,
on 2 cores): ~5% of a small run's start-up, paid again by every process and every pipeline a test
builds.
"""
from typing import Callable, TypeVar

import tensorflow as tf

Fn = TypeVar('Fn', bound=Callable)


def as_written(fn: Fn) -> Fn:
  return tf.autograph.experimental.do_not_convert(fn)
