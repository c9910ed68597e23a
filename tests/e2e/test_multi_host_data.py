"""A run of two processes (launch/local.py, as the hosts of a pod) on WebDataset tar shards: they
divide the indexing of each split between them, and train and evaluate as one process does on the
same data shards."""

import numpy as np

import helpers
import local
from vit_jax.data import dataset_cache


def test_two_processes_divide_the_indexing_and_train_as_one_process(tmp_path, monkeypatch, capfd):
  shards = tmp_path / 'shards'
  helpers.digits_shards(str(shards), 4)
  overrides = {
      **helpers.TINY,
      'dataset': 'huggingface',
      'data_dir': str(shards),
      'label_feature': 'cls',
      'eval_split': 'test',
      'data_shards': 2,  # The same examples a step for one process as for two.
  }
  monkeypatch.setenv(dataset_cache.CACHE_VARIABLE, str(tmp_path / 'two_processes'))
  two = str(tmp_path / 'two')
  args = helpers.main_args('configs/demo.py', two, overrides)[3:]
  code = local.launch(args, num_processes=2, devices_per_process=4, timeout=600)
  err = capfd.readouterr().err
  assert code == 0, err[-5000:]
  for split in ('train', 'test'):
    assert f'Indexing split {split!r} of {shards} (4 tar files): 2 of them on this process' in err
  assert len(list((tmp_path / 'two_processes').glob('*.webdataset'))) == 2  # The processes' one.

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
