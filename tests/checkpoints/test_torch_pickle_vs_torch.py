"""vit_jax's reader of PyTorch's files (checkpoints/torch_pickle.py) against torch.load: files
torch.save writes of tensors of every dtype a checkpoint holds, views into shared storages, training
checkpoints, TorchScript modules (torch.jit.save) and torch's legacy format."""

import collections

import ml_dtypes
import numpy as np
import pytest
import torch
from etils import epath

import test_torch_pickle
from vit_jax.checkpoints import torch_files, torch_pickle


def _numpy(tensor: torch.Tensor) -> np.ndarray:
  """`tensor` as NumPy holds it, bit for bit (NumPy has no bfloat16 nor float8: ml_dtypes')."""
  tensor = tensor.detach()
  kinds = {
      torch.bfloat16: ml_dtypes.bfloat16,
      torch.float8_e4m3fn: ml_dtypes.float8_e4m3fn,
      torch.float8_e5m2: ml_dtypes.float8_e5m2,
  }
  if tensor.dtype in kinds:
    bits = torch.int16 if tensor.dtype == torch.bfloat16 else torch.int8
    return tensor.contiguous().view(bits).numpy().view(kinds[tensor.dtype])
  return tensor.numpy()


def _state_dict(legacy: bool) -> collections.OrderedDict:
  """Random tensors of each dtype (torch's legacy format: but float8's), contiguous or not, sharing
  storages or not."""
  generator = torch.Generator().manual_seed(0)
  shared = torch.randn(6, 10, generator=generator)
  tensors = collections.OrderedDict(
      parameter=torch.nn.Parameter(torch.randn(5, 3, generator=generator)),
      shared=shared,
      transposed=shared.t(),
      rows=shared[2:5],
      columns=shared[1:, 3:8:2],
      expanded=shared[0].expand(3, 10),
      channels_last=torch.randn(2, 3, 4, 5, generator=generator).to(
          memory_format=torch.channels_last
      ),
      empty=torch.zeros(3, 0),
      scalar=torch.tensor(-1.25),
      buffer=torch.arange(12).reshape(3, 4),
  )
  floats = [torch.float64, torch.float16, torch.bfloat16, torch.complex64]
  for dtype in floats + ([] if legacy else [torch.float8_e4m3fn, torch.float8_e5m2]):
    tensors[str(dtype).removeprefix('torch.')] = torch.randn(4, 3, generator=generator).to(dtype)
  for dtype in (torch.int8, torch.uint8, torch.int16, torch.int32, torch.bool):
    tensors[str(dtype).removeprefix('torch.')] = torch.randint(
        0, 2 if dtype == torch.bool else 100, (7,), generator=generator
    ).to(dtype)
  return tensors


@pytest.mark.parametrize('legacy', [False, True], ids=['zip', 'legacy_with_torch'])
def test_torch_saves_state_dicts_read_as_torch_loads_them(tmp_path, legacy):
  tensors = _state_dict(legacy)
  path = tmp_path / 'weights.pth'
  torch.save(tensors, path, _use_new_zipfile_serialization=not legacy)
  ours, _ = torch_files.read(str(path))
  theirs = {k: _numpy(v) for k, v in torch.load(path, weights_only=True).items()}
  if legacy:  # Read by torch, as before (bfloat16 as float32).
    theirs['bfloat16'] = theirs['bfloat16'].astype(np.float32)
  test_torch_pickle.assert_equal(ours, theirs)
  if not legacy:
    shapes, _ = torch_files.read(str(path), shapes_only=True)
    assert {k: (v.shape, v.dtype) for k, v in shapes.items()} == {
        k: (v.shape, v.dtype) for k, v in theirs.items()
    }


def test_the_fixture_is_what_torch_saves(tmp_path):
  """tests/checkpoints/torch_saved.pth (read by the fast tier without torch) is torch_pickle's
  `saved()` as torch.save writes it, and torch.load reads `expected()` from it."""
  loaded = torch.load(test_torch_pickle.FIXTURE, weights_only=False)
  model = {k.removeprefix('module.'): _numpy(v) for k, v in loaded['model'].items()}
  test_torch_pickle.assert_equal(model, test_torch_pickle.expected())
  torch.save(test_torch_pickle.saved(torch), tmp_path / 'again.pth')
  test_torch_pickle.assert_equal(
      torch_files.read(str(tmp_path / 'again.pth'))[0],
      torch_files.read(test_torch_pickle.FIXTURE)[0],
  )


class _Block(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.norm = torch.nn.LayerNorm(8)
    self.mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))

  def forward(self, x):
    return x + self.mlp(self.norm(x))


class _Model(torch.nn.Module):

  def __init__(self):
    super().__init__()
    self.embed = torch.nn.Parameter(torch.randn(4, 8))
    self.blocks = torch.nn.ModuleList([_Block(), _Block()])
    self.register_buffer('steps', torch.tensor(3))
    self.head = torch.nn.Linear(8, 2).half()

  def forward(self, x):
    for block in self.blocks:
      x = block(x + self.embed)
    return self.head(x.half())


def test_a_torchscript_modules_tensors_read_as_its_state_dict(tmp_path):
  torch.manual_seed(0)
  traced = torch.jit.trace(_Model().eval(), torch.zeros(4, 8))
  torch.jit.save(traced, tmp_path / 'model.pt')
  assert torch_pickle.is_torchscript(str(tmp_path / 'model.pt'))
  ours, _ = torch_files.read(str(tmp_path / 'model.pt'))
  theirs = {k: _numpy(v) for k, v in torch.jit.load(tmp_path / 'model.pt').state_dict().items()}
  assert sorted(ours) == sorted(theirs)
  test_torch_pickle.assert_equal({k: ours[k] for k in theirs}, theirs)
  torch.save(_Model().state_dict(), tmp_path / 'state_dict.pt')
  assert not torch_pickle.is_torchscript(str(tmp_path / 'state_dict.pt'))


def test_weights_under_state_dict_read_without_dataparallels_module_prefix(tmp_path):
  torch.save({'state_dict': {'module.w': torch.ones(2)}}, tmp_path / 'w.bin')
  state_dict = torch_pickle.state_dict(torch_pickle.load(epath.Path(tmp_path / 'w.bin')))
  test_torch_pickle.assert_equal(state_dict, {'w': np.ones(2, np.float32)})
