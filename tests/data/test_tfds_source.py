"""The tensorflow_datasets source (vit_jax/data/tfds_source.py) on a tiny dataset prepared here:
its splits and slices, shards, labels and label sets, errors, pickling, reading without TensorFlow,
and a dataset prepared as TFRecord: the one-line error, then its conversion to ArrayRecord."""

import io
import pickle
import shutil
import subprocess
import sys

from etils import epath
import numpy as np
import pytest
import tensorflow_datasets as tfds

import helpers
import tfds_fixtures
from vit_jax.data import images
from vit_jax.data import tfds_source

CLASSES = ['cat', 'dog', 'fox']
SIZES = {'train': 10, 'validation': 6}


def tiny_example(split: str, key: int) -> dict:
  """Example `key` of `split`: an image of its own size and pixels, a class, a coarser class and a
  set of classes (none for some)."""
  rng = np.random.RandomState([len(split), key])
  return {
      'image': rng.randint(256, size=(3 + key % 4, 5 + key % 3, 3), dtype=np.uint8),
      'label': key % 3,
      'coarse': key % 2,
      'label_set': [c for c in range(3) if (key >> c) & 1],
      'name': f'{split}/{key}',
  }


class Tiny(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Prepared under its name in a data_dir, where tfds.builder finds it as a real dataset."""

  VERSION = tfds.core.Version('1.0.0')
  pkg_dir_path = epath.Path(__file__).parent  # tfds looks for metadata files beside the builder.

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(None, None, 3)),
                'label': tfds.features.ClassLabel(names=CLASSES),
                'coarse': tfds.features.ClassLabel(names=['odd', 'even']),
                'label_set': tfds.features.Sequence(tfds.features.ClassLabel(names=CLASSES)),
                'name': tfds.features.Text(),
            }
        )
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {split: self._generate_examples(split) for split in SIZES}

  def _generate_examples(self, split):
    for key in range(SIZES[split]):
      example = tiny_example(split, key)
      yield key, {**example, 'image': tfds_fixtures.png(example['image'])}


def prepare(data_dir: str, file_format: str) -> str:
  Tiny(data_dir=data_dir, file_format=file_format).download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  return data_dir


@pytest.fixture(scope='module')
def array_record_dir(tmp_path_factory):
  return prepare(str(tmp_path_factory.mktemp('array_record')), 'array_record')


@pytest.fixture(scope='module')
def tfrecord_dir(tmp_path_factory):
  helpers.tensorflow()  # tfds writes TFRecord files with it.
  return prepare(str(tmp_path_factory.mktemp('tfrecord')), 'tfrecord')


def source(data_dir: str, label_feature: str = 'label') -> tfds_source.TfdsSource:
  return tfds_source.TfdsSource(tfds_source.prepared_builder('tiny', data_dir), label_feature)


def read_all(src: tfds_source.TfdsSource, split: str, shard: int = 0, num_shards: int = 1) -> list:
  records = src.examples(split, shard, num_shards)
  return [records.read(k) for k in range(records.num_records)]


def name_of(src: tfds_source.TfdsSource, record: tfds_source.Example) -> str:
  return src._deserialize(record)['name'].decode()  # pylint: disable=protected-access


def expected(names: list[str]) -> list[dict]:
  return [tiny_example(split, int(key)) for split, key in (n.split('/') for n in names)]


def test_splits_slices_and_sums_hold_the_examples_tfds_counts(array_record_dir):
  src = source(array_record_dir)
  info = tfds_source.prepared_builder('tiny', array_record_dir).info
  train = [name_of(src, r) for r in read_all(src, 'train')]
  validation = [name_of(src, r) for r in read_all(src, 'validation')]
  assert sorted(train) == sorted(f'train/{k}' for k in range(10))  # tfds shuffled them.
  cases = {
      'train[:90%]': train[:9],
      'train[90%:]': train[9:],
      'train[2:5]': train[2:5],
      'train[:4]+validation[:2]': train[:4] + validation[:2],
  }
  for split, names in cases.items():
    assert src.examples(split).num_records == info.splits[split].num_examples == len(names), split
    assert [name_of(src, r) for r in read_all(src, split)] == names, split


@pytest.mark.parametrize('num_shards', [1, 3, 4])
def test_shards_are_strided_disjoint_and_cover_the_split(array_record_dir, num_shards):
  src = source(array_record_dir)
  split = 'train[:7]+validation[:4]'
  whole = read_all(src, split)
  shards = [read_all(src, split, s, num_shards) for s in range(num_shards)]
  for s, shard in enumerate(shards):  # Record k of shard s is example s + k * num_shards.
    assert [(r.index, r.serialized) for r in shard] == [
        (i, whole[i].serialized) for i in range(s, len(whole), num_shards)
    ]
  assert sorted(len(shard) for shard in shards)[-1] - min(len(shard) for shard in shards) <= 1


def test_load_decodes_the_image_and_its_label(array_record_dir):
  src = source(array_record_dir)
  assert (src.class_names, src.class_label_features, src.multi_label) == (
      tuple(CLASSES),
      ('coarse', 'label'),
      False,
  )
  records = read_all(src, 'validation')
  for record, example in zip(records, expected([name_of(src, r) for r in records])):
    loaded = src.load(record)
    assert sorted(loaded) == ['image', 'label']
    image = images.pixels(loaded['image'])
    assert image.dtype == np.uint8 and loaded['label'].dtype == np.int32
    np.testing.assert_array_equal(image, example['image'])  # PNG: lossless.
    assert loaded['label'] == example['label']
  coarse = source(array_record_dir, 'coarse')
  assert coarse.class_names == ('odd', 'even')
  assert [coarse.load(r)['label'] for r in records] == [
      e['coarse'] for e in expected([name_of(src, r) for r in records])
  ]


def test_a_label_set_is_multi_hot(array_record_dir):
  src = source(array_record_dir, 'label_set')
  assert src.multi_label and src.class_names == tuple(CLASSES)
  records = read_all(src, 'train')
  for record, example in zip(records, expected([name_of(src, r) for r in records])):
    labels = src.load(record)['labels']
    assert labels.dtype == bool and labels.shape == (3,)
    assert np.flatnonzero(labels).tolist() == example['label_set']
  assert any(not src.load(r)['labels'].any() for r in records)  # An image without labels.


def test_describe_names_the_example_split_and_dataset(array_record_dir):
  src = source(array_record_dir)
  record = src.examples('train[:4]+validation[:2]', 1, 2).read(2)
  assert src.describe(record) == 'example 5 of split train[:4]+validation[:2] of tiny'


def test_a_source_and_its_records_pickle_without_open_files(array_record_dir):
  src = source(array_record_dir)
  records = src.examples('train', 1, 2)
  first = records.read(0)  # Opens the split's files.
  copy = pickle.loads(pickle.dumps(src))
  assert copy._data_sources == {}  # pylint: disable=protected-access
  assert copy.examples('train', 1, 2).read(0) == first
  read = pickle.loads(pickle.dumps(records.read))  # What a grain worker process calls.
  assert read(3) == records.read(3)
  assert copy.load(first)['image'] == src.load(first)['image']


def test_an_undecodable_image_is_unreadable_when_decoded(array_record_dir):
  src = source(array_record_dir)
  features = tfds_source.prepared_builder('tiny', array_record_dir).info.features
  # A file object is written as its bytes, unchecked.
  serialized = features.serialize_example(
      {**tiny_example('train', 0), 'image': io.BytesIO(b'not an image')}
  )
  with pytest.raises(images.UnreadableImage):
    images.pixels(src.load(tfds_source.Example('train', 0, serialized))['image'])


def test_split_errors_are_one_line_and_name_the_field(array_record_dir):
  src = source(array_record_dir)
  with pytest.raises(ValueError) as error:
    src.check_split('test', '--config.eval_split')
  assert str(error.value) == (
      "Bad split 'test' for dataset 'tiny': Unknown split 'test'. Should be one of ['train', "
      "'validation']; set --config.eval_split to one of ['train', 'validation'] or a slice of one, "
      "e.g. 'train[:90%]'"
  )
  with pytest.raises(
      ValueError,
      match=r"^Bad split 'train\[:200%\]' for dataset 'tiny': Error " r'parsing split .*[^\n]$',
  ):
    src.examples('train[:200%]')
  src.check_split('train[10%:]+validation', '--config.train_split')


def test_builder_errors_are_one_line(array_record_dir, tmp_path):
  with pytest.raises(
      ValueError,
      match=rf"^Unknown dataset 'no_such_dataset': .* none is prepared in {array_record_dir}: "
      r"set config.data_dir to where it is prepared, or use 'digits' .*imagenet2012 "
      r'\(see tfds.list_builders\(\)\)$',
  ):
    tfds_source.prepared_builder('no_such_dataset', array_record_dir)
  # A builder tfds lacks is read from where it was prepared (as the i21k configs' imagenet21k).
  assert tfds_source.prepared_builder('tiny', array_record_dir).name == 'tiny'
  with pytest.raises(ValueError) as error:
    tfds_source.prepared_builder('cifar10', str(tmp_path))
  assert str(error.value) == (
      f"tensorflow_datasets dataset 'cifar10' is not prepared in {tmp_path}: run `tfds build "
      f'cifar10 --data_dir={tmp_path} --file_format=array_record` on a machine with internet (some '
      f'datasets, e.g. imagenet2012, need a manual download first) and copy {tmp_path}/cifar10 '
      'here, or set config.data_dir to where it is prepared'
  )
  with pytest.raises(
      ValueError, match=r"^Cannot load tensorflow_datasets dataset 'cifar10:0.0.1': " r'[^\n]*$'
  ):
    tfds_source.prepared_builder('cifar10:0.0.1', str(tmp_path))


def test_label_feature_errors(array_record_dir):
  builder = tfds_source.prepared_builder('tiny', array_record_dir)
  with pytest.raises(ValueError) as error:
    tfds_source.TfdsSource(builder, 'fine_label')
  assert str(error.value) == (
      "Dataset 'tiny' has no ClassLabel (or Sequence of ClassLabel) feature 'fine_label': set "
      "--config.label_feature (or the evaluator's label_feature) to one of its ClassLabel features "
      "['coarse', 'label'] or label sets ['label_set']"
  )
  with pytest.raises(ValueError, match=r"^Dataset 'tiny' has no ClassLabel .* feature 'name':"):
    tfds_source.TfdsSource(builder, 'name')  # Text, not a label.


def test_a_tfrecord_dataset_is_a_one_line_error_naming_the_conversion(tfrecord_dir, tmp_path):
  data_dir = str(tmp_path / 'tfds')
  shutil.copytree(tfrecord_dir, data_dir)
  version_dir = f'{data_dir}/tiny/1.0.0'
  with pytest.raises(ValueError) as error:
    source(data_dir)
  assert str(error.value) == (
      f"tensorflow_datasets dataset 'tiny' in {version_dir} is prepared as tfrecord, and vit_jax "
      'reads only ArrayRecord: convert it once (the ArrayRecord files go beside the others) with '
      "`pip install '.[tfrecord]'` (TensorFlow, to read them) and "
      f'`python -m vit_jax.tools.to_array_record {version_dir}`'
  )


@pytest.mark.slow  # The conversion runs TensorFlow in subprocesses: make test-all's.
def test_the_conversion_command_gives_the_array_record_preparations_records(tfrecord_dir, tmp_path):
  """The command the one-line error above names, as a user runs it."""
  data_dir = str(tmp_path / 'tfds')
  shutil.copytree(tfrecord_dir, data_dir)
  version_dir = f'{data_dir}/tiny/1.0.0'
  for said in ('ArrayRecord files written', 'has ArrayRecord files already'):  # Once is enough.
    run = subprocess.run(
        [sys.executable, '-m', 'vit_jax.tools.to_array_record', version_dir],
        cwd=helpers.REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0 and run.stdout == f'{version_dir}: {said}\n', run.stderr[-3000:]
  src = source(data_dir)
  records = read_all(src, 'train[:7]+validation')
  # The converted records are the TFRecord files' in their order: the ArrayRecord preparation's.
  prepared_as_array_record = read_all(
      source(prepare(str(tmp_path / 'ar'), 'array_record')), 'train[:7]+validation'
  )
  assert [r.serialized for r in records] == [r.serialized for r in prepared_as_array_record]
  for record, example in zip(records, expected([name_of(src, r) for r in records])):
    np.testing.assert_array_equal(images.pixels(src.load(record)['image']), example['image'])
    assert src.load(record)['label'] == example['label']
  assert sorted(p.name for p in epath.Path(version_dir).iterdir() if 'incomplete' in p.name) == []


def test_conversion_errors_are_one_line(tmp_path, capsys):
  with pytest.raises(
      ValueError,
      match=rf'^No prepared tensorflow_datasets dataset in {tmp_path}: '
      r'give its version folder, the one with dataset_info.json',
  ):
    tfds_source.to_array_record(str(tmp_path))
  # Another dataset_info.json: a vit_jax workdir's, a Hugging Face save_to_disk folder's.
  (tmp_path / 'dataset_info.json').write_text('{"num_classes": 10, "class_names": ["0"]}')
  with pytest.raises(
      ValueError,
      match=rf'^{tmp_path}/dataset_info.json is not the one tensorflow_datasets writes \(.*\): '
      'give the version folder of a dataset tfds prepared$',
  ):
    tfds_source.to_array_record(str(tmp_path))
  with pytest.raises(SystemExit) as exit_:
    tfds_source.convert_main(['to_array_record'])
  assert exit_.value.code == 2
  assert capsys.readouterr().err == (
      f'error: give one dataset folder: use {tfds_source.CONVERT_USAGE}\n'
  )


def test_reads_without_tensorflow(array_record_dir, tfrecord_dir):
  script = f"""
import sys
try:
  import tensorflow
  raise AssertionError('tensorflow imported')
except ImportError:
  pass
from vit_jax.data import images, tfds_source, vtab
builder = tfds_source.prepared_builder('tiny', {array_record_dir!r})
source = tfds_source.TfdsSource(builder, 'label_set')
record = source.examples('train[:4]+validation[:2]', 1, 2).read(2)
example = source.load(record)
print(source.describe(record), images.pixels(example['image']).shape, example['labels'].tolist())
print(vtab.TASKS['clevr_count'].label.fn({{'objects': {{'size': [0] * 5}}}}))
# A folder without a dataset is that error, before the missing TensorFlow is.
for folder in ({array_record_dir + '/no_such/1.0.0'!r}, {tfrecord_dir + '/tiny/1.0.0'!r}):
  try:
    tfds_source.to_array_record(folder)
  except ValueError as e:
    print(e)
assert 'tensorflow' not in sys.modules, 'tensorflow loaded'
"""
  run = subprocess.run(
      [sys.executable, '-c', script],
      cwd=helpers.REPO,
      env=helpers.without_tensorflow(),
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  lines = run.stdout.splitlines()
  assert lines[0].startswith('example 5 of split train[:4]+validation[:2] of tiny (')
  assert lines[1:] == [
      '2',
      f'No prepared tensorflow_datasets dataset in {array_record_dir}/no_such/1.0.0: give its '
      'version folder, the one with dataset_info.json (e.g. DATA_DIR/cifar10/3.0.2)',
      "Reading TFRecord files needs TensorFlow: pip install '.[tfrecord]'",
  ]
