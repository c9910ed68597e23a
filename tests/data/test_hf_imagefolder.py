"""Hugging Face image folders (`dataset='huggingface'` on a repository of image files, datasets'
imagefolder format): labelled by their folders, or listed in metadata.csv, .jsonl or .parquet
files; read as `datasets.load_dataset` reads them: the same splits, rows, images and labels."""

import io
import json
import os
import zipfile

import fsspec
import numpy as np
from PIL import Image
from PIL import ImageOps
import pytest

import helpers
from vit_jax import data
from vit_jax.data import hf_source
from vit_jax.data import images

datasets = pytest.importorskip('datasets')


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
  helpers.offline_datasets(monkeypatch, str(tmp_path_factory.mktemp('hf_cache')))


def _encoded(name: str, seed: int, orientation: int | None = None) -> bytes:
  """A random image of a size of its own, as the extension of `name` says (JPEG with an EXIF
  orientation)."""
  rng = np.random.default_rng(seed)
  pixels = rng.integers(0, 256, (9 + seed % 4, 7 + seed % 3, 3), np.uint8)
  image_format = 'PNG' if name.lower().endswith('.png') else 'JPEG'
  return helpers.encoded(pixels, image_format, orientation)


def _image(path, seed: int, orientation: int | None = None) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(_encoded(str(path), seed, orientation))


def _zip(path, files: dict[str, bytes], method: int = zipfile.ZIP_DEFLATED) -> None:
  """`files` zipped into archive `path`, with the files macOS adds, which datasets leaves out."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with zipfile.ZipFile(path, 'w', method) as archive:
    for name, data in files.items():
      archive.writestr(name, data)
    archive.writestr('__MACOSX/._a.jpg', b'\0\5\x16\7')
    archive.writestr('.DS_Store', b'\0\0\0\1Bud1')


def _rows(source, split: str) -> list[tuple[np.ndarray, int]]:
  records = source.examples(split)
  return [
      (images.rgb(images.pixels(e['image'])), int(e['label']))
      for e in (source.load(records.read(k)) for k in range(records.num_records))
  ]


def _assert_as_datasets_reads(root, label: str = 'label') -> hf_source.HuggingFaceSource:
  """Ours and datasets' splits, class names, and every row's pixels and label (by name)."""
  theirs = datasets.load_dataset(str(root))
  ours = hf_source.HuggingFaceSource(str(root), 'train', label)
  assert list(ours._rows.sizes) == list(theirs)  # pylint: disable=protected-access
  feature = theirs['train'].features[label]
  for split in theirs:
    rows = _rows(ours, split)
    assert len(rows) == len(theirs[split]), split
    for k, ((image, ours_label), row) in enumerate(zip(rows, theirs[split])):
      np.testing.assert_array_equal(image, np.asarray(row['image'].convert('RGB')), f'{split} {k}')
      named = feature.int2str(row[label]) if hasattr(feature, 'int2str') else str(row[label])
      assert ours.class_names[ours_label] == named, (split, k)
  return ours


def test_class_folders_read_as_datasets_loads_them(tmp_path):
  """Labels are the folders' names (upper-case extensions, EXIF orientations, files that are not
  images and hidden ones left out)."""
  for k, name in enumerate(
      ['train/cat/a.jpg', 'train/cat/b.JPG', 'train/dog/c.png', 'train/dog/d.jpeg']
      + ['train/bird/e.jpg', 'test/bird/f.jpg', 'test/dog/g.png', 'test/cat/h.jpg']
  ):
    _image(tmp_path / name, k, orientation=k % 9 or None)
  (tmp_path / 'train/cat/notes.txt').write_text('not an image')
  _image(tmp_path / 'train/.thumbnails/x.jpg', 99)
  source = _assert_as_datasets_reads(tmp_path)
  assert source.class_names == ('bird', 'cat', 'dog')


@pytest.mark.parametrize('kind', ['csv', 'jsonl', 'parquet'])
def test_metadata_files_read_as_datasets_loads_them(tmp_path, kind):
  """A metadata file a split names its images (in sub-folders too) and their columns; an image it
  does not list is no example."""
  rows = {'train': [], 'test': []}
  for split, count in (('train', 7), ('test', 4)):
    for k in range(count):
      name = f'images/{k:02d}.jpg' if k % 2 else f'{k:02d}.png'
      _image(tmp_path / split / name, k + 10 * (split == 'test'), orientation=k % 9 or None)
      species = ['owl', 'heron', 'wren'][(k * 5) % 3]
      rows[split].append({'file_name': name, 'label': (k * 5) % 3, 'species': species})
    _image(tmp_path / split / 'unlisted.jpg', 50)
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  for split, listed in rows.items():
    path = tmp_path / split / f'metadata.{kind}'
    if kind == 'csv':
      path.write_text(
          'file_name,label,species\n'
          + ''.join(f"{r['file_name']},{r['label']},{r['species']}\n" for r in listed)
      )
    elif kind == 'jsonl':
      path.write_text(''.join(json.dumps(r) + '\n' for r in listed))
    else:
      pq.write_table(pa.Table.from_pylist(listed), path)
  numbers = _assert_as_datasets_reads(tmp_path, 'label')
  assert numbers.class_names == ('0', '1', '2')
  names = _assert_as_datasets_reads(tmp_path, 'species')
  assert names.class_names == ('heron', 'owl', 'wren')


@pytest.mark.parametrize(
    'method', [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA]
)
def test_zip_archives_with_metadata_files_read_as_datasets_loads_them(tmp_path, method):
  """A split's zip archives hold its images and the metadata file that lists them, in a folder."""
  for split, count in (('train', 6), ('test', 3)):
    files, rows = {}, ['file_name,label']
    for k in range(count):
      name = f'images/{k}.jpg' if k % 2 else f'{k}.png'
      files[f'{split}/{name}'] = _encoded(name, k + 10 * (split == 'test'), k % 9 or None)
      rows.append(f"{name},{['owl', 'wren', 'heron'][k % 3]}")
    files[f'{split}/metadata.csv'] = '\n'.join(rows).encode()
    _zip(tmp_path / 'data' / f'{split}.zip', files, method)
  source = _assert_as_datasets_reads(tmp_path)
  assert source.class_names == ('heron', 'owl', 'wren')
  record = source.examples('train').read(1)
  assert source.describe(record) == f'{tmp_path}/data/train.zip/train/images/1.jpg'


def test_zip_archives_of_class_folders_are_labelled_by_the_folders_in_them(tmp_path):
  """datasets' rows of images (its `drop_labels` rows: each archive extracted and walked), each
  labelled by its folder in the archive, and its ClassLabel names: the folders in the archives.
  (datasets 5.2 labels each image by the folder of the archive instead, which is no class name, and
  fails.)"""
  names = ['cat/b.jpg', 'cat/a.PNG', 'dog/c.jpg', 'bird/d.jpeg', 'dog/e.png']
  _zip(
      tmp_path / 'train/part1.zip', {n: _encoded(n, k, k % 9 or None) for k, n in enumerate(names)}
  )
  _zip(tmp_path / 'train/part2.zip', {'bird/f.jpg': _encoded('f.jpg', 8)}, zipfile.ZIP_STORED)
  _zip(tmp_path / 'test/all.zip', {n: _encoded(n, 20 + k) for k, n in enumerate(names[2:])})
  builder = datasets.load_dataset_builder(str(tmp_path))
  try:
    builder.download_and_prepare()
  except datasets.exceptions.DatasetGenerationError:
    pass  # datasets 5.2's labels; its features are inferred before.
  assert builder.info.features['label'].names == ['bird', 'cat', 'dog']
  theirs = datasets.load_dataset(str(tmp_path), drop_labels=True)
  ours = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')
  assert ours.class_names == ('bird', 'cat', 'dog')
  for split in theirs:
    images_of = theirs[split].cast_column('image', datasets.Image(decode=False))
    rows = _rows(ours, split)
    assert len(rows) == len(images_of)
    for (image, label), row in zip(rows, images_of):
      url = row['image']['path']  # fsspec's zip://<file in the archive>::<archive>.
      with fsspec.open(url) as f:
        expected = ImageOps.exif_transpose(Image.open(io.BytesIO(f.read())))
      np.testing.assert_array_equal(image, np.asarray(expected.convert('RGB')))
      folder = os.path.dirname(url.removeprefix('zip://').split('::')[0])
      assert ours.class_names[label] == folder, url


def test_the_readmes_class_label_names_a_metadata_files_labels(tmp_path):
  for k in range(4):
    _image(tmp_path / 'train' / f'{k}.jpg', k)
  (tmp_path / 'train/metadata.csv').write_text(
      'file_name,label\n0.jpg,wren\n1.jpg,owl\n2.jpg,wren\n3.jpg,heron\n'
  )
  features = datasets.Features(
      {'image': datasets.Image(), 'label': datasets.ClassLabel(names=['wren', 'owl', 'heron'])}
  )
  helpers.hf_dataset_card(tmp_path, features, {'default': {}})
  source = _assert_as_datasets_reads(tmp_path)
  assert source.class_names == ('wren', 'owl', 'heron')
  assert source.split_labels('train').tolist() == [0, 1, 0, 2]


def _error(root, **overrides) -> str:
  return helpers.data_error(str(root), dataset='huggingface', **overrides)


def test_bad_image_folders_are_one_line_errors_naming_the_fix(tmp_path):
  one_class = tmp_path / 'one_class'
  _image(one_class / 'train/cat/a.jpg', 0)
  _image(one_class / 'test/cat/b.jpg', 1)
  assert 'has no labels: datasets labels images by their folders only where' in _error(one_class)
  uneven = tmp_path / 'uneven'  # Two classes, at two depths.
  _image(uneven / 'train/cat/a.jpg', 0)
  _image(uneven / 'train/dog/more/b.jpg', 1)
  assert 'has no labels' in _error(uneven)
  for unlabelled_root in (one_class, uneven):  # As datasets reads them.
    assert list(datasets.load_dataset(str(unlabelled_root))['train'].features) == ['image']

  zipped = tmp_path / 'zipped'
  _image(zipped / 'train/cat/a.jpg', 0)
  (zipped / 'train/more.zip').write_bytes(b'PK')
  assert 'more.zip is not a readable zip archive (File is not a zip file): download' in _error(
      zipped
  )
  tables = tmp_path / 'tables'  # datasets reads zip archives of CSV files as a csv dataset.
  _zip(tables / 'train.zip', {'a.csv': b'x,y\n1,2\n', 'b.csv': b'x,y\n3,4\n'})
  assert 'holds no Parquet, Arrow, WebDataset (.tar) or image files' in _error(tables)
  assert '(its files are csv)' in _error(tables)
  badly_listed = tmp_path / 'badly_listed'
  _zip(
      badly_listed / 'train.zip',
      {'a.jpg': _encoded('a.jpg', 0), 'metadata.csv': b'file_name\n,,\n'},
  )
  assert f'{badly_listed}/train.zip/metadata.csv is not a readable metadata file' in _error(
      badly_listed
  )
  shards = tmp_path / 'shards'  # Tar shards zipped: datasets' webdataset, read unzipped only.
  _zip(shards / 'train.zip', {'a.tar': b'', 'b.tar': b''})
  assert 'train.zip is a zip archive of webdataset files, which vit_jax reads unzipped' in _error(
      shards
  )

  for name, text, expected in (
      ('nameless', 'path,label\na.jpg,1\n', "has no 'file_name' column"),
      ('escaping', 'file_name,label\n../a.jpg,1\n', 'not a path inside its folder'),
  ):
    _image(tmp_path / name / 'train/a.jpg', 0)
    (tmp_path / name / 'train/metadata.csv').write_text(text)
    assert expected in _error(tmp_path / name)

  carded = tmp_path / 'carded'  # The README's features: the metadata is not looked at first.
  _image(carded / 'train/a.jpg', 0)
  (carded / 'train/metadata.csv').write_text('path,label\na.jpg,1\n')
  features = datasets.Features({'image': datasets.Image(), 'label': datasets.Value('int64')})
  helpers.hf_dataset_card(carded, features, {'default': {}})
  assert "has no column naming the images of column 'image'" in _error(carded)

  partial = tmp_path / 'partial'
  _image(partial / 'train/a.jpg', 0)
  _image(partial / 'test/b.jpg', 1)
  (partial / 'train/metadata.csv').write_text('file_name,label\na.jpg,1\n')
  assert "Split 'test' has no metadata file" in _error(partial)

  unlabelled = tmp_path / 'unlabelled'
  for k in range(2):
    _image(unlabelled / f'train/{k}.jpg', k)
  (unlabelled / 'train/metadata.jsonl').write_text(
      '{"file_name": "0.jpg", "label": 1}\n{"file_name": "1.jpg", "label": null}\n'
  )
  assert "has 1 examples without a 'label'" in _error(unlabelled, eval_split='train')


def test_a_missing_image_is_skipped_as_an_unreadable_one(tmp_path):
  _image(tmp_path / 'train/a.jpg', 0)
  (tmp_path / 'train/metadata.csv').write_text('file_name,label\na.jpg,0\ngone.jpg,1\n')
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')
  records = source.examples('train')
  with pytest.raises(images.UnreadableImage, match='No such file'):
    source.load(records.read(1))
  assert source.describe(records.read(1)) == f'{tmp_path}/train/gone.jpg'


def test_an_image_folder_on_the_hub_downloads_its_images_and_metadata(tmp_path, monkeypatch):
  _image(tmp_path / 'snapshot/train/cat/a.jpg', 0)
  _image(tmp_path / 'snapshot/train/dog/b.jpg', 1)
  listing = ['README.md', '.gitattributes', 'train/cat/a.jpg', 'train/dog/b.jpg']
  asked = helpers.fake_hub(monkeypatch, listing, str(tmp_path / 'snapshot'))
  config = helpers.data_config('hf-hub:someone/pets', dataset='huggingface', eval_split='train')
  assert data.get_info(config).num_train == 2
  assert {'*.jpg', '*.JPG', '*.png', '*metadata.csv', 'README.md'} <= set(asked['allow_patterns'])
  zipped = {'cat/a.jpg': _encoded('a.jpg', 0), 'dog/b.jpg': _encoded('b.jpg', 1)}
  _zip(tmp_path / 'zips/data/train.zip', zipped)
  asked = helpers.fake_hub(monkeypatch, ['README.md', 'data/train.zip'], str(tmp_path / 'zips'))
  config = helpers.data_config('hf-hub:someone/zipped', dataset='huggingface', eval_split='train')
  assert data.get_info(config).num_train == 2
  assert '*.zip' in asked['allow_patterns']


def test_the_digits_as_an_image_folder_train_and_evaluate_as_the_digits(tmp_path):
  """The bundled digits as class folders of PNGs (greyscale), in the split's order: the same batches
  as `dataset='digits'`."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  for split, (pixels, labels) in digits.split_arrays().items():
    for k, (p, label) in enumerate(zip(pixels, labels)):
      path = tmp_path / split / f'{k:05d}.png'
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(helpers.encoded(p[..., 0], 'PNG'))
    rows = ''.join(f'{k:05d}.png,{label}\n' for k, label in enumerate(labels))
    (tmp_path / split / 'metadata.csv').write_text('file_name,label\n' + rows)
  helpers.assert_reads_as_the_digits(
      helpers.data_config(str(tmp_path), dataset='huggingface', data_shards=2)
  )


def test_the_digits_zipped_with_their_metadata_train_and_evaluate_as_the_digits(tmp_path):
  """Each split's PNGs and metadata.csv in one zip archive, read by worker processes too."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  for split, (pixels, labels) in digits.split_arrays().items():
    files = {f'{k:05d}.png': helpers.encoded(p[..., 0], 'PNG') for k, p in enumerate(pixels)}
    rows = ''.join(f'{k:05d}.png,{label}\n' for k, label in enumerate(labels))
    files['metadata.csv'] = ('file_name,label\n' + rows).encode()
    _zip(tmp_path / f'{split}.zip', files)
  helpers.assert_reads_as_the_digits(
      helpers.data_config(str(tmp_path), dataset='huggingface', data_shards=2), workers=True
  )


def test_a_checkout_of_git_lfs_pointers_is_one_line_naming_git_lfs_pull(tmp_path):
  for k, name in enumerate(['train/cat/a.jpg', 'train/dog/b.jpg', 'test/cat/c.jpg']):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(images.LFS_POINTER + b' https://git-lfs.github.com/spec/v1\n')
  assert "No image of split 'train' decodes" in _error(tmp_path)
  assert '(a git-lfs pointer, not the image)' in _error(tmp_path)
  assert 'git lfs pull' in _error(tmp_path)
