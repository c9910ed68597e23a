"""`dataset='folder'` on a zip archive (`data_dir=pets.zip`, or `pets.zip/pets` for a folder in it):
read unextracted as the folder it holds is read extracted."""

import os
import zipfile

import numpy as np
import pytest

import helpers
from vit_jax import data
from vit_jax.data import dataset_cache
from vit_jax.data import folder

_FILES = [
    'train/cat/a.jpg',
    'train/cat/nested/b.PNG',
    'train/dog/c.png',
    'train/dog/.ipynb_checkpoints/d.png',
    'train/dog/._c.png',
    'train/dog/notes.txt',
    'train/Emu/e.jpeg',
    'test/cat/f.jpg',
    'test/dog/g.png',
    'test/Emu/deeper/still/h.jpg',
]


def _folder_and_its_zip(tmp_path, method: int) -> tuple[str, str]:
  """A folder of images (nested, hidden and other files among them), and an archive of it as a
  laptop zips one: in a top folder, with macOS's __MACOSX/ beside it."""
  root = tmp_path / 'pets'
  for k, name in enumerate(_FILES):
    (root / name).parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(k).integers(0, 256, (9 + k, 7, 3), np.uint8)
    image_format = 'PNG' if name.lower().endswith('.png') else 'JPEG'
    is_image = not name.endswith('.txt')
    (root / name).write_bytes(helpers.encoded(pixels, image_format) if is_image else b'notes')
  archive = tmp_path / 'pets.zip'
  with zipfile.ZipFile(archive, 'w', method) as zipped:
    for name in _FILES:
      zipped.write(root / name, f'pets/{name}')
    zipped.writestr('__MACOSX/pets/train/cat/._a.jpg', b'\0\5\x16\7')
  return str(root), str(archive)


@pytest.mark.parametrize('method', [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_a_zipped_folder_reads_as_the_folder(tmp_path, method):
  """Its classes, files (relative) and labels, and its train and eval batches, from threads and from
  worker processes, are the folder's."""
  root, archive = _folder_and_its_zip(tmp_path, method)
  unzipped, zipped = folder.FolderSource(root, 'train'), folder.FolderSource(
      f'{archive}/pets', 'train'
  )
  assert zipped.class_names == unzipped.class_names == ('Emu', 'cat', 'dog')
  for split in ('train', 'test'):
    (files, labels), (theirs, their_labels) = zipped.split_files(split), unzipped.split_files(split)
    assert [os.path.relpath(f, f'{archive}/pets') for f in files] == [
        os.path.relpath(f, root) for f in theirs
    ]
    np.testing.assert_array_equal(labels, their_labels)
  configs = [
      helpers.data_config(d, dataset='folder', image_size=8) for d in (root, archive + '/pets')
  ]
  for config in configs:
    config.pp.update(flip=True, crop='inception')
  expected = helpers.take(data.train_iterator(configs[0], local_batch_size=4), 3)
  for workers in (0, 2):
    configs[1].data_workers = workers
    batches = data.train_iterator(configs[1], local_batch_size=4)
    try:
      helpers.assert_same_batches(helpers.take(batches, 3), expected)
    finally:
      batches.close()
  configs[1].data_workers = 0
  helpers.assert_same_batches(
      list(data.eval_iterator(configs[1], 'test', local_batch_size=2)),
      list(data.eval_iterator(configs[0], 'test', local_batch_size=2)),
  )


class _InfoZipName(zipfile.ZipInfo):
  """A name as Info-ZIP's zip (Linux's, macOS's) writes it: its UTF-8 bytes, without the UTF-8 flag
  that Python's zipfile sets (so zipfile reads them back as CP437)."""

  def _encodeFilenameFlags(self):  # pylint: disable=invalid-name
    return self.filename.encode('utf-8'), self.flag_bits


def test_an_info_zip_archive_reads_as_unzip_extracts_it(tmp_path):
  """Non-ASCII class names without the UTF-8 flag, './'-prefixed names, an upper-case .ZIP: the
  classes, files and labels of the folder `unzip` extracts."""
  root = tmp_path / 'pets'
  names = ['train/cat/a.png', 'train/À/b.png', 'train/Û/c.png', 'train/é/d.png', 'test/À/e.png']
  archive = tmp_path / 'PETS.ZIP'
  with zipfile.ZipFile(archive, 'w') as zipped:
    for k, name in enumerate(names):
      (root / name).parent.mkdir(parents=True, exist_ok=True)
      (root / name).write_bytes(helpers.encoded(np.full((4, 4, 3), k, np.uint8), 'PNG'))
      zipped.writestr(_InfoZipName(f'./pets/{name}'), (root / name).read_bytes())
  assert not any(i.flag_bits & 0x800 for i in zipfile.ZipFile(archive).infolist())
  unzipped = folder.FolderSource(str(root), 'train')
  zipped = folder.FolderSource(f'{archive}/pets', 'train')
  assert zipped.class_names == unzipped.class_names == ('cat', 'À', 'Û', 'é')
  for split in ('train', 'test'):
    (files, labels), (theirs, their_labels) = zipped.split_files(split), unzipped.split_files(split)
    assert [os.path.relpath(f, f'{archive}/pets') for f in files] == [
        os.path.relpath(f, root) for f in theirs
    ]
    np.testing.assert_array_equal(labels, their_labels)
  assert folder.read_file(files[0]) == (root / 'test/À/e.png').read_bytes()


@pytest.mark.parametrize('empty', ['train/Yak', 'test/Yak'])
def test_an_empty_folder_in_an_archive_is_the_empty_folder_unzip_extracts(tmp_path, empty):
  """A class folder without files, zipped as `zip -r` zips it (an entry of its own): the error of
  the folder extracted, not a class left out."""
  root, archive = _folder_and_its_zip(tmp_path, zipfile.ZIP_STORED)
  (tmp_path / 'pets' / empty).mkdir()
  with zipfile.ZipFile(archive, 'a') as zipped:
    zipped.mkdir(f'pets/{empty}')
  errors = []
  for data_dir in (root, f'{archive}/pets'):
    with pytest.raises(ValueError) as error:
      folder.FolderSource(data_dir, 'train').split_files(empty.split('/')[0])
    errors.append(str(error.value).replace(data_dir, '<data_dir>'))
  assert errors[0] == errors[1]
  assert 'Yak' in errors[0]


def test_an_archive_of_a_folder_in_a_folder_names_the_data_dir_to_set(tmp_path):
  _, archive = _folder_and_its_zip(tmp_path, zipfile.ZIP_DEFLATED)
  error = helpers.data_error(archive, dataset='folder')
  assert f"Zip archive {archive} has no train/ folder at its top, which holds ['pets']" in error
  assert f'set config.data_dir={archive}/pets (a folder in the archive)' in error
  assert 'does not exist' in helpers.data_error(f'{archive}/pets/nothing', dataset='folder')


def test_a_dataset_cache_that_cannot_be_written_is_named_not_the_images(tmp_path, monkeypatch):
  """An archive's index goes to the dataset cache: where it cannot, the run stops naming the
  cache, not on "no image decodes" (the probe's reading of any OSError)."""
  _, archive = _folder_and_its_zip(tmp_path, zipfile.ZIP_STORED)
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, f'{archive}/cache')  # Under a file.
  error = helpers.data_error(f'{archive}/pets', dataset='folder')
  assert error == (
      f'Indexing zip archive {archive}: the dataset cache {archive}/cache cannot be written '
      f'(Not a directory): set {dataset_cache.CACHE_VARIABLE} to a folder this process may write'
  )


def test_a_run_reads_an_archive_rewritten_since_the_last_in_the_process(tmp_path):
  """A notebook's second run: the archive at the same path holds other images (its index in the
  process was the first's, keyed by the path: the old files, at the old offsets)."""
  root, archive = _folder_and_its_zip(tmp_path, zipfile.ZIP_DEFLATED)
  config = helpers.data_config(f'{archive}/pets', dataset='folder', data_workers=0)
  assert data.get_info(config).num_train == 4
  with zipfile.ZipFile(archive, 'w') as zipped:  # Fewer classes, more images in each.
    for k in range(6):
      pixels = np.full((8, 8, 3), 40 * k, np.uint8)
      zipped.writestr(f'pets/train/{"ab"[k % 2]}/{k}.png', helpers.encoded(pixels, 'PNG'))
      zipped.writestr(f'pets/test/{"ab"[k % 2]}/{k}.png', helpers.encoded(pixels, 'PNG'))
  info = data.get_info(config)
  assert (info.class_names, info.num_train, info.num_eval) == (('a', 'b'), 6, 6)
  (batch,) = data.eval_iterator(config, 'test', local_batch_size=6)
  assert sorted(batch['label'][batch['mask']].tolist()) == [0, 0, 0, 1, 1, 1]
  assert sorted(batch['image'][batch['mask']][:, 0, 0, 0].tolist()) == [0, 40, 80, 120, 160, 200]
