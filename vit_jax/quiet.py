"""Keeping TensorFlow's C++ start-up lines and warnings off the commands' output.

TensorFlow (the input pipeline, image decoding) reads these variables once its C++ runtime starts, and
that can happen as soon as jax has loaded and started its CPU backend: every command calls
`quiet_tensorflow()` before it imports anything else. oneDNN's kernels make no difference to an input
pipeline, and their banner is noise.
"""
import os


def quiet_tensorflow() -> None:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
