"""Converts a tfds dataset prepared as TFRecord (tfds' default) to ArrayRecord once, beside it, so that
vit_jax reads it without TensorFlow. The conversion itself needs TensorFlow: pip install '.[tfrecord]'.

  python -m vit_jax.tools.to_array_record DATA_DIR/cifar10/3.0.2
"""

from vit_jax.runtime import cli
from vit_jax.data import tfds_source

if __name__ == '__main__':
  cli.run(tfds_source.convert_main, flags_parser=cli.flags_parser(tfds_source.CONVERT_USAGE))
