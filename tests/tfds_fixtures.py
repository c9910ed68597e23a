"""The bundled digits as a tensorflow_datasets builder, for tests that need a prepared tfds dataset.

vit_jax serves the digits from memory (vit_jax/data/digits.py); the tests prepare them with tfds to
exercise the tfds source on known data. Subclasses change the features or the order (class-sorted,
coarse labels, label sets).
"""

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

import helpers
from vit_jax.data import digits


def png(image: np.ndarray) -> bytes:
  """`image` as the PNG file PIL writes (lossless). tfds encodes an array with TensorFlow, which the GPU
  machines lack, and writes bytes as they are: with these, preparing a dataset needs no TensorFlow.
  """
  return helpers.encoded(image[..., 0] if image.shape[-1] == 1 else image, 'PNG')


# Not registered with tfds: each test names its builder's data_dir, and tfds's registry is left alone.
class DigitsBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """scikit-learn's handwritten digits: 8x8 RGB (grey repeated), labels '0'..'9'."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Stratified 80/20 split, random_state=0.'}
  pkg_dir_path = epath.Path(__file__).parent  # tfds looks for metadata files beside the builder.
  code_path = None  # Downloads nothing, so no checksums to look for.

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(8, 8, 3)),
                'label': tfds.features.ClassLabel(names=[str(d) for d in range(10)]),
            }
        ),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download.
    return {
        name: self._generate_examples(*arrays) for name, arrays in digits.split_arrays().items()
    }

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {'image': png(image), 'label': label}


def prepare(
    builder_class: type[tfds.core.DatasetBuilder], data_dir: str, file_format: str = 'array_record'
) -> str:
  """Prepares `builder_class`'s dataset in `data_dir` (ArrayRecord: what vit_jax reads); its name."""
  builder = builder_class(data_dir=data_dir, file_format=file_format)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return builder.name
