"""Datasets prepared by tensorflow_datasets (and the bundled digits, which is one)."""
import tensorflow as tf
import tensorflow_datasets as tfds

from vit_jax.data import preprocess

UNKNOWN_DATASET = (
    "Unknown dataset {name!r}: use 'digits' (bundled, offline), 'folder' (set config.data_dir to a "
    "root with train/ and test/ sub-folders of class folders), or a tensorflow_datasets name such as "
    "cifar10, cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012, imagenet21k "
    "(see tfds.list_builders())")


def prepared_builder(name: str, data_dir: str | None) -> tfds.core.DatasetBuilder:
  """The builder of tfds dataset `name` (e.g. 'cifar10', 'imagenet2012:5.1.0') already prepared in
  `data_dir`; raises a one-line ValueError saying how to fix it otherwise. Never downloads."""
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:
    raise ValueError(UNKNOWN_DATASET.format(name=name)) from None
  except (AssertionError, ValueError) as e:  # A version or config tfds does not know.
    first_line = str(e).strip().splitlines()[0]
    raise ValueError(f'Cannot load tensorflow_datasets dataset {name!r}: {first_line}') from None
  if not builder.is_prepared():
    root = builder.data_dir_root
    raise ValueError(
        f'tensorflow_datasets dataset {name!r} is not prepared in {root}: run '
        f'`tfds build {name} --data_dir={root}` on a machine with internet (some datasets, e.g. '
        f'imagenet2012, need a manual download first) and copy {root}/{builder.name} here, or set '
        f'config.data_dir to where it is prepared')
  return builder


class TfdsSource:
  """A prepared tfds dataset with an 'image' feature and a ClassLabel 'label' feature."""

  def __init__(self, builder: tfds.core.DatasetBuilder):
    features = dict(builder.info.features)
    if not (isinstance(features.get('image'), tfds.features.Image)
            and isinstance(features.get('label'), tfds.features.ClassLabel)):
      raise ValueError(
          f'Dataset {builder.name!r} has features {sorted(features)}: vit_jax needs an '
          f"Image feature 'image' and a ClassLabel feature 'label'")
    self._builder = builder
    self.class_names = tuple(features['label'].names)

  def _shard(self, split: str, process_index: int, process_count: int):
    # Contiguous, equal-sized (to one example) blocks: the tfds.split_for_jax_process layout.
    return tfds.even_splits(split, n=process_count)[process_index]

  def num_examples(self, split: str, process_index: int = 0, process_count: int = 1) -> int:
    """Examples of `split` in the shard of process `process_index` of `process_count`."""
    try:
      return self._builder.info.splits[self._shard(split, process_index, process_count)].num_examples
    except ValueError as e:  # tfds: "Unknown split 'x'. Should be one of [...]." or a bad slice.
      first_line = str(e).strip().splitlines()[0]
      raise ValueError(f'Bad split {split!r} for dataset {self._builder.name!r}: {first_line}') from None

  def records(self, split: str, process_index: int = 0, process_count: int = 1) -> tf.data.Dataset:
    """This process's shard as {'record': encoded image bytes, 'label': int32}, in a fixed order."""
    # Only the image bytes and the label are read; decoding waits until after any skipping.
    decoders = tfds.decode.PartialDecoding({'image': True, 'label': True},
                                           decoders={'image': tfds.decode.SkipDecoding()})
    ds = self._builder.as_dataset(split=self._shard(split, process_index, process_count),
                                  shuffle_files=False, decoders=decoders)
    return ds.map(lambda ex: {'record': ex['image'], 'label': tf.cast(ex['label'], tf.int32)})

  def load(self, ds: tf.data.Dataset) -> tf.data.Dataset:
    """Decodes each 'record' into 'image' (uint8 [h, w, 3])."""
    def decode(example):
      rest = {k: v for k, v in example.items() if k != 'record'}
      return {**rest, 'image': preprocess.decode(example['record'])}
    return ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
