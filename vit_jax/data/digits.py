"""The bundled offline dataset: scikit-learn's 8x8 handwritten digits as a tfds dataset.

scikit-learn ships the 1,797 images inside its package, so preparing this dataset needs no network.
The split is the seeded, stratified 80/20 one used for the baselines in DESIGN.md: 1,437 train and
360 test images.
"""
import numpy as np
import tensorflow_datasets as tfds


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
  """All 1,797 digits as uint8 RGB images [n, 8, 8, 3] and int64 labels [n], in scikit-learn's order."""
  # Imported here: scikit-learn takes a second to import, and a run reads the prepared digits.
  from sklearn import datasets as sk_datasets  # pylint: disable=g-import-not-at-top
  digits = sk_datasets.load_digits()
  # scikit-learn's pixels are counts in 0..16 (of a 4x4 block of a 32x32 bitmap); spread them to 0..255.
  grey = np.round(digits.images * 255 / 16).astype(np.uint8)
  return np.repeat(grey[..., None], 3, axis=-1), digits.target.astype(np.int64)


def split_arrays() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{'train': (images, labels), 'test': (images, labels)}: the fixed stratified split."""
  from sklearn import model_selection  # pylint: disable=g-import-not-at-top
  images, labels = digits_arrays()
  train_x, test_x, train_y, test_y = model_selection.train_test_split(
      images, labels, test_size=0.2, random_state=0, stratify=labels)
  return {'train': (train_x, train_y), 'test': (test_x, test_y)}


# Not registered with tfds: `config.dataset='digits'` maps to this class in our code, so no tfds name
# can clash with it and tfds's global registry is left alone.
class VitJaxDigits(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """scikit-learn's handwritten digits: 8x8 RGB (grey repeated), labels '0'..'9'."""

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Stratified 80/20 split, random_state=0.'}
  # tfds looks for download checksums next to a builder's code via `importlib_resources`, which is
  # not always installed; this builder downloads nothing, so there is nothing to look for.
  code_path = None

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            'image': tfds.features.Image(shape=(8, 8, 3)),
            'label': tfds.features.ClassLabel(names=[str(d) for d in range(10)]),
        }),
        supervised_keys=('image', 'label'),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # Nothing to download.
    return {name: self._generate_examples(*arrays) for name, arrays in split_arrays().items()}

  def _generate_examples(self, images: np.ndarray, labels: np.ndarray):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {'image': image, 'label': label}


def prepared_builder(data_dir: str | None) -> VitJaxDigits:
  """The digits builder for `data_dir`, preparing the data there first if needed (about a second)."""
  builder = VitJaxDigits(data_dir=data_dir)
  if not builder.is_prepared():
    try:
      builder.download_and_prepare(
          download_config=tfds.download.DownloadConfig(try_download_gcs=False))
    except OSError:
      # tfds writes into a private temporary folder and renames it into place, so when several
      # processes prepare at once, one rename wins and the others fail here on the existing folder.
      if not VitJaxDigits(data_dir=data_dir).is_prepared():
        raise
  # A fresh builder reads the split sizes from the prepared files, whoever wrote them.
  return VitJaxDigits(data_dir=data_dir)
