"""PyTorch's checkpoint files read without torch: `torch.save` writes a zip archive (since torch 1.6)
whose `data.pkl` is a pickle of the saved object, each tensor in it a call rebuilding it from a
storage, and each storage a record `data/<key>` of raw bytes. The pickle is read here with no code of
the file run: tensors are rebuilt as NumPy arrays from their storages, and any other object a
training checkpoint holds (its arguments, an optimiser's state) becomes an inert stand-in.
TorchScript archives (`torch.jit.save`, e.g. OpenAI's CLIP `.pt` files) are such pickles of
`__torch__` module objects: their tensors are named by the path of attributes to them."""

import collections
import pickle
import zipfile
from typing import Any

import ml_dtypes
import numpy as np
from etils import epath

# The storage classes a tensor's storage is saved as (torch/storage.py's legacy typed storages), and
# the dtypes `_rebuild_tensor_v3` names; UntypedStorage is bytes.
_STORAGE_DTYPES = {
    'DoubleStorage': np.float64,
    'FloatStorage': np.float32,
    'HalfStorage': np.float16,
    'BFloat16Storage': ml_dtypes.bfloat16,
    'LongStorage': np.int64,
    'IntStorage': np.int32,
    'ShortStorage': np.int16,
    'CharStorage': np.int8,
    'ByteStorage': np.uint8,
    'BoolStorage': np.bool_,
    'ComplexFloatStorage': np.complex64,
    'ComplexDoubleStorage': np.complex128,
    'UntypedStorage': np.uint8,
}
_DTYPES = {
    'float64': np.float64,
    'float32': np.float32,
    'float16': np.float16,
    'bfloat16': ml_dtypes.bfloat16,
    'float8_e4m3fn': ml_dtypes.float8_e4m3fn,
    'float8_e5m2': ml_dtypes.float8_e5m2,
    'int64': np.int64,
    'int32': np.int32,
    'int16': np.int16,
    'int8': np.int8,
    'uint64': np.uint64,
    'uint32': np.uint32,
    'uint16': np.uint16,
    'uint8': np.uint8,
    'bool': np.bool_,
    'complex64': np.complex64,
    'complex128': np.complex128,
}
# What a damaged file (or one that is no checkpoint) raises as it is unpickled.
_UNREADABLE = (
    pickle.UnpicklingError,
    zipfile.BadZipFile,
    ValueError,
    TypeError,
    EOFError,
    LookupError,
    AttributeError,
)
# Built-in types a pickle may construct (sets, slices): harmless, so they are made as they are.
_BUILTINS = {t.__name__: t for t in (set, frozenset, slice, complex)}


class StandIn(dict):
  """An object of a class this reader does not rebuild: its arguments, items and state are kept, and
  none of its code runs (there is none here). A dict, so that pickles of dict subclasses fill it."""

  def __init__(self, *args, **kwargs):  # pylint: disable=super-init-not-called
    self.args, self.kwargs, self.state, self.items_appended = args, kwargs, None, []

  def __setstate__(self, state):
    self.state = state

  def append(self, item):
    self.items_appended.append(item)

  def extend(self, items):
    self.items_appended.extend(items)


class _Storage:
  """A storage record of the archive, read when a tensor first needs its bytes."""

  def __init__(self, archive: zipfile.ZipFile, record: str, dtype: np.dtype, numel: int):
    self.archive, self.record, self.dtype, self.numel = archive, record, dtype, numel
    self._flat = None

  def flat(self, item: np.dtype) -> np.ndarray:
    if self._flat is None:
      data = self.archive.read(self.record)
      if len(data) != self.numel * self.dtype.itemsize:
        raise ValueError(
            f'storage {self.record} holds {len(data)} bytes, not the {self.numel} x '
            f'{self.dtype.itemsize} its tensors say'
        )
      self._flat = np.frombuffer(data, np.uint8)
    return self._flat.view(item)


class _Unpickler(pickle.Unpickler):
  """data.pkl's objects: tensors as NumPy arrays (broadcast zeros of their shapes if `shapes_only`)."""

  def __init__(self, archive: zipfile.ZipFile, prefix: str, shapes_only: bool):
    super().__init__(archive.open(prefix + 'data.pkl'), encoding='utf-8')
    self.archive, self.prefix, self.shapes_only = archive, prefix, shapes_only
    self.storages: dict[str, _Storage] = {}
    self.stand_ins: dict[tuple[str, str], type] = {}

  def persistent_load(self, pid):
    kind, storage_type, key, _, numel = pid
    if (kind.decode() if isinstance(kind, bytes) else kind) != 'storage':
      raise pickle.UnpicklingError(f'a persistent object of kind {kind!r}, not a storage')
    if key not in self.storages:
      if not isinstance(storage_type, np.dtype):
        raise pickle.UnpicklingError(f'a storage of {storage_type!r}, which holds no tensor dtype')
      record = f'{self.prefix}data/{key}'
      self.storages[key] = _Storage(self.archive, record, storage_type, numel)
    return self.storages[key]

  def find_class(self, module, name):
    if module == 'collections' and name == 'OrderedDict':
      return collections.OrderedDict
    if module == 'builtins' and name in _BUILTINS:
      return _BUILTINS[name]
    if module in ('torch', 'torch.storage') and name in _STORAGE_DTYPES:
      return np.dtype(_STORAGE_DTYPES[name])
    if module == 'torch' and name in _DTYPES:
      return np.dtype(_DTYPES[name])
    rebuild = {
        ('torch._utils', '_rebuild_tensor_v2'): self._rebuild_tensor_v2,
        ('torch._utils', '_rebuild_tensor_v3'): self._rebuild_tensor_v3,
        ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
        ('torch._utils', '_rebuild_parameter_with_state'): _rebuild_parameter,
        ('torch._tensor', '_rebuild_from_type_v2'): _rebuild_from_type,
    }.get((module, name))
    if rebuild:
      return rebuild
    if (module, name) not in self.stand_ins:
      self.stand_ins[module, name] = type(name, (StandIn,), {'__module__': module})
    return self.stand_ins[module, name]

  def _rebuild_tensor_v2(self, storage, offset, size, stride, *_):
    return self._tensor(storage, storage.dtype, offset, size, stride)

  def _rebuild_tensor_v3(self, storage, offset, size, stride, requires_grad, hooks, dtype, *_):
    del requires_grad, hooks
    return self._tensor(storage, np.dtype(dtype), offset, size, stride)

  def _tensor(self, storage: _Storage, dtype: np.dtype, offset, size, stride) -> np.ndarray:
    numel = storage.numel * storage.dtype.itemsize // dtype.itemsize
    last = offset + sum((n - 1) * s for n, s in zip(size, stride))
    if min(size, default=1) > 0 and not (
        0 <= offset <= last < numel and min(stride, default=0) >= 0
    ):
      raise pickle.UnpicklingError(
          f'a tensor of shape {tuple(size)} at offset {offset} with strides {tuple(stride)} reaches '
          f'past its storage {storage.record} of {numel} elements'
      )
    if self.shapes_only:
      return np.broadcast_to(np.zeros((), dtype), tuple(size))
    # As opaque items: NumPy's array interface, which as_strided goes through, loses some of
    # ml_dtypes' types (float8_e5m2 comes back as '<f1').
    flat = storage.flat(np.dtype((np.void, dtype.itemsize)))
    view = np.lib.stride_tricks.as_strided(
        flat[offset:] if min(size, default=1) > 0 else flat[:0],
        shape=tuple(size),
        strides=tuple(s * dtype.itemsize for s in stride),
        writeable=False,
    )
    return (view if view.flags.c_contiguous else view.copy()).view(dtype)


def _rebuild_parameter(data, *_):
  return data


def _rebuild_from_type(rebuild, new_type, args, state):
  del new_type, state  # A tensor subclass's type and attributes: the array is what is kept.
  return rebuild(*args)


def _prefix(names: list[str], path: epath.Path) -> str:
  """The folder in the archive holding data.pkl (the file's name when it was saved)."""
  pickles = [name for name in names if name.count('/') == 1 and name.endswith('/data.pkl')]
  if len(pickles) != 1:
    raise ValueError(f'{path} is a zip archive but not a PyTorch checkpoint (no <name>/data.pkl)')
  return pickles[0].removesuffix('data.pkl')


def is_torch_zip(path: epath.Path) -> bool:
  with path.open('rb') as f:
    return zipfile.is_zipfile(f)


def is_torchscript(path: str) -> bool:
  """Whether `path` is a TorchScript archive (its modules' code beside their pickle)."""
  file = epath.Path(path)
  if not (file.is_file() and is_torch_zip(file)):
    return False
  with file.open('rb') as f, zipfile.ZipFile(f) as archive:
    return any(name.split('/')[1:2] == ['code'] for name in archive.namelist())


def load(path: epath.Path, shapes_only: bool = False) -> Any:
  """The object `torch.save` (or `torch.jit.save`) wrote to `path`, its tensors NumPy arrays."""
  with path.open('rb') as f, zipfile.ZipFile(f) as archive:
    prefix = _prefix(archive.namelist(), path)
    if (
        prefix + 'byteorder' in archive.namelist()
        and archive.read(prefix + 'byteorder') != b'little'
    ):
      raise ValueError(
          f'{path} was saved on a big-endian machine, which vit_jax does not read: load it with '
          'torch and save it again (torch.save or as .safetensors)'
      )
    try:
      return _Unpickler(archive, prefix, shapes_only).load()
    except _UNREADABLE as e:
      raise ValueError(
          f'{path} is not a readable PyTorch checkpoint ({type(e).__name__}: '
          f'{str(e).splitlines()[0] if str(e) else ""}): fix --config.init_from'
      ) from None


def state_dict(loaded: Any) -> dict[str, np.ndarray]:
  """The weights of what `load` read, by name: a state dict (in a training checkpoint, under its
  'state_dict' or 'model'; DataParallel's `module.` prefix dropped), or a TorchScript module's
  tensors by their attributes' path (as its `state_dict()` names them)."""
  if isinstance(loaded, StandIn) and type(loaded).__module__.startswith('__torch__'):
    return dict(_tensors(loaded.state, ''))
  for key in ('state_dict', 'model'):  # Training checkpoints wrap the weights.
    if isinstance(loaded, dict) and isinstance(loaded.get(key), dict):
      loaded = loaded[key]
  if not isinstance(loaded, dict):
    return {}
  return {str(k).removeprefix('module.'): v for k, v in loaded.items() if isinstance(v, np.ndarray)}


def _tensors(tree: Any, name: str):
  """(name, array) of every array in a TorchScript module's attributes, its submodules' by their
  path, depth first."""
  if isinstance(tree, np.ndarray):
    yield name, tree
  elif isinstance(tree, StandIn):
    yield from _tensors(tree.state, name)
  elif isinstance(tree, dict):
    for key, value in tree.items():
      yield from _tensors(value, f'{name}.{key}' if name else str(key))
