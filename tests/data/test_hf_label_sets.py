"""Label sets (multi-label) in Hugging Face datasets: a list column of ClassLabel, integers or strings,
written by the `datasets` library as Parquet files or with save_to_disk, reads as `datasets` loads
it (each row's classes, any slice and data shard of a split), and a run trains and evaluates on it.
"""

import json

import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.checkpoints import saved_state
from vit_jax.data import digits
from vit_jax.data import hf_card
from vit_jax.data import hf_features
from vit_jax.data import hf_source
from vit_jax.data import label_sets
from vit_jax.train import loop, observe, setup as train_setup

datasets = pytest.importorskip('datasets')

NAMES = helpers.LABEL_SET_NAMES
KINDS = {
    'class_label': datasets.ClassLabel(names=NAMES),
    'integers': datasets.Value('int64'),
    'strings': datasets.Value('string'),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path_factory):
  helpers.offline_datasets(monkeypatch, str(tmp_path_factory.mktemp('hf_cache')))


def _write(root, kind: str, layout: str) -> None:
  element = KINDS[kind]
  features = datasets.Features({'image': datasets.Image(), 'tags': datasets.List(element)})
  splits = {}
  for split, (pixels, labels) in digits.split_arrays().items():
    sets = [helpers.digit_label_set(k, int(label), split) for k, label in enumerate(labels)]
    if kind == 'strings':
      sets = [[NAMES[c] for c in labels] for labels in sets]
    splits[split] = datasets.Dataset.from_dict(
        {'image': [Image.fromarray(p[..., 0]) for p in pixels], 'tags': sets}, features=features
    )
  if layout == 'saved':
    datasets.DatasetDict(splits).save_to_disk(str(root))
  elif layout == 'imagefolder':  # Image files, and a metadata.jsonl of their lists.
    for split, ds in splits.items():
      (root / split).mkdir(parents=True)
      with open(root / split / 'metadata.jsonl', 'w') as f:
        for k, row in enumerate(ds):
          row['image'].save(root / split / f'{k:04d}.png')
          tags = [NAMES[c] for c in row['tags']] if kind == 'class_label' else row['tags']
          f.write(json.dumps({'file_name': f'{k:04d}.png', 'tags': tags}) + '\n')
    if kind == 'class_label':  # Named by the README's ClassLabel, as push_to_hub writes it.
      helpers.hf_dataset_card(root, features, {'default': {}})
  else:
    for split, ds in splits.items():
      ds.to_parquet(str(root / 'data' / f'{split}-00000-of-00001.parquet'))


def _loaded(root, layout: str):
  return (
      datasets.load_from_disk(str(root)) if layout == 'saved' else datasets.load_dataset(str(root))
  )


def _multi_hot(tags, class_names) -> np.ndarray:
  rows = np.zeros((len(tags), len(class_names)), bool)
  for i, labels in enumerate(tags):
    rows[i, [class_names.index(str(label)) for label in labels]] = True
  return rows


@pytest.mark.parametrize(
    'kind, layout',
    [
        *((kind, layout) for layout in ('parquet', 'saved') for kind in KINDS),
        *((kind, 'imagefolder') for kind in KINDS),
    ],
)
def test_each_row_reads_the_classes_datasets_loads(tmp_path, kind, layout):
  _write(tmp_path, kind, layout)
  theirs = _loaded(tmp_path, layout)
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'tags')
  assert source.multi_label
  expected_names = {
      'class_label': tuple(NAMES),
      'integers': tuple(map(str, range(12))),
      'strings': tuple(sorted(NAMES)),
  }[kind]
  assert source.class_names == expected_names
  tags = theirs['test']['tags']
  if kind == 'class_label':  # datasets gives the indices (an image folder's, the names written).
    tags = [[c if isinstance(c, str) else NAMES[c] for c in labels] for labels in tags]
  expected = _multi_hot(tags, source.class_names)
  for shard, num_shards in ((0, 1), (1, 3)):
    records = source.examples('test', shard, num_shards)
    ours = [source.load(records.read(k))['labels'] for k in range(records.num_records)]
    np.testing.assert_array_equal(ours, expected[shard::num_shards])
  # A slice across splits: the rows datasets slices them to.
  records = source.examples('test[5:20]+train[:3]')
  ours = [source.load(records.read(k))['labels'] for k in range(records.num_records)]
  np.testing.assert_array_equal(ours[:15], expected[5:20])
  assert [r.sum() for r in ours[15:]] == [len(labels) for labels in theirs['train']['tags'][:3]]


def test_ragged_sets_index_as_arrays_of_examples():
  sets = label_sets.from_lengths(np.array([2, 0, 3, 1]), np.arange(6))
  assert [s.tolist() for s in (sets[0], sets[1], sets[2], sets[3])] == [[0, 1], [], [2, 3, 4], [5]]
  chosen = sets[np.array([2, 0, 1])]
  assert [chosen[i].tolist() for i in range(3)] == [[2, 3, 4], [0, 1], []]
  strided = label_sets.concatenate([sets, chosen])[1::2]
  assert [strided[i].tolist() for i in range(len(strided))] == [[], [5], [0, 1]]


def test_each_way_datasets_writes_a_list_feature_is_read():
  names = {'_type': 'ClassLabel', 'names': ['a', 'b']}
  for written in (
      {'_type': 'List', 'feature': names},  # datasets 4 and up.
      {'_type': 'Sequence', 'feature': names},  # datasets 2 and 3.
      [names],  # Older.
  ):
    assert hf_features.element_feature(written) == names
  assert hf_features.element_feature(names) is None
  # A README's: 'list' (datasets 4 and up), 'sequence' (before).
  card = {
      'dataset_info': {
          'features': [
              {'name': 'tags', 'sequence': {'class_label': {'names': {'0': 'a', '1': 'b'}}}},
              {'name': 'ids', 'list': 'int64'},
          ]
      }
  }
  read = hf_card.features(card, None)
  assert read['tags'] == {'_type': 'List', 'feature': names}
  assert [hf_features.feature_kind(read[c]) for c in ('tags', 'ids')] == [
      'class_label_set',
      'integer_set',
  ]


def test_a_run_trains_and_evaluates_on_a_list_column(tmp_path):
  config = helpers.load_config('demo', helpers.label_set_digits_parquet(tmp_path / 'data_root'))
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert setup.info.multi_label and setup.info.class_names == tuple(NAMES)
  header = observe.run_header(setup, helpers.random_params(setup.model, config.image_size))
  assert '12 classes (a set of them an image); batch' in header
  metrics = loop.train_and_evaluate(setup)
  assert 0 < metrics['eval_map'] < 1 and 0 <= metrics['eval_top1'] <= metrics['eval_top5'] <= 1


@pytest.mark.parametrize('kind', ['integers', 'strings'])
def test_webdataset_samples_json_lists_are_label_sets(tmp_path, kind):
  """Each sample a PNG and a JSON object whose 'tags' is its list of classes (the first samples'
  empty lists do not hide the lists' kind)."""
  expected = {}
  for split, (pixels, labels) in digits.split_arrays().items():
    sets = [helpers.digit_label_set(k, int(label), split) for k, label in enumerate(labels)]
    if split == 'train':
      sets[:3] = [[], [], []]
    expected[split] = sets
    tags = [[NAMES[c] for c in labels] if kind == 'strings' else labels for labels in sets]
    helpers.webdataset_tar(
        tmp_path / f'digits-{split}-0000.tar',
        [
            (
                f'{split}_{k:05d}',
                {
                    'png': helpers.encoded(pixels[k][..., 0], 'PNG'),
                    'json': json.dumps({'tags': tags[k], 'id': k}).encode(),
                },
            )
            for k in range(len(sets))
        ],
    )
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'json.tags')
  assert source.multi_label
  names = source.class_names
  assert names == (tuple(map(str, range(12))) if kind == 'integers' else tuple(sorted(NAMES)))
  records = source.examples('test')
  ours = [source.load(records.read(k))['labels'] for k in range(records.num_records)]
  as_names = lambda labels: [str(c) if kind == 'integers' else NAMES[c] for c in labels]
  np.testing.assert_array_equal(
      ours, [np.isin(names, as_names(labels)) for labels in expected['test']]
  )


def test_a_json_key_of_another_kind_in_a_later_sample_is_a_one_line_error(tmp_path):
  png = helpers.encoded(np.zeros((4, 4), np.uint8), 'PNG')
  helpers.webdataset_tar(
      tmp_path / 'data-train-0000.tar',
      [
          (f'{k:05d}', {'png': png, 'json': json.dumps({'tags': tags}).encode()})
          for k, tags in enumerate([[1, 2], [0], 3])
      ],
  )
  with pytest.raises(ValueError, match=r"sample '00002': its 'json.tags' is 3, not a list of"):
    hf_source.HuggingFaceSource(str(tmp_path), 'train', 'json.tags')


def test_a_missing_label_column_names_the_list_columns(tmp_path):
  _write(tmp_path, 'integers', 'parquet')
  with pytest.raises(ValueError, match=r"has no label column 'label' .*one of \['tags'\]$"):
    hf_source.HuggingFaceSource(str(tmp_path), 'train', 'label')


@pytest.mark.slow  # Three runs of vit_jax.main, two of them the processes of one: make test-all's.
def test_two_hosts_measure_what_one_measures(tmp_path):
  """The mAP of a run of two processes is of every image of the split, each host's and the other's,
  as one process's is (each host reads half of the split); the processes keep the best by it together
  (config.best_checkpoint: every process saves its shards and decides alike)."""
  overrides = {
      **helpers.label_set_digits_parquet(tmp_path / 'data_root'),
      'data_shards': 2,
      'total_steps': 4,
      'eval_every_steps': 2,
      'best_checkpoint.metric': 'eval_map',
  }
  one = helpers.run_main('configs/demo.py', str(tmp_path / 'one'), overrides, timeout=300)
  assert one.returncode == 0, one.stderr[-3000:]
  procs = helpers.two_processes(
      helpers.main_args('configs/demo.py', str(tmp_path / 'two'), overrides)
  )
  try:
    outputs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outputs]
  ones, twos = (helpers.read_scalars(str(tmp_path / run)) for run in ('one', 'two'))
  for metric in ('eval_map', 'eval_top1', 'eval_loss'):
    assert twos[metric][4] == pytest.approx(ones[metric][4], rel=1e-5), metric
  assert 0 < ones['eval_map'][4] < 1
  for run, scalars in (('one', ones), ('two', twos)):
    best = max(scalars['eval_map'], key=scalars['eval_map'].get)
    assert saved_state.find_checkpoint(str(tmp_path / run), 'best')[1] == best, run


def test_lists_of_a_fixed_length_are_label_sets(tmp_path):
  features = datasets.Features(
      {'image': datasets.Image(), 'tags': datasets.List(datasets.Value('int64'), length=2)}
  )
  pixels = np.zeros((6, 4, 4), np.uint8)
  for split in ('train', 'test'):
    datasets.Dataset.from_dict(
        {'image': [Image.fromarray(p) for p in pixels], 'tags': [[k % 3, 3] for k in range(6)]},
        features=features,
    ).to_parquet(str(tmp_path / 'data' / f'{split}-00000-of-00001.parquet'))
  source = hf_source.HuggingFaceSource(str(tmp_path), 'train', 'tags')
  assert source.multi_label and source.class_names == ('0', '1', '2', '3')
  records = source.examples('test')
  ours = [source.load(records.read(k))['labels'] for k in range(6)]
  np.testing.assert_array_equal(ours, [np.isin(range(4), [k % 3, 3]) for k in range(6)])
