"""PyTorch's checkpoint files read without torch (make test's environment has none): torch_saved.pth
is a training checkpoint that torch 2.14's torch.save wrote (test_torch_pickle_vs_torch.py writes
it again from `saved()` and reads it with torch.load), its model's tensors of several dtypes, views
of one storage, a parameter and a scalar."""

import argparse
import collections
import io
import os
import pickle
import sys
import zipfile

import ml_dtypes
import numpy as np
import pytest
from etils import epath

from vit_jax.checkpoints import torch_files, torch_pickle

FIXTURE = os.path.join(os.path.dirname(__file__), 'torch_saved.pth')


def expected() -> dict[str, np.ndarray]:
  """The model's tensors in torch_saved.pth, by their names once read (DataParallel's `module.`
  dropped): `saved()` makes each from these arrays."""
  base = np.arange(24, dtype=np.float32).reshape(4, 6)
  return {
      'weight': np.arange(12, dtype=np.float32).reshape(3, 4) / 8,
      'base': base,
      'transposed': base.T,
      'strided': base[1:3, ::2],
      'bfloat16': (np.arange(6, dtype=np.float32) / 4).astype(ml_dtypes.bfloat16).reshape(2, 3),
      'float16': np.arange(5, dtype=np.float16) / 2,
      'index': np.arange(7, dtype=np.int64),
      'mask': np.arange(4) % 2 == 0,
      'scalar': np.array(2.5, np.float32),
      'empty': np.zeros((0, 4), np.float32),
      'head.weight': np.array([[1.0, -1.0]], np.float32),
  }


def saved(torch) -> dict:
  """What torch_saved.pth holds, made with `torch` (a training checkpoint: the model's state dict
  under 'model' beside the run's arguments and its optimiser's state)."""
  arrays = expected()
  tensors = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in arrays.items()}
  base = tensors['base']
  model = collections.OrderedDict(
      weight=torch.nn.Parameter(tensors['weight']),
      base=base,
      transposed=base.t(),
      strided=base[1:3, ::2],
      bfloat16=tensors['bfloat16'].bfloat16(),
      float16=tensors['float16'].half(),
      index=torch.arange(7),
      mask=torch.arange(4) % 2 == 0,
      scalar=torch.tensor(2.5),
      empty=torch.zeros(0, 4),
  )
  model['module.head.weight'] = tensors['head.weight']
  return {
      'model': model,
      'args': argparse.Namespace(lr=0.1, model='vit_tiny'),
      'epoch': 5,
      'optimizer': {'state': {0: {'exp_avg': torch.ones(2)}}, 'param_groups': [{'lr': 0.1}]},
  }


def assert_equal(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> None:
  """The same names in the same order, each of the same dtype, shape and values."""
  assert list(ours) == list(theirs)
  for name, array in theirs.items():
    assert (ours[name].dtype, ours[name].shape) == (array.dtype, array.shape), name
    np.testing.assert_array_equal(ours[name], array, err_msg=name)


def test_a_training_checkpoint_reads_as_its_models_state_dict(tmp_path):
  state_dict, config = torch_files.read(FIXTURE)
  assert_equal(state_dict, expected())
  assert config == {}


def test_shapes_only_reads_the_shapes_and_dtypes():
  shapes, _ = torch_files.read(FIXTURE, shapes_only=True)
  assert {k: (v.shape, v.dtype) for k, v in shapes.items()} == {
      k: (v.shape, v.dtype) for k, v in expected().items()
  }


def _rewritten(tmp_path, change) -> str:
  """torch_saved.pth with each record's bytes passed through `change(name, data)`."""
  path = str(tmp_path / 'changed.pth')
  with zipfile.ZipFile(FIXTURE) as source, zipfile.ZipFile(path, 'w') as target:
    for name in source.namelist():
      target.writestr(name, change(name, source.read(name)))
  return path


def test_a_damaged_file_is_one_line_naming_it(tmp_path):
  truncated = _rewritten(tmp_path, lambda name, data: data[:-4] if '/data/' in name else data)
  with pytest.raises(ValueError, match=r'changed.pth is not a readable PyTorch checkpoint .*holds'):
    torch_files.read(truncated)
  no_pickle = _rewritten(tmp_path, lambda name, data: b'' if name.endswith('data.pkl') else data)
  with pytest.raises(ValueError, match='not a readable PyTorch checkpoint'):
    torch_files.read(no_pickle)
  other_zip = tmp_path / 'other.pt'
  with zipfile.ZipFile(other_zip, 'w') as archive:
    archive.writestr('readme.txt', 'no checkpoint')
  with pytest.raises(ValueError, match='a zip archive but not a PyTorch checkpoint'):
    torch_files.read(str(other_zip))
  big = _rewritten(tmp_path, lambda name, data: b'big' if name.endswith('/byteorder') else data)
  with pytest.raises(ValueError, match='saved on a big-endian machine'):
    torch_files.read(big)


def test_the_legacy_format_without_torch_is_one_line(tmp_path, monkeypatch):
  legacy = tmp_path / 'legacy.pth'
  legacy.write_bytes(pickle.dumps(0x1950A86A20F9469CFC6C))  # torch < 1.6's magic number first.
  monkeypatch.setitem(sys.modules, 'torch', None)  # As where torch is not installed.
  with pytest.raises(
      ValueError, match=r"legacy.pth is in PyTorch's legacy format .*pip install torch"
  ):
    torch_files.read(str(legacy))


class _RunsACommand:

  def __reduce__(self):
    return os.system, ('touch ran_the_checkpoints_code',)


def test_no_code_of_the_file_runs(tmp_path, monkeypatch):
  """A pickle may call any function it names: the reader calls none of the file's."""
  monkeypatch.chdir(tmp_path)

  def with_a_command(name, data):
    if not name.endswith('data.pkl'):
      return data
    buffer = io.BytesIO()
    pickle.Pickler(buffer, protocol=2).dump({'hook': _RunsACommand(), 'model': {}})
    return buffer.getvalue()

  loaded = torch_pickle.load(epath.Path(_rewritten(tmp_path, with_a_command)))
  assert isinstance(loaded['hook'], torch_pickle.StandIn)
  assert loaded['hook'].args == ('touch ran_the_checkpoints_code',)
  assert not os.path.exists('ran_the_checkpoints_code')
