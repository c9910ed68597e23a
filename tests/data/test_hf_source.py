"""Hugging Face datasets on disk (`dataset='huggingface'`), written by the `datasets` library itself
and read back by it: every layout's splits, rows, images and labels are what `datasets.load_dataset`
(or `load_from_disk`) gives; the digits written as one train as the bundled digits, batch for
batch."""

import os
import zipfile
import pickle

import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax import data
from vit_jax.data import dataset_cache
from vit_jax.data import digits
from vit_jax.data import hf_parquet_copy
from vit_jax.data import hf_source
from vit_jax.data import images

datasets = pytest.importorskip('datasets')

NAMES = ['airplane', 'bird', 'cat']


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
  helpers.offline_datasets(monkeypatch, str(tmp_path_factory.mktemp('hf_cache')))


def _dataset(n: int, seed: int, label_column: str = 'label', label_feature=None):
  """n random images of several sizes, JPEG (with each EXIF orientation in turn, and none) and PNG
  in turn, labels cycling over NAMES."""
  rng = np.random.default_rng(seed)
  pictures = []
  for i in range(n):
    pixels = rng.integers(0, 256, (9 + i % 4, 7 + i % 3, 3), np.uint8)
    pictures.append(
        {'bytes': helpers.encoded(pixels, orientation=(i // 2) % 9 or None), 'path': None}
        if i % 2
        else Image.fromarray(pixels)
    )
  features = datasets.Features(
      {'img': datasets.Image(), label_column: label_feature or datasets.ClassLabel(names=NAMES)}
  )
  labels = [(i * 7 + seed) % 3 for i in range(n)]
  if isinstance(label_feature, datasets.Value) and label_feature.dtype == 'string':
    labels = [NAMES[label] for label in labels]
  return datasets.Dataset.from_dict({'img': pictures, label_column: labels}, features=features)


def _parquet(ds, path, *, metadata: bool = True) -> None:
  """`ds` as a Parquet file, with datasets' features in its schema or (as some tools write them)
  without."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  os.makedirs(os.path.dirname(path), exist_ok=True)
  if metadata:
    ds.to_parquet(str(path))
  else:
    pq.write_table(ds.flatten_indices().data.table.replace_schema_metadata(None), str(path))


def _hub(root):
  """push_to_hub's layout: sharded data/<split>-NNNNN-of-NNNNN.parquet and its README; the Parquet
  files without features, so that they are the README's."""
  train, test = _dataset(10, 0), _dataset(5, 1)
  _parquet(train.select(range(6)), root / 'data/train-00000-of-00002.parquet', metadata=False)
  _parquet(train.select(range(6, 10)), root / 'data/train-00001-of-00002.parquet', metadata=False)
  _parquet(test, root / 'data/test-00000-of-00001.parquet', metadata=False)
  splits = [{'split': s, 'path': f'data/{s}-*'} for s in ('train', 'test')]
  helpers.hf_dataset_card(root, train.features, {'default': {'data_files': splits}})


def _configs(root):
  """Two configs in the README, the second the default."""
  _parquet(_dataset(4, 2), root / 'small/train-00000-of-00001.parquet')
  _parquet(_dataset(9, 3), root / 'full/train-00000-of-00001.parquet')
  _parquet(_dataset(3, 4), root / 'full/validation-00000-of-00001.parquet')
  helpers.hf_dataset_card(
      root,
      _dataset(1, 0).features,
      {
          'small': {'data_files': [{'split': 'train', 'path': 'small/train-*'}]},
          'full': {
              'data_files': [
                  {'split': 'train', 'path': 'full/train-*'},
                  {'split': 'validation', 'path': 'full/validation-*'},
              ],
              'default': True,
          },
      },
  )


def _split_folders(root):
  """No README: split words as folder names (`valid` is 'validation')."""
  _parquet(_dataset(6, 5), root / 'train/0000.parquet')
  _parquet(_dataset(5, 6), root / 'train/0001.parquet')
  _parquet(_dataset(3, 7), root / 'valid/0000.parquet')


def _file_words(root):
  """No README: split words in file names between separators."""
  _parquet(_dataset(7, 8), root / 'cifar_training.parquet')
  _parquet(_dataset(4, 9), root / 'cifar-test-part1.parquet')


def _converted_refs(root):
  """The hub's refs/convert/parquet layout: <config>/<split>/NNNN.parquet."""
  _parquet(_dataset(8, 10), root / 'default/train/0000.parquet')
  _parquet(_dataset(2, 11), root / 'default/test/0000.parquet')


def _one_file(root):
  """One file named for no split: all train."""
  _parquet(_dataset(5, 12), root / 'pictures.parquet')


def _arrow_files(root):
  """A repository of Arrow files (datasets' stream format, its features in the schema)."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  for split, ds in (('train', _dataset(7, 16)), ('test', _dataset(3, 17))):
    table = ds.flatten_indices().data.table
    (root / 'data').mkdir(exist_ok=True)
    with pa.OSFile(str(root / f'data/{split}-00000-of-00001.arrow'), 'wb') as sink:
      with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def _saved(root):
  datasets.DatasetDict({'train': _dataset(8, 13), 'test': _dataset(3, 14)}).save_to_disk(str(root))


def _saved_one(root):
  _dataset(6, 15).save_to_disk(str(root))


LAYOUTS = {
    f.__name__.strip('_'): f
    for f in (
        _hub,
        _configs,
        _split_folders,
        _file_words,
        _converted_refs,
        _one_file,
        _arrow_files,
        _saved,
    )
}


def _rows(source, split: str) -> list[tuple[np.ndarray, int]]:
  return _loaded(source, source.examples(split))


def _loaded(source, records) -> list[tuple[np.ndarray, int]]:
  rows = []
  for k in range(records.num_records):
    example = source.load(records.read(k))
    rows.append((images.rgb(images.pixels(example['image'])), int(example['label'])))
  return rows


def _assert_rows(ours, theirs) -> None:
  """`theirs`: a datasets.Dataset, images decoded by datasets (PIL), labels ClassLabel indices."""
  assert len(ours) == len(theirs)
  for k, ((image, label), row) in enumerate(zip(ours, theirs)):
    np.testing.assert_array_equal(image, np.asarray(row['img'].convert('RGB')), err_msg=f'row {k}')
    assert label == row['label'], k


@pytest.mark.parametrize('layout', list(LAYOUTS))
def test_every_layout_reads_as_datasets_loads_it(tmp_path, layout):
  root = tmp_path / layout
  root.mkdir()
  LAYOUTS[layout](root)
  theirs = (
      datasets.load_from_disk(str(root)) if layout == 'saved' else datasets.load_dataset(str(root))
  )
  source = hf_source.HuggingFaceSource(str(root), 'train', 'label')
  assert source.class_names == tuple(theirs['train'].features['label'].names) == tuple(NAMES)
  assert list(source._rows.sizes) == list(theirs)  # pylint: disable=protected-access
  for split in theirs:
    _assert_rows(_rows(source, split), theirs[split])


def test_a_saved_split_is_train_and_slices_read_as_datasets_slices(tmp_path):
  _saved_one(tmp_path)
  theirs = datasets.load_from_disk(str(tmp_path))
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')
  _assert_rows(_rows(source, 'train[2:5]'), theirs.select(range(2, 5)))
  _assert_rows(_rows(source, 'train[:50%]+train[-1:]'), theirs.select([0, 1, 2, 5]))
  np.testing.assert_array_equal(source.split_labels('train[2:5]'), theirs['label'][2:5])


@pytest.mark.parametrize('split', ['train[:33%]', 'train[33%:]+test[-2:]', 'test[1:4]'])
def test_slices_are_the_rows_datasets_slices_them_to(tmp_path, split):
  _hub(tmp_path)
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')
  _assert_rows(_rows(source, split), datasets.load_dataset(str(tmp_path), split=split))


@pytest.mark.parametrize(
    'feature, names',
    [
        (datasets.Value('int64'), ('0', '1', '2')),
        (datasets.Value('string'), tuple(NAMES)),
    ],
    ids=['integers', 'strings'],
)
def test_labels_without_a_class_label_are_numbers_or_the_train_strings(tmp_path, feature, names):
  _parquet(_dataset(8, 0, 'kind', feature), tmp_path / 'data/train-00000-of-00001.parquet')
  _parquet(_dataset(4, 1, 'kind', feature), tmp_path / 'data/test-00000-of-00001.parquet')
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'kind')
  assert source.class_names == names
  theirs = datasets.load_dataset(str(tmp_path))['test']['kind']
  expected = [names.index(str(label)) for label in theirs]
  np.testing.assert_array_equal(source.split_labels('test'), expected)


@pytest.mark.parametrize('encoding', ['dictionary', 'string_view'])
def test_string_labels_stored_otherwise_are_the_strings_datasets_reads(tmp_path, encoding):
  """A label column of pandas' Categorical (dictionary-encoded strings) or Arrow's string_view, which
  `datasets` reads as strings."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  for split, (n, seed) in {'train': (8, 0), 'test': (4, 1)}.items():
    table = _dataset(n, seed, 'kind', datasets.Value('string')).flatten_indices().data.table
    kind = table.column('kind')
    stored = kind.dictionary_encode() if encoding == 'dictionary' else kind.cast(pa.string_view())
    table = table.set_column(table.schema.get_field_index('kind'), 'kind', stored)
    (tmp_path / 'data').mkdir(exist_ok=True)
    pq.write_table(table.replace_schema_metadata(None), tmp_path / f'data/{split}.parquet')
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'kind')
  assert source.class_names == tuple(NAMES)
  theirs = datasets.load_dataset(str(tmp_path))['test']['kind']
  np.testing.assert_array_equal(source.split_labels('test'), [NAMES.index(x) for x in theirs])


def test_the_digits_as_a_hugging_face_dataset_train_and_evaluate_as_the_digits(tmp_path):
  """The bundled digits written by datasets (greyscale PNGs, in the split's order): the same train
  and eval batches as `dataset='digits'`, and the same labels for few-shot."""
  features = datasets.Features(
      {'image': datasets.Image(), 'label': datasets.ClassLabel(names=list(digits.CLASS_NAMES))}
  )
  for split, (pixels, labels) in digits.split_arrays().items():
    datasets.Dataset.from_dict(
        {'image': [Image.fromarray(p[..., 0]) for p in pixels], 'label': labels.tolist()},
        features=features,
    ).to_parquet(str(tmp_path / 'data' / f'{split}-00000-of-00001.parquet'))
  helpers.assert_reads_as_the_digits(
      helpers.data_config(str(tmp_path), dataset='huggingface', data_shards=2)
  )


def test_a_split_is_converted_once_and_again_when_its_file_changes(tmp_path, monkeypatch):
  cache = tmp_path / 'cache'
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  root = tmp_path / 'repo'
  _parquet(_dataset(5, 0), root / 'train.parquet')
  rows = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'label'), 'train')
  (converted,) = list(cache.glob('*.arrow'))
  written = converted.stat().st_mtime_ns
  assert (
      _rows(hf_source.HuggingFaceSource(str(root), 'train', 'label'), 'train')[1][1] == rows[1][1]
  )
  assert [p.name for p in cache.glob('*.arrow')] == [converted.name]
  assert converted.stat().st_mtime_ns == written
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  # The image column alone: labels are read from the Parquet files' own column.
  assert pa.ipc.open_stream(pa.memory_map(str(converted))).schema.names == ['img']
  _parquet(_dataset(6, 1), root / 'train.parquet')
  changed = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'label'), 'train')
  _assert_rows(changed, datasets.load_dataset(str(root))['train'])
  assert len(list(cache.glob('*.arrow'))) == 2


def _error(root, **overrides) -> str:
  return helpers.data_error(str(root), dataset='huggingface', **overrides)


def test_bad_input_is_one_line_naming_the_fix(tmp_path):
  _hub(tmp_path / 'hub')
  assert (
      "set --config.label_feature (or the evaluator's label_feature) to one of ['label']"
      in _error(tmp_path / 'hub', label_feature='fine_label')
  )
  assert "set --config.eval_split to one of ['train', 'test']" in _error(
      tmp_path / 'hub', eval_split='validation'
  )
  assert 'hf download --repo-type dataset' in _error(tmp_path / 'missing')
  (tmp_path / 'empty').mkdir()
  assert 'holds no Parquet, Arrow, WebDataset (.tar) or image files' in _error(tmp_path / 'empty')

  lfs = tmp_path / 'lfs'
  (lfs / 'data').mkdir(parents=True)
  (lfs / 'data/train-00000-of-00001.parquet').write_text(
      'version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n'
  )
  assert 'a git-lfs pointer' in _error(lfs) and 'git lfs pull' in _error(lfs)

  _saved(tmp_path / 'saved')
  (tmp_path / 'saved/test/state.json').unlink()
  assert 'is not a whole save_to_disk directory (FileNotFoundError' in _error(tmp_path / 'saved')

  _configs(tmp_path / 'configs')
  readme = tmp_path / 'configs/README.md'
  readme.write_text(readme.read_text().replace('  default: true\n', ''))
  assert 'mark the one to read with `default: true`' in _error(tmp_path / 'configs')

  unlabelled = tmp_path / 'unlabelled'
  _parquet(_dataset(4, 0), unlabelled / 'data/train-00000-of-00001.parquet')
  test = _dataset(3, 1).cast_column('label', datasets.Value('int64')).map(lambda _: {'label': -1})
  _parquet(
      test.cast_column('label', datasets.ClassLabel(names=NAMES)),
      unlabelled / 'data/test-00000-of-00001.parquet',
  )
  assert 'use a labelled split, or drop those rows' in _error(unlabelled)

  strings = tmp_path / 'strings'
  _parquet(_dataset(3, 0, 'label', datasets.Value('string')), strings / 'train.parquet')
  other = _dataset(3, 1, 'label', datasets.Value('string')).map(lambda _: {'label': 'dog'})
  _parquet(other, strings / 'test.parquet')
  assert "labels that no train example has: ['dog']" in _error(strings)


def test_a_row_without_image_bytes_reads_the_file_it_names(tmp_path):
  """datasets keeps an image it did not embed as the path of its file."""
  pixels = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
  Image.fromarray(pixels).save(tmp_path / 'a.png')
  features = datasets.Features({'img': datasets.Image(), 'label': datasets.ClassLabel(names=NAMES)})
  table = datasets.Dataset.from_dict(
      {'img': [{'bytes': None, 'path': str(tmp_path / 'a.png')}], 'label': [1]}, features=features
  )
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  os.makedirs(tmp_path / 'repo')
  pq.write_table(table.data.table, str(tmp_path / 'repo/train.parquet'))
  ((image, label),) = _rows(
      hf_source.HuggingFaceSource(str(tmp_path / 'repo'), 'train', 'label'), 'train'
  )
  np.testing.assert_array_equal(image, pixels)
  assert label == 1


def test_a_copy_that_would_not_fit_and_missing_labels_are_one_line_errors(tmp_path, monkeypatch):
  _parquet(_dataset(4, 0), tmp_path / 'repo/train.parquet')
  usage = dataset_cache.shutil.disk_usage(tmp_path)
  monkeypatch.setattr(dataset_cache.shutil, 'disk_usage', lambda _: usage._replace(free=100))
  config = helpers.data_config(str(tmp_path / 'repo'), dataset='huggingface', eval_split='train')
  data.get_info(config)  # Reads the labels; copies nothing.
  with pytest.raises(ValueError) as raised:  # A run's set-up makes what its streams read.
    data.prepare(config, 0, 1)
  assert 'GB free: set VIT_JAX_DATASETS_CACHE to a folder on a disk with room' in str(raised.value)
  assert '\n' not in str(raised.value)
  monkeypatch.undo()
  nulls = _dataset(4, 0, 'label', datasets.Value('int64')).map(
      lambda row, k: {'label': None if k == 2 else row['label']}, with_indices=True
  )
  _parquet(nulls, tmp_path / 'nulls/train.parquet')
  assert "has 1 examples without a 'label': use a labelled split" in _error(
      tmp_path / 'nulls', eval_split='train'
  )


def test_a_dataset_on_the_hub_downloads_its_parquet_files_and_readme(tmp_path, monkeypatch):
  """'hf-hub:<repo>@<revision>': the snapshot huggingface_hub downloads (here a local copy of the
  hub's files) is read as the directory it is; a repository without Parquet files is one line."""
  from vit_jax.runtime import hf_hub  # pylint: disable=g-import-not-at-top

  snapshot = tmp_path / 'snapshot'
  _hub(snapshot)
  listing = ['README.md', '.gitattributes', 'data/train-00000-of-00002.parquet']
  asked = helpers.fake_hub(monkeypatch, listing, str(snapshot))
  config = helpers.data_config('hf-hub:org/pictures@v1', dataset='huggingface')
  info = data.get_info(config)
  assert asked == {
      'repo': 'org/pictures',
      'revision': 'v1',
      'repo_type': 'dataset',
      'allow_patterns': ['*.parquet', '*.geoparquet', '*.gpq', 'README.md'],
  }
  assert (info.num_train, info.num_eval, info.class_names) == (10, 5, tuple(NAMES))
  from vit_jax.train import setup  # pylint: disable=g-import-not-at-top

  setup.absolute_paths(config)
  assert config.data_dir == 'hf-hub:org/pictures@v1'  # Not a path under the working directory.

  listing[:] = ['README.md', 'train.csv']
  hf_hub.snapshot.cache_clear()
  assert 'Hugging Face dataset (its files are csv)' in _error('hf-hub:org/tables')
  hf_hub.snapshot.cache_clear()


def test_a_copy_another_process_is_making_is_waited_for_not_made_again(tmp_path, monkeypatch):
  import threading  # pylint: disable=g-import-not-at-top

  import filelock  # pylint: disable=g-import-not-at-top

  cache = tmp_path / 'cache'
  cache.mkdir()
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  _parquet(_dataset(3, 0), tmp_path / 'train.parquet')
  files, columns = (str(tmp_path / 'train.parquet'),), ['img', 'label']
  got = []
  waiting = threading.Thread(
      target=lambda: got.append(hf_parquet_copy.copied(files, columns, 'a split'))
  )
  lock = hf_parquet_copy.cache_path(files, columns) + '.lock'
  with filelock.FileLock(lock):  # Another process is copying...
    waiting.start()
    waiting.join(timeout=1)
    assert waiting.is_alive() and not list(cache.glob('*.arrow'))
    hf_parquet_copy.copy(
        files, columns, hf_parquet_copy.cache_path(files, columns)
    )  # ...and has copied.
  copied = os.stat(hf_parquet_copy.cache_path(files, columns))
  waiting.join(timeout=30)
  assert got == [hf_parquet_copy.cache_path(files, columns)]
  now = os.stat(got[0])
  assert (now.st_ino, now.st_mtime_ns) == (copied.st_ino, copied.st_mtime_ns)


def test_worker_processes_read_the_batches_threads_read(tmp_path):
  """grain's workers get the source pickled, without its memory maps, and open the copy again."""
  _hub(tmp_path)
  config = helpers.data_config(str(tmp_path), dataset='huggingface', image_size=12)
  threads = helpers.take(data.train_iterator(config, local_batch_size=4), 4)
  config.data_workers = 2
  workers = data.train_iterator(config, local_batch_size=4)
  try:
    helpers.assert_same_batches(helpers.take(workers, 4), threads)
  finally:
    workers.close()


def test_split_files_format_and_order_are_datasets_own_on_random_trees(tmp_path):
  """200 random trees of empty files of several formats, their names made of split words, separators
  and other words: each split's files, in order, and their format are those datasets' pattern
  resolution and format inference give (each file once: datasets lists a file twice where two of a
  split's patterns match it); where datasets reads another format, or none, ours is an error."""
  from datasets import data_files  # pylint: disable=g-import-not-at-top
  from datasets import load  # pylint: disable=g-import-not-at-top

  from vit_jax.data import hf_data_files  # pylint: disable=g-import-not-at-top
  from vit_jax.data import zip_members  # pylint: disable=g-import-not-at-top

  words = ['train', 'training', 'validation', 'valid', 'val', 'dev', 'test', 'testing', 'eval']
  words += ['evaluation', 'data', 'default', 'img', 'partial', 'trainer', 'contest', 'Train']
  words += ['__x', '.hidden', 'README']
  separators = ['-', '_', '.', ' ', '', '0']
  extensions = ['.parquet'] * 4 + ['.tar'] * 3 + ['.arrow', '.jpg', '.csv', '.json', '.tar.gz']
  extensions += ['.JPG', '.png', '.zip']
  inside_zips = ['.png', '.jpg', '.csv', '.txt', '.parquet']
  rng = np.random.default_rng(0)
  pick = lambda options: options[rng.integers(len(options))]
  for trial in range(200):
    root = tmp_path / str(trial)
    extension = pick(extensions)
    for _ in range(rng.integers(1, 6)):
      if rng.random() < 0.8:  # Mostly one format, as datasets are.
        extension = pick(extensions)
      if rng.random() < 0.2:  # push_to_hub's shard names.
        name = f'data/{pick(["train", "test", "extra"])}-{rng.integers(3):05d}-of-00003{extension}'
      else:
        folders = [
            pick(words) + (pick(separators) + pick(words) if rng.random() < 0.3 else '')
            for _ in range(rng.integers(3))
        ]
        name = '/'.join([*folders, f'{pick(words)}{pick(separators)}{pick(words + ["0"])}'])
        name += '.md' if name.endswith('README') else extension
        if rng.random() < 0.1:  # An image folder's metadata, or a file whose name ends as one's.
          name = os.path.join(os.path.dirname(name), pick(['metadata.csv', 'my_metadata.jsonl']))
      (root / name).parent.mkdir(parents=True, exist_ok=True)
      if name.endswith('.zip'):  # datasets infers the format from the files inside.
        with zipfile.ZipFile(root / name, 'w') as archive:
          for k in range(rng.integers(1, 4)):
            archive.writestr(f'{pick(words[:3])}/{k}{pick(inside_zips)}', b'')
      else:
        (root / name).touch()
    try:
      resolved = data_files.DataFilesDict.from_patterns(
          data_files.get_data_patterns(str(root)),
          str(root),
          allowed_extensions=load._ALL_ALLOWED_EXTENSIONS,  # pylint: disable=protected-access
      )
      resolved = {s: found for s, found in resolved.items() if found}
      module, _ = load.infer_module_for_data_files(data_files.DataFilesDict(resolved))
    except (ValueError, FileNotFoundError):  # No data files, or of several formats.
      module = None
    listing = sorted(p.relative_to(root).as_posix() for p in root.rglob('*') if p.is_file())
    splits = hf_data_files.split_by_paths(hf_data_files.data_files(str(root)))
    archived = lambda zips: zip_members.most_common_extension([str(root / z) for z in zips])
    if module not in hf_data_files.FORMATS:
      with pytest.raises(ValueError, match='Parquet, Arrow, WebDataset|different'):
        hf_data_files.format_of(str(root), splits, archived)
      continue
    assert hf_data_files.format_of(str(root), splits, archived) == module, listing
    extensions_read = load._MODULE_TO_EXTENSIONS[module]  # pylint: disable=protected-access
    names_read = load._MODULE_TO_METADATA_FILE_NAMES[module]  # pylint: disable=protected-access
    theirs = {
        str(split): list(
            dict.fromkeys(
                os.path.relpath(f, root)
                for f in found.filter(extensions=extensions_read, file_names=names_read)
            )
        )
        for split, found in resolved.items()
    }
    ours = {split: hf_data_files.of_format(found, module) for split, found in splits.items()}
    ours = [(s, f) for s, f in ours.items() if f]
    assert ours == [(s, f) for s, f in theirs.items() if f], listing  # In order too.


def test_a_worker_process_opens_the_copy_without_a_look_at_the_parquet_files(tmp_path, monkeypatch):
  """A worker gets the source pickled: it finds the copy the run made by its name, with no stat of
  each Parquet file (on cloud storage, a request each)."""
  _hub(tmp_path)
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')
  records = source.examples('train', 1, 2)
  records.prepare()  # The pipeline's process makes the copy.
  worker, worker_records = pickle.loads(pickle.dumps((source, records)))
  monkeypatch.setattr(dataset_cache, 'size_and_time', lambda path: pytest.fail(f'{path} looked at'))
  for k in range(records.num_records):
    assert worker.load(worker_records.read(k))['image'] == source.load(records.read(k))['image']


def _nested(n: int, seed: int, species) -> datasets.Dataset:
  """`_dataset`'s images, their labels a field of a struct column, as a WebDataset's json reads in
  the hub's Parquet conversion of it: meta = {'species': ..., 'note': ...}."""
  flat = _dataset(n, seed)
  labels = flat['label']
  if isinstance(species, datasets.Value) and species.dtype == 'string':
    labels = [NAMES[label] for label in labels]
  features = datasets.Features(
      {'img': datasets.Image(), 'meta': {'species': species, 'note': datasets.Value('string')}}
  )
  meta = [{'species': label, 'note': f'row {i}'} for i, label in enumerate(labels)]
  return datasets.Dataset.from_dict(
      {'img': flat.cast_column('img', datasets.Image(decode=False))['img'], 'meta': meta},
      features=features,
  )


@pytest.mark.parametrize(
    'species, names',
    [
        (datasets.ClassLabel(names=NAMES), tuple(NAMES)),
        (datasets.Value('int64'), ('0', '1', '2')),
        (datasets.Value('string'), tuple(NAMES)),
    ],
    ids=['class label', 'integers', 'strings'],
)
@pytest.mark.parametrize('layout', ['parquet', 'readme', 'saved'])
def test_a_label_in_a_struct_column_is_its_field(tmp_path, species, names, layout):
  train, test = _nested(8, 0, species), _nested(4, 1, species)
  if layout != 'saved':  # The features in the files, or (as push_to_hub writes) in the README.
    in_files = layout == 'parquet'
    _parquet(train, tmp_path / 'data/train-00000-of-00001.parquet', metadata=in_files)
    _parquet(test, tmp_path / 'data/test-00000-of-00001.parquet', metadata=in_files)
    if not in_files:
      splits = [{'split': s, 'path': f'data/{s}-*'} for s in ('train', 'test')]
      helpers.hf_dataset_card(tmp_path, train.features, {'default': {'data_files': splits}})
    theirs = datasets.load_dataset(str(tmp_path))
  else:
    datasets.DatasetDict({'train': train, 'test': test}).save_to_disk(str(tmp_path))
    theirs = datasets.load_from_disk(str(tmp_path))
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'meta.species')
  assert source.class_names == names
  for split in ('train', 'test'):
    raw = [row['meta']['species'] for row in theirs[split]]
    class_label = isinstance(species, datasets.ClassLabel)
    expected = raw if class_label else [names.index(str(label)) for label in raw]
    np.testing.assert_array_equal(source.split_labels(split), expected)
    records = source.examples(split)
    example = source.load(records.read(2))
    np.testing.assert_array_equal(
        images.rgb(images.pixels(example['image'])),
        np.asarray(theirs[split][2]['img'].convert('RGB')),
    )
    assert example['label'] == expected[2]
  with pytest.raises(ValueError, match=r"no label column 'meta.kind' .* \['meta.species'"):
    hf_source.HuggingFaceSource(str(tmp_path), 'train', 'meta.kind')


def test_a_process_copies_the_rows_it_reads_from_the_row_groups_that_hold_them(
    tmp_path, monkeypatch
):
  """Each process's data shard (strided) and a slice copy their rows alone, read from the Parquet
  row groups that hold them; the labels come from the label column without a copy. The images and
  labels are the rows datasets gives."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  cache = tmp_path / 'cache'
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  train = _dataset(23, 3)
  table = train.flatten_indices().data.table
  (tmp_path / 'repo/data').mkdir(parents=True)
  pq.write_table(
      table.slice(0, 14), str(tmp_path / 'repo/data/train-00000-of-00002.parquet'), row_group_size=3
  )
  pq.write_table(
      table.slice(14), str(tmp_path / 'repo/data/train-00001-of-00002.parquet'), row_group_size=4
  )
  assert (
      pq.ParquetFile(str(tmp_path / 'repo/data/train-00000-of-00002.parquet')).num_row_groups == 5
  )
  source = hf_source.HuggingFaceSource(str(tmp_path / 'repo'), 'train', 'label')
  assert source.class_names == tuple(NAMES) and not list(cache.glob('*.arrow'))
  read_groups = []
  iter_batches = pq.ParquetFile.iter_batches
  monkeypatch.setattr(
      pq.ParquetFile,
      'iter_batches',
      lambda self, *a, **k: read_groups.append(k.get('row_groups')) or iter_batches(self, *a, **k),
  )

  shards = [source.examples('train', shard, 3) for shard in range(3)]
  for shard, records in enumerate(shards):
    records.prepare()
    _assert_rows(_loaded(source, records), train.select(range(shard, 23, 3)))
  assert helpers.arrow_rows(cache) == [7, 8, 8]
  sliced = source.examples('train[2:5]')
  sliced.prepare()
  _assert_rows(_loaded(source, sliced), train.select(range(2, 5)))
  assert helpers.arrow_rows(cache) == [3, 7, 8, 8]
  # Rows 2-4: the first file's first two groups; not the second file.
  assert read_groups[-1:] == [[0, 1]]
  overlapping = source.examples('train[15:19]+train[:2]+train[16:21]')  # Rows 0-1, 15-20: once.
  overlapping.prepare()
  expected = train.select([15, 16, 17, 18, 0, 1, 16, 17, 18, 19, 20])
  _assert_rows(_loaded(source, overlapping), expected)
  assert helpers.arrow_rows(cache) == [3, 7, 8, 8, 8]

  whole = source.examples('train')
  whole.prepare()
  assert helpers.arrow_rows(cache) == [3, 7, 8, 8, 8, 23]
  for p in cache.glob('*-*.arrow'):  # The whole split's copy, once made, serves every shard.
    p.unlink()
  again = source.examples('train', 1, 3)
  again.prepare()
  _assert_rows(_loaded(source, again), train.select(range(1, 23, 3)))
  assert helpers.arrow_rows(cache) == [23]


def test_a_multi_host_run_copies_each_host_its_shard_and_trains_on_what_one_host_would(
    tmp_path, monkeypatch
):
  """Two processes of one run (data_shards=2 each way): each host's prepare copies its own shard
  (of the eval split alone in a run that only evaluates); their train batches together are the
  batches one process reads from the same two shards."""
  cache = tmp_path / 'cache'
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  _hub(tmp_path / 'repo')
  config = helpers.data_config(
      str(tmp_path / 'repo'), dataset='huggingface', image_size=12, data_shards=2, eval_split='test'
  )
  data.prepare(config, 0, 2, train=False)
  assert helpers.arrow_rows(cache) == [3]  # Host 0's shard of test (5 rows).
  hosts = []
  for process in range(2):
    data.prepare(config, process, 2)
    hosts.append(
        helpers.take(
            data.train_iterator(config, local_batch_size=2, process_index=process, process_count=2),
            3,
        )
    )
  assert helpers.arrow_rows(cache) == [2, 3, 5, 5]  # Each host's shard of test (5) and train (10).
  one = helpers.take(data.train_iterator(config, local_batch_size=4), 3)
  for k, batch in enumerate(one):
    for name in batch:
      np.testing.assert_array_equal(
          batch[name], np.concatenate([hosts[0][k][name], hosts[1][k][name]])
      )


def test_a_process_of_several_data_shards_copies_their_rows_once(tmp_path, monkeypatch):
  """Two processes of four data shards: each process's prepare copies the rows of its two shards in
  one file, which its train streams read; their batches are those of one process of the four."""
  cache = tmp_path / 'cache'
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  _hub(tmp_path / 'repo')
  config = helpers.data_config(
      str(tmp_path / 'repo'), dataset='huggingface', image_size=12, data_shards=4, eval_split='test'
  )
  hosts = []
  # Each host's shard of test (5 rows) and its two shards of train (10 rows: 6 and 4), in one copy.
  for process, copies in enumerate([[3, 6], [2, 3, 4, 6]]):
    data.prepare(config, process, 2)
    assert helpers.arrow_rows(cache) == copies
    hosts.append(
        helpers.take(
            data.train_iterator(config, local_batch_size=4, process_index=process, process_count=2),
            3,
        )
    )
    assert helpers.arrow_rows(cache) == copies  # The streams read that copy.
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'one_process'))
  one = helpers.take(data.train_iterator(config, local_batch_size=8), 3)
  for k, batch in enumerate(one):
    for name in batch:
      np.testing.assert_array_equal(
          batch[name], np.concatenate([hosts[0][k][name], hosts[1][k][name]])
      )


def test_files_on_cloud_storage_are_looked_at_16_at_a_time(monkeypatch):
  """A Parquet split's footers and label columns, a file's size: a request or a few each, for a
  thousand files at every start."""
  import threading  # pylint: disable=g-import-not-at-top

  monkeypatch.setattr(dataset_cache.paths, 'is_url', lambda path: True)
  sixteen = threading.Barrier(16, timeout=10)  # Broken, an error, unless 16 wait at once.
  files = [f'gs://bucket/train-{k:05d}.parquet' for k in range(32)]
  assert dataset_cache.of_each(files, lambda f: sixteen.wait() is not None and f) == files
