"""PyTorch-side checkpoint files as flat `{name: numpy array}` state dicts: `.safetensors` read and
written here (no torch needed; bfloat16 too), `.pth` / `.pt` / `.bin` files of torch.save (and
TorchScript's) read without torch (torch_pickle.py; torch's legacy format with torch), sharded model
directories, OpenCLIP's model directories, and the config.json beside them."""

import json
from typing import Any

import ml_dtypes
import numpy as np
from etils import epath

from vit_jax.checkpoints import torch_pickle

StateDict = dict[str, np.ndarray]
SAFETENSORS = 'model.safetensors'
_TORCH_SUFFIXES = ('.pth', '.pt', '.bin', '.pth.tar')  # The last: timm train.py's checkpoints.
ADAPTER_CONFIG = 'adapter_config.json'  # peft's LoRA adapters (peft_adapters.py).
# The weights a model directory may hold, in the order `read` prefers them: timm's or transformers'
# (sharded: its index), then OpenCLIP's (open_clip's constants.py; laion's directories hold
# transformers' beside them), its safetensors first, then transformers' pickled weights of older
# repositories (its WEIGHTS_NAME and WEIGHTS_INDEX_NAME).
DIRECTORY_WEIGHTS = (
    SAFETENSORS,
    f'{SAFETENSORS}.index.json',
    'open_clip_model.safetensors',
    'open_clip_pytorch_model.bin',
    'pytorch_model.bin',
    'pytorch_model.bin.index.json',
)
_SAFETENSORS_DTYPES = {
    'F64': np.float64,
    'F32': np.float32,
    'F16': np.float16,
    'BF16': ml_dtypes.bfloat16,
    'I64': np.int64,
    'I32': np.int32,
    'I16': np.int16,
    'I8': np.int8,
    'U8': np.uint8,
    'BOOL': np.bool_,
}
_SAFETENSORS_NAMES = {np.dtype(dtype): name for name, dtype in _SAFETENSORS_DTYPES.items()}


def is_state_dict_path(path: str) -> bool:
  """Whether `path` names what `read` reads: a .safetensors / .pth / .pt / .bin file, or a directory
  holding a model.safetensors (a Hugging Face or timm model directory) or OpenCLIP's weights; or
  peft's LoRA adapters over such a checkpoint (peft_adapters.py reads them)."""
  if path.endswith(('.safetensors', *_TORCH_SUFFIXES)):
    return True
  names = (*DIRECTORY_WEIGHTS, ADAPTER_CONFIG)
  return any((epath.Path(path) / name).is_file() for name in names)


def read_safetensors(path: epath.Path, shapes_only: bool = False) -> StateDict:
  """The tensors of a .safetensors file: an 8-byte little-endian header size, a JSON header of
  {name: {dtype, shape, data_offsets}}, then the data. Read here rather than with the safetensors
  package, whose NumPy API has no bfloat16, the dtype of many published checkpoints. `shapes_only`:
  only the header is read, and each tensor is a broadcast zero of its shape (no memory)."""
  try:
    with path.open('rb') as f:
      size = int.from_bytes(f.read(8), 'little')
      header = json.loads(f.read(size))
      header.pop('__metadata__', None)
      dtypes = {name: _SAFETENSORS_DTYPES[t['dtype']] for name, t in header.items()}
      if shapes_only:
        return {
            name: np.broadcast_to(np.zeros((), dtypes[name]), t['shape'])
            for name, t in header.items()
        }
      body = memoryview(f.read())
    return {
        name: np.frombuffer(body[slice(*t['data_offsets'])], dtypes[name]).reshape(t['shape'])
        for name, t in header.items()
    }
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    raise ValueError(
        f'{path} is not a readable safetensors file ({type(e).__name__}: '
        f'{str(e).splitlines()[0] if str(e) else ""}): fix --config.init_from'
    ) from None


def write_safetensors(tensors: StateDict, path: str) -> None:
  """`tensors` as a .safetensors file (the layout `read_safetensors` reads), data 8-byte aligned."""
  header, offset = {}, 0
  for name, array in tensors.items():
    header[name] = {
        'dtype': _SAFETENSORS_NAMES[array.dtype],
        'shape': list(array.shape),
        'data_offsets': [offset, offset + array.nbytes],
    }
    offset += array.nbytes
  encoded = json.dumps(header, separators=(',', ':')).encode()
  encoded += b' ' * (-len(encoded) % 8)
  with epath.Path(path).open('wb') as f:
    f.write(len(encoded).to_bytes(8, 'little') + encoded)
    for array in tensors.values():
      f.write(np.ascontiguousarray(array).tobytes())


def _read_torch(path: epath.Path, shapes_only: bool = False) -> StateDict:
  if torch_pickle.is_torch_zip(path):
    return torch_pickle.state_dict(torch_pickle.load(path, shapes_only))
  try:  # The format of torch before 1.6 (and of `_use_new_zipfile_serialization=False`).
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ValueError(
        f"{path} is in PyTorch's legacy format (torch < 1.6), which vit_jax reads with torch: "
        'pip install torch, or save it again with torch.save or as .safetensors'
    ) from None

  def numpy(tree):
    if isinstance(tree, torch.Tensor):
      tree = tree.detach()
      return (tree.float() if tree.dtype == torch.bfloat16 else tree).numpy()
    return {k: numpy(v) for k, v in tree.items()} if isinstance(tree, dict) else tree

  with path.open('rb') as f:
    return torch_pickle.state_dict(numpy(torch.load(f, map_location='cpu', weights_only=True)))


def read(path: str, shapes_only: bool = False) -> tuple[StateDict, dict[str, Any]]:
  """The state dict at `path` (see `is_state_dict_path`; a sharded checkpoint's index too) and the
  config.json beside it, if any. `shapes_only`: the tensors are broadcast zeros of their shapes,
  read from a .safetensors file's header alone (from a PyTorch file's pickle)."""
  p = epath.Path(path)
  if path.endswith(('.safetensors', *_TORCH_SUFFIXES)):
    files = [p]
  else:
    file = next((p / n for n in DIRECTORY_WEIGHTS if (p / n).is_file()), p / SAFETENSORS)
    if file.name.endswith('.index.json'):
      shards = json.loads(file.read_text())['weight_map'].values()
      files = [p / name for name in sorted(set(shards))]
    else:
      files = [file]
  for file in files:
    if not file.is_file():
      raise ValueError(f'no checkpoint file at {str(file)!r}: fix --config.init_from')
  state_dict = {}
  for file in files:
    read_file = read_safetensors if file.suffix == '.safetensors' else _read_torch
    state_dict.update(read_file(file, shapes_only))
  return state_dict, beside(path, 'config.json')


def beside(path: str, name: str) -> dict[str, Any]:
  """The JSON file `name` beside the checkpoint at `path` (in it, for a model directory), or {}."""
  p = epath.Path(path)
  file = (p if p.is_dir() else p.parent) / name
  return json.loads(file.read_text()) if file.is_file() else {}
