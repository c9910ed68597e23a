"""WebDataset tar shards (`dataset='huggingface'` on a folder of .tar files, as timm's
imagenet-1k-wds on the hub), written with Python's tarfile in each of its formats and read back by
`datasets.load_dataset`: the same splits, samples, images and labels; the digits as shards train
and evaluate as the bundled digits."""

import hashlib
import json
import os
import pathlib
import pickle
import sys
import tarfile
import threading
import time

import numpy as np
import pytest

import helpers
from vit_jax import data
from vit_jax.data import dataset_cache
from vit_jax.data import hf_source
from vit_jax.data import hf_webdataset
from vit_jax.data import images

datasets = pytest.importorskip('datasets')


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
  helpers.offline_datasets(monkeypatch, str(tmp_path_factory.mktemp('hf_cache')))


def _samples(n: int, seed: int, key_prefix: str = '', label='cls') -> list:
  """n random JPEG and PNG images of several sizes (all as 'jpg': decoders read the content), with
  each EXIF orientation in turn and none, their labels as `label` files (class numbers for 'cls',
  names for 'txt') and a json file each."""
  rng = np.random.default_rng(seed)
  samples = []
  for i in range(n):
    pixels = rng.integers(0, 256, (9 + i % 4, 7 + i % 3, 3), np.uint8)
    value = (i * 7 + seed) % 3
    samples.append(
        (
            f'{key_prefix}{seed:02d}_{i:04d}',
            {
                'jpg': helpers.encoded(
                    pixels, 'PNG' if i % 3 == 0 else 'JPEG', orientation=i % 9 or None
                ),
                label: (
                    str(value) if label == 'cls' else ['cat', 'airplane', 'bird'][value]
                ).encode(),
                'json': b'{"width": %d}' % pixels.shape[1],
            },
        )
    )
  return samples


def _one_sample(label: str, value: bytes) -> list:
  return [('one', {'jpg': helpers.encoded(np.zeros((4, 4, 3), np.uint8)), label: value})]


def _rows(source, split: str) -> list[tuple[np.ndarray, int]]:
  records = source.examples(split)
  return [
      (images.rgb(images.pixels(e['image'])), int(e['label']))
      for e in (source.load(records.read(k)) for k in range(records.num_records))
  ]


def _assert_rows(ours, theirs, label: str, names=None) -> None:
  assert len(ours) == len(theirs)
  for k, ((image, ours_label), row) in enumerate(zip(ours, theirs)):
    np.testing.assert_array_equal(image, np.asarray(row['jpg'].convert('RGB')), err_msg=f'row {k}')
    assert ours_label == (row[label] if names is None else names.index(row[label])), k


def test_shards_read_as_datasets_loads_them(tmp_path):
  """timm's shard names, each of tarfile's formats, key paths past ustar's 100 characters, and what
  datasets leaves out of samples (folders, hidden files)."""
  long_prefix = 'n01440764/' + 'x' * 120 + '_'
  helpers.webdataset_tar(tmp_path / 'imagenet1k-train-0000.tar', _samples(5, 0), tarfile.GNU_FORMAT)
  helpers.webdataset_tar(
      tmp_path / 'imagenet1k-train-0001.tar',
      _samples(4, 1, long_prefix),
      tarfile.PAX_FORMAT,
      extra=[('.DS_Store', b'x'), ('__meta__.json', b'{}')],
  )
  helpers.webdataset_tar(
      tmp_path / 'imagenet1k-validation-0000.tar', _samples(3, 2, 'val/'), tarfile.USTAR_FORMAT
  )
  theirs = datasets.load_dataset(str(tmp_path))
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'cls')
  assert isinstance(source._rows, hf_webdataset.Rows)  # pylint: disable=protected-access
  assert list(source._rows.sizes) == list(theirs) == ['train', 'validation']  # pylint: disable=protected-access
  assert source.class_names == ('0', '1', '2')
  for split in theirs:
    _assert_rows(_rows(source, split), theirs[split], 'cls')
  sliced = source.examples('train[2:7]')
  assert [source.load(sliced.read(k))['label'] for k in range(5)] == theirs['train']['cls'][2:7]


def test_class_names_of_the_readme_and_text_labels_are_datasets_own(tmp_path):
  """A README's ClassLabel names the classes of `cls`; text labels (`txt`) are the train split's
  names, sorted, and an eval label no train sample has is one line."""
  readme = tmp_path / 'readme'
  helpers.webdataset_tar(readme / 'train/0.tar', _samples(6, 3))
  helpers.webdataset_tar(readme / 'test/0.tar', _samples(4, 4))
  features = datasets.Features(
      {'jpg': datasets.Image(), 'cls': datasets.ClassLabel(names=['cat', 'airplane', 'bird'])}
  )
  helpers.hf_dataset_card(
      readme,
      features,
      {
          'default': {
              'data_files': [
                  {'split': 'train', 'path': 'train/*.tar'},
                  {'split': 'test', 'path': 'test/*.tar'},
              ]
          }
      },
  )
  theirs = datasets.load_dataset(str(readme))
  source = hf_source.HuggingFaceSource(str(readme), 'train', 'cls')
  assert source.class_names == tuple(theirs['train'].features['cls'].names)
  _assert_rows(_rows(source, 'test'), theirs['test'], 'cls')

  named = tmp_path / 'named'  # The README's ClassLabel over a text column: names to numbers.
  helpers.webdataset_tar(named / 'train/0.tar', _samples(6, 7, label='txt'))
  helpers.webdataset_tar(named / 'test/0.tar', _samples(3, 8, label='txt'))
  features = datasets.Features(
      {'jpg': datasets.Image(), 'txt': datasets.ClassLabel(names=['bird', 'cat', 'airplane'])}
  )
  helpers.hf_dataset_card(named, features, {'default': {}})
  theirs = datasets.load_dataset(str(named))
  source = hf_source.HuggingFaceSource(str(named), 'train', 'txt')
  assert source.class_names == ('bird', 'cat', 'airplane')
  _assert_rows(_rows(source, 'test'), theirs['test'], 'txt')
  helpers.webdataset_tar(named / 'test/0.tar', _one_sample('txt', b'dog'))
  with pytest.raises(ValueError, match="its 'txt' 'dog' is not one of the classes the README"):
    hf_source.HuggingFaceSource(str(named), 'train', 'txt')

  text = tmp_path / 'text'
  helpers.webdataset_tar(text / 'pets-train-0.tar', _samples(7, 5, label='txt'))
  helpers.webdataset_tar(text / 'pets-test-0.tar', _samples(3, 6, label='txt'))
  theirs = datasets.load_dataset(str(text))
  source = hf_source.HuggingFaceSource(str(text), 'train', 'txt')
  assert source.class_names == ('airplane', 'bird', 'cat')
  _assert_rows(_rows(source, 'test'), theirs['test'], 'txt', list(source.class_names))
  helpers.webdataset_tar(text / 'pets-test-0.tar', _one_sample('txt', b'dog'))
  with pytest.raises(ValueError, match=r"labels that no train example has: \['dog'\]"):
    hf_source.HuggingFaceSource(str(text), 'train', 'txt').split_labels('test')


def _json_labelled(samples: list, key: str, names=None) -> list:
  """`samples` with their labels in their json files at `key` (as numbers, or `names`) alone."""
  out = []
  for sample_key, columns in samples:
    label = int(columns.pop('cls'))
    meta = {**json.loads(columns['json']), key: label if names is None else names[label]}
    out.append((sample_key, {**columns, 'json': json.dumps(meta).encode()}))
  return out


def test_labels_in_json_files_read_as_datasets_reads_the_objects(tmp_path):
  """`label_feature='json.KEY'`: the key of each sample's JSON object (class numbers, or names);
  what is not a number or a name, or not the first samples' kind, is one line."""
  numbers = tmp_path / 'numbers'
  helpers.webdataset_tar(numbers / 'shards-train-0.tar', _json_labelled(_samples(6, 9), 'label'))
  helpers.webdataset_tar(numbers / 'shards-test-0.tar', _json_labelled(_samples(4, 10), 'label'))
  theirs = datasets.load_dataset(str(numbers))
  source = hf_source.HuggingFaceSource(str(numbers), 'train', 'json.label')
  assert source.class_names == ('0', '1', '2')
  ours = _rows(source, 'test')
  assert [label for _, label in ours] == [row['json']['label'] for row in theirs['test']]
  _assert_rows(ours, theirs['test'].map(lambda row: {'label': row['json']['label']}), 'label')

  names = tmp_path / 'names'
  pets = ['cat', 'airplane', 'bird']
  helpers.webdataset_tar(
      names / 'shards-train-0.tar', _json_labelled(_samples(6, 11), 'class', pets)
  )
  helpers.webdataset_tar(
      names / 'shards-test-0.tar', _json_labelled(_samples(3, 12), 'class', pets)
  )
  theirs = datasets.load_dataset(str(names))
  source = hf_source.HuggingFaceSource(str(names), 'train', 'json.class')
  assert source.class_names == ('airplane', 'bird', 'cat')
  assert [source.class_names[label] for _, label in _rows(source, 'test')] == [
      row['json']['class'] for row in theirs['test']
  ]
  with pytest.raises(ValueError, match=r"no label column 'json.species' .* \['json.width', 'json"):
    hf_source.HuggingFaceSource(str(names), 'train', 'json.species')

  mixed = _json_labelled(_samples(1, 13), 'class', pets) + _json_labelled(_samples(1, 14), 'class')
  helpers.webdataset_tar(names / 'shards-test-0.tar', mixed)
  with pytest.raises(
      ValueError, match=r"'json.class' is 2, where the first samples have class name"
  ):
    hf_source.HuggingFaceSource(str(names), 'train', 'json.class')
  helpers.webdataset_tar(
      names / 'shards-test-0.tar', mixed[:1] + _one_sample('json', b'{"class": 1.5}')
  )
  with pytest.raises(ValueError, match=r"its 'json.class' is 1.5, not a class number or name"):
    hf_source.HuggingFaceSource(str(names), 'train', 'json.class')


def test_the_digits_as_shards_train_and_evaluate_as_the_digits(tmp_path):
  """The bundled digits as tar shards (greyscale PNGs, in the split's order): the same train and
  eval batches as `dataset='digits'`, in threads and in worker processes, and the same labels."""
  helpers.digits_shards(str(tmp_path), 2)
  helpers.assert_reads_as_the_digits(
      helpers.data_config(str(tmp_path), dataset='huggingface', label_feature='cls', data_shards=2),
      workers=True,
  )


def test_a_split_is_indexed_once_and_again_when_a_shard_changes(tmp_path, monkeypatch):
  cache = tmp_path / 'cache'
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(cache))
  root = tmp_path / 'shards'
  helpers.webdataset_tar(root / 'train-0.tar', _samples(5, 0))
  first = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'cls'), 'train')
  (index,) = list(cache.glob('*.webdataset'))
  written = (index / 'extents.npy').stat().st_mtime_ns
  again = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'cls'), 'train')
  assert [label for _, label in again] == [label for _, label in first]
  assert list(cache.glob('*.webdataset')) == [index]
  assert (index / 'extents.npy').stat().st_mtime_ns == written
  # A label edited in place, the size and modification time kept (as `cp -p` and `rsync -a` copy).
  shard = root / 'train-0.tar'
  kept = shard.stat()
  with tarfile.open(shard) as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith('.cls'))
  contents = bytearray(shard.read_bytes())
  old_label = contents[member.offset_data]
  contents[member.offset_data] = ord('2') if old_label != ord('2') else ord('1')
  shard.write_bytes(contents)
  os.utime(shard, ns=(kept.st_atime_ns, kept.st_mtime_ns))
  assert (shard.stat().st_size, shard.stat().st_mtime_ns) == (kept.st_size, kept.st_mtime_ns)
  edited = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'cls'), 'train')
  assert [label for _, label in edited] != [label for _, label in first]
  _assert_rows(edited, datasets.load_dataset(str(root))['train'], 'cls')
  assert len(list(cache.glob('*.webdataset'))) == 2
  helpers.webdataset_tar(root / 'train-0.tar', _samples(7, 1))
  changed = _rows(hf_source.HuggingFaceSource(str(root), 'train', 'cls'), 'train')
  _assert_rows(changed, datasets.load_dataset(str(root))['train'], 'cls')
  assert len(list(cache.glob('*.webdataset'))) == 3
  assert not list(cache.glob('*.partial'))


def _error(root, **overrides) -> str:
  return helpers.data_error(
      str(root), dataset='huggingface', **{'label_feature': 'cls', **overrides}
  )


def test_bad_shards_are_one_line_errors_naming_the_fix(tmp_path):
  compressed = tmp_path / 'compressed'
  compressed.mkdir()
  helpers.webdataset_tar(tmp_path / 'plain.tar', _samples(2, 0))
  import gzip  # pylint: disable=g-import-not-at-top

  (compressed / 'train.tar').write_bytes(gzip.compress((tmp_path / 'plain.tar').read_bytes()))
  assert 'not a readable uncompressed tar file' in _error(compressed)

  cut = tmp_path / 'cut'
  cut.mkdir()
  whole = (tmp_path / 'plain.tar').read_bytes()
  (cut / 'train.tar').write_bytes(whole[: len(whole) // 2 + 100])  # Cut inside its second sample.
  assert 'not a readable uncompressed tar file (unexpected end of data)' in _error(cut)
  # Cut at a header, or in one: tarfile reads the samples before it, without a word.
  with tarfile.open(tmp_path / 'plain.tar') as tar:
    second = tar.getmembers()[3].offset  # The second sample's first header.
  for end in (second, second + 100):
    (cut / 'train.tar').write_bytes(whole[:end])
    assert 'not a readable uncompressed tar file (unexpected end of data)' in _error(cut)

  lfs = tmp_path / 'lfs'
  lfs.mkdir()
  (lfs / 'train.tar').write_bytes(images.LFS_POINTER + b' https://git-lfs.github.com/spec/v1\n')
  assert '(a git-lfs pointer): fetch the files (`git lfs pull`)' in _error(lfs)

  unlabelled = _samples(6, 0)
  del unlabelled[5][1]['cls']  # The first five samples, whose columns datasets reads, have it.
  helpers.webdataset_tar(tmp_path / 'unlabelled/train.tar', unlabelled)
  assert "has 1 examples without a 'cls': use a labelled split" in _error(
      tmp_path / 'unlabelled', eval_split='train'
  )

  words = _samples(2, 0)
  words[1][1]['cls'] = b'bird'
  helpers.webdataset_tar(tmp_path / 'words/train.tar', words)
  assert "its 'cls' is b'bird', not a class number" in _error(tmp_path / 'words')

  twice = _samples(2, 0)
  helpers.webdataset_tar(
      tmp_path / 'twice/train.tar', twice, extra=[('k.cls', b'1'), ('k.cls', b'2')]
  )
  assert "sample 'k' has two 'cls' files" in _error(tmp_path / 'twice')

  mixed = _samples(3, 0)
  del mixed[1][1]['json']
  helpers.webdataset_tar(tmp_path / 'mixed/train.tar', mixed)
  assert 'do not have the same extensions' in _error(tmp_path / 'mixed')

  assert (
      "set --config.label_feature (or the evaluator's label_feature) to one of ['cls', 'json.width']"
      in _error(tmp_path / 'unlabelled', label_feature='label')
  )


def test_a_sample_without_an_image_is_unreadable_not_a_crash(tmp_path):
  samples = _samples(6, 0)
  del samples[5][1]['jpg']
  helpers.webdataset_tar(tmp_path / 'train.tar', samples)
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'cls')
  records = source.examples('train')
  with pytest.raises(images.UnreadableImage, match="no 'jpg' file in this sample"):
    source.load(records.read(5))
  assert source.describe(records.read(5)) == f"sample 5 of split 'train' (in {tmp_path}/train.tar)"


def test_a_repository_of_shards_on_the_hub_downloads_its_tar_files_and_readme(
    tmp_path, monkeypatch
):
  helpers.webdataset_tar(tmp_path / 'snapshot/imagenet1k-train-0000.tar', _samples(4, 0))
  listing = ['README.md', '.gitattributes', '_info.json']
  listing += [f'imagenet1k-{s}-{k:04d}.tar' for s in ('train', 'validation') for k in range(2)]
  asked = helpers.fake_hub(monkeypatch, listing, str(tmp_path / 'snapshot'))
  config = helpers.data_config(
      'hf-hub:timm/shards', dataset='huggingface', label_feature='cls', eval_split='train[:2]'
  )
  assert data.get_info(config).num_train == 4
  assert asked['allow_patterns'] == ['*.tar', 'README.md']


def test_an_index_another_machine_made_meanwhile_is_kept(tmp_path, monkeypatch):
  """On a shared cache folder whose lock does not hold across machines, two may index at once: the
  second to finish keeps the first's index, and leaves nothing behind."""
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'cache'))
  path = dataset_cache.cache_path((), 'an index', '.webdataset')
  written = []

  def write(partial):
    written.append(partial)
    os.makedirs(partial)
    (tmp_path / 'cache' / partial / 'mine').touch()
    os.makedirs(path)  # The other machine finishes first.
    (tmp_path / 'cache' / path / 'theirs').touch()

  assert dataset_cache.made_once(path, 0, 'Indexing', write) == path
  assert os.listdir(path) == ['theirs'] and not os.path.exists(written[0])


def test_a_worker_process_maps_the_index_without_a_look_at_the_shards(tmp_path, monkeypatch):
  """A worker gets the source pickled: it finds the index the run made by its name, with no stat of
  each tar (on cloud storage, a request each)."""
  helpers.webdataset_tar(tmp_path / 'train.tar', _samples(4, 0))
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'cls')
  records = source.examples('train')
  worker = pickle.loads(pickle.dumps(source))
  monkeypatch.setattr(dataset_cache, 'size_and_time', lambda path: pytest.fail(f'{path} looked at'))
  for k in range(4):
    assert worker.load(records.read(k))['image'] == source.load(records.read(k))['image']


TWO_HOSTS = """
import hashlib, json, os, shutil, sys
import jax
jax.config.update('jax_cpu_collectives_implementation', 'gloo')
root, damaged, caches, address, _, process = (a.split('=')[-1] for a in sys.argv[1:])
process = int(process)
cache = f'{caches}_{process}'
os.environ['VIT_JAX_DATASETS_CACHE'] = cache
jax.distributed.initialize(address, num_processes=2, process_id=process)
from vit_jax.data import hf_source, hf_webdataset

indexed = []
index_tar = hf_webdataset._index_tar
hf_webdataset._index_tar = lambda path, *args: indexed.append(os.path.basename(path)) or index_tar(
    path, *args)

def indexed_by_this_process():
  source = hf_source.HuggingFaceSource(root, 'train', 'cls')
  index = {split: {name: hashlib.sha256(open(os.path.join(folder, name + '.npy'), 'rb').read())
                   .hexdigest() for name in ('extents', 'labels')}
           for split, folder in source._rows._indices.items()}
  tars = sorted(indexed)
  indexed.clear()
  return tars, index

result = {'fresh': indexed_by_this_process()}
if process == 1:
  shutil.rmtree(cache)  # A host whose cache is lost (a new VM); process 0 keeps its index.
result['one_lost'] = indexed_by_this_process()
result['kept'] = indexed_by_this_process()
try:
  hf_source.HuggingFaceSource(damaged, 'train', 'cls')
except ValueError as e:
  result['error'] = str(e)
print(json.dumps(result))
"""


def test_a_split_of_many_tars_is_indexed_by_processes_as_by_threads(tmp_path, monkeypatch):
  """From hf_webdataset._TARS_FOR_PROCESSES tars on, a process a core indexes its share: the same
  index as threads make, and a damaged tar is the same one-line error."""
  files = []
  for k in range(hf_webdataset._TARS_FOR_PROCESSES):  # pylint: disable=protected-access
    files.append(str(tmp_path / f'train-{k:02d}.tar'))
    helpers.webdataset_tar(files[-1], _samples(1 + k % 3, k))
  pools = []
  process_pool = hf_webdataset.concurrent.futures.ProcessPoolExecutor

  def recorded(processes, **kwargs):
    pools.append(processes)
    return process_pool(processes, **kwargs)

  monkeypatch.setattr(hf_webdataset.concurrent.futures, 'ProcessPoolExecutor', recorded)
  monkeypatch.setattr(hf_webdataset.cpuinfo, 'usable_cores', lambda: 2)
  index = hf_webdataset._index_tars  # pylint: disable=protected-access
  extents, labels = index(tuple(files), 'jpg', 'cls', None, True)
  assert pools == [2] and len(labels) == 31
  np.testing.assert_array_equal(
      extents['file'], np.repeat(np.arange(16), [1 + k % 3 for k in range(16)])
  )
  monkeypatch.setattr(hf_webdataset, '_TARS_FOR_PROCESSES', 17)
  threaded = index(tuple(files), 'jpg', 'cls', None, True)
  assert pools == [2]
  np.testing.assert_array_equal(extents, threaded[0])
  np.testing.assert_array_equal(labels, threaded[1])
  monkeypatch.setattr(hf_webdataset, '_TARS_FOR_PROCESSES', 16)
  pathlib.Path(files[7]).write_bytes(pathlib.Path(files[7]).read_bytes()[:700])
  with pytest.raises(ValueError, match=r'train-07.tar is not a readable uncompressed tar file'):
    index(tuple(files), 'jpg', 'cls', None, True)


def _index_hashes(source) -> dict:
  return {
      split: {
          name: hashlib.sha256((pathlib.Path(folder) / f'{name}.npy').read_bytes()).hexdigest()
          for name in ('extents', 'labels')
      }
      for split, folder in source._rows._indices.items()  # pylint: disable=protected-access
  }


@pytest.mark.slow  # Two processes of a run: make test-all's.
def test_the_processes_of_a_multi_host_run_divide_the_indexing(tmp_path, monkeypatch):
  """Each host of a pod indexes its share of the tars (on cloud storage each would read every tar
  whole), and gets the same index as one process makes; again where one host lost its cache; a tar
  another host cannot read is the same one-line error on every host, not a hang."""
  root, damaged = tmp_path / 'shards', tmp_path / 'damaged'
  for k in range(5):
    helpers.webdataset_tar(root / f'train-{k}.tar', _samples(3 + k, k))
    helpers.webdataset_tar(damaged / f'train-{k}.tar', _samples(3, k))
  for k in range(3):
    helpers.webdataset_tar(root / f'validation-{k}.tar', _samples(2 + k, 10 + k))
  cut = damaged / 'train-3.tar'  # In process 1's share.
  cut.write_bytes(cut.read_bytes()[:700])
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'one_process'))
  expected = _index_hashes(hf_source.HuggingFaceSource(str(root), 'train', 'cls'))

  procs = helpers.two_processes(
      [sys.executable, '-c', TWO_HOSTS, str(root), str(damaged), str(tmp_path / 'cache')], 2
  )
  try:
    outputs = [p.communicate(timeout=240) for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outputs]
  results = [json.loads(out.splitlines()[-1]) for out, _ in outputs]
  shares = (
      ['train-0.tar', 'train-1.tar', 'validation-0.tar'],
      ['train-2.tar', 'train-3.tar', 'train-4.tar', 'validation-1.tar', 'validation-2.tar'],
  )
  for process, result in enumerate(results):
    assert result['fresh'] == [shares[process], expected]
    assert result['one_lost'] == [shares[process], expected]
    assert result['kept'] == [[], expected]
  assert 'train-3.tar is not a readable uncompressed tar file' in results[1]['error']
  assert results[0]['error'] == results[1]['error'] + ' (on process 1 of the run)'


def test_shards_on_cloud_storage_are_looked_at_many_at_a_time(monkeypatch):
  """The cache key holds each file's size and time: on gs:// a request a file, at every start."""
  running, most = [0], [0]
  lock = threading.Lock()

  def size_and_time(path):
    with lock:
      running[0] += 1
      most[0] = max(most[0], running[0])
    time.sleep(0.02)
    with lock:
      running[0] -= 1
    return len(path), 1.0

  monkeypatch.setattr(dataset_cache, 'size_and_time', size_and_time)
  files = tuple(f'gs://bucket/imagenet-train-{k:04d}.tar' for k in range(64))
  key = dataset_cache.cache_path(files, ['jpg', 'cls'], '.webdataset')
  assert most[0] > 8
  assert key == dataset_cache.cache_path(files, ['jpg', 'cls'], '.webdataset')
  assert key != dataset_cache.cache_path(files[::-1], ['jpg', 'cls'], '.webdataset')
