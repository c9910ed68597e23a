"""A run of two processes (launch/local.py, as the hosts of a pod) on WebDataset tar shards or
Parquet files: they divide the indexing of each split between them, or each copy their own rows, and
train and evaluate as one process does on the same data shards."""

import numpy as np

import helpers
import local
from vit_jax.data import dataset_cache
from vit_jax.data import digits


def _two_processes_train_as_one(tmp_path, monkeypatch, capfd, data_dir, **overrides) -> str:
  """The demo on `data_dir` run by two processes of 4 devices and by one of 8 (their dataset caches
  tmp_path/two_processes and one_process), with the same two data shards: the same losses and eval
  top-1. The two processes' stderr."""
  overrides = {
      **helpers.TINY,
      'dataset': 'huggingface',
      'data_dir': str(data_dir),
      'eval_split': 'test',
      'data_shards': 2,  # The same examples a step for one process as for two.
      **overrides,
  }
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'two_processes'))
  two = str(tmp_path / 'two')
  args = helpers.main_args('configs/demo.py', two, overrides)[3:]
  code = local.launch(args, num_processes=2, devices_per_process=4, timeout=600)
  err = capfd.readouterr().err
  assert code == 0, err[-5000:]
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'one_process'))
  one = str(tmp_path / 'one')
  run = helpers.run_main('configs/demo.py', one, overrides, env=helpers.on_devices(8), timeout=600)
  assert run.returncode == 0, run.stderr[-5000:]
  ours, theirs = helpers.read_scalars(two), helpers.read_scalars(one)
  assert list(ours['train_loss']) == list(theirs['train_loss']) == [4, 8, 12]
  # Two processes of 4 devices sum across processes where one process sums across its 8 devices.
  np.testing.assert_allclose(
      list(ours['train_loss'].values()), list(theirs['train_loss'].values()), rtol=1e-5
  )
  assert ours['eval_top1'] == theirs['eval_top1']
  return err


def test_two_processes_divide_the_indexing_and_train_as_one_process(tmp_path, monkeypatch, capfd):
  shards = tmp_path / 'shards'
  helpers.digits_shards(str(shards), 4)
  err = _two_processes_train_as_one(tmp_path, monkeypatch, capfd, shards, label_feature='cls')
  for split in ('train', 'test'):
    assert f'Indexing split {split!r} of {shards} (4 tar files): 2 of them on this process' in err
  assert len(list((tmp_path / 'two_processes').glob('*.webdataset'))) == 2  # The processes' one.


def test_two_processes_copy_each_their_rows_of_parquet_and_train_as_one_process(
    tmp_path, monkeypatch, capfd
):
  root = tmp_path / 'parquet'
  helpers.digits_parquet(str(root), 3)
  err = _two_processes_train_as_one(tmp_path, monkeypatch, capfd, root)
  assert f"rows this process reads of split 'train' of {root} (3 Parquet files, " in err
  sizes = {split: len(labels) for split, (_, labels) in digits.split_arrays().items()}
  halves = lambda n: [n // 2, n - n // 2]  # The two processes' data shards of n rows.
  two_processes = helpers.arrow_rows(tmp_path / 'two_processes')
  assert two_processes == sorted(halves(sizes['train']) + halves(sizes['test']))
  # One process: the train split's two data shards in one copy (the whole split), and the whole
  # test split it evaluates on.
  one_process = helpers.arrow_rows(tmp_path / 'one_process')
  assert one_process == sorted([sizes['train'], sizes['test']])
