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
import tensorflow as tf

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
from vit_jax.data.pipeline import num_data_shards
from vit_jax.data.pipeline import num_eval_batches
from vit_jax.data.pipeline import num_examples
from vit_jax.data.pipeline import train_iterator
