"""Input pipelines: the bundled digits, image folders, Hugging Face datasets and tensorflow_datasets
datasets (ArrayRecord), as per-host numpy batches, without TensorFlow (grain, PIL, numpy).

    info = data.get_info(config)  # Validates the config; call it before compiling anything.
    data.prepare(config, jax.process_index(), jax.process_count())  # What reading needs made.
    for batch in data.train_iterator(config, local_batch_size=b, start_step=step,
                                     process_index=jax.process_index(),
                                     process_count=jax.process_count()):
      ...
    for batch in data.eval_iterator(config, config.eval_split, local_batch_size=b, ...):
      ...  # batch['mask'] is False on padding rows.
    passes = data.eval_passes(config, config.eval_split, local_batch_size=b, ...)
    for batch in passes():  # The same batches at every call, from workers started once.
      ...
    passes.close()

A split is a split name, or for a tensorflow_datasets dataset or the digits a slice of one (e.g.
train_split 'train[:90%]' and eval_split 'train[90%:]' hold out a minival); for an image folder, a
sub-folder.
"""

from vit_jax.data.eval_pipeline import eval_iterator
from vit_jax.data.eval_pipeline import eval_passes
from vit_jax.data.eval_pipeline import num_eval_batches
from vit_jax.data.pipeline import num_data_shards
from vit_jax.data.pipeline import prepare
from vit_jax.data.pipeline import train_iterator
from vit_jax.data.pipeline import UnreadableSplit
from vit_jax.data.sources import DatasetInfo
from vit_jax.data.sources import class_names
from vit_jax.data.sources import get_info
from vit_jax.data.sources import is_label_set
from vit_jax.data.sources import listed_labels
from vit_jax.data.sources import num_examples
