"""Input pipelines: tensorflow_datasets, image folders and the bundled digits, as per-host numpy batches.

    info = data.get_info(config)  # Validates the config; call it before compiling anything.
    for batch in data.train_iterator(config, local_batch_size=b, start_step=step,
                                     process_index=jax.process_index(),
                                     process_count=jax.process_count()):
      ...
    for batch in data.eval_iterator(config, config.eval_split, local_batch_size=b, ...):
      ...  # batch['mask'] is False on padding rows.

A split is a split name, or for a tensorflow_datasets dataset a slice of one (e.g. train_split
'train[:90%]' and eval_split 'train[90%:]' hold out a minival); for an image folder, a sub-folder.
"""
import sys

from vit_jax import quiet


def _import_tensorflow_without_keras() -> None:
  """TensorFlow imports Keras' optimizers as it loads (for Keras models in SavedModels), and with them
  all of Keras, scikit-learn and matplotlib: 1.5 s of every command's start, for nothing an input
  pipeline uses. A None entry in sys.modules makes that one import fail, which TensorFlow allows
  for; `tf.keras` still imports Keras when something first uses it."""
  optimizers = 'keras.src.optimizers'
  if 'tensorflow' in sys.modules or optimizers in sys.modules:
    return
  sys.modules[optimizers] = None
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
  finally:
    del sys.modules[optimizers]


# Also where vit_jax is used as a library: oneDNN's kernels round the augmentations differently, so a
# run resumed by a command would not continue one started in a notebook bit for bit.
quiet.quiet_tensorflow()
_import_tensorflow_without_keras()
import tensorflow as tf  # pylint: disable=g-import-not-at-top,wrong-import-position

# TensorFlow only feeds the input pipeline; it must leave the accelerators' memory to JAX.
try:
  tf.config.set_visible_devices([], 'GPU')
except RuntimeError:  # TF's devices were initialised before this import; that choice stands.
  pass

# pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.data.pipeline import DatasetInfo
from vit_jax.data.pipeline import class_names
from vit_jax.data.pipeline import eval_iterator
from vit_jax.data.pipeline import get_info
from vit_jax.data.pipeline import is_label_set
from vit_jax.data.pipeline import listed_labels
from vit_jax.data.pipeline import num_data_shards
from vit_jax.data.pipeline import num_eval_batches
from vit_jax.data.pipeline import num_examples
from vit_jax.data.pipeline import train_iterator
