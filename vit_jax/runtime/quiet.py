"""TensorFlow's C++ start-up lines off, where it is installed (the `tfrecord` extra).

No command imports TensorFlow, but etils.epath serves gs:// paths through it when it is installed, and
its C++ runtime reads these variables once, when it starts: every command calls `quiet_tensorflow()`
before it imports anything else. Its banners are noise for a run, and oneDNN's kernels would round
differently on AVX-512 CPUs than elsewhere.
"""

import os


def quiet_tensorflow() -> None:
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')
