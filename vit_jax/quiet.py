"""Keeping TensorFlow's C++ start-up lines and warnings off the commands' output.

TensorFlow (the input pipeline, image decoding) reads these variables once its C++ runtime starts, and
that can happen as soon as jax has loaded and started its CPU backend: every command calls
`quiet_tensorflow()` before it imports anything else, and vit_jax.data before it imports TensorFlow.
oneDNN's kernels make no difference to an input pipeline's speed, their banner is noise, and on CPUs
where TensorFlow turns them on (AVX-512) they round some augmentations differently: with them off
everywhere, a run's batches are the same bit for bit whether a command or a notebook makes them.
"""
import os


def quiet_tensorflow() -> None:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
