"""The original ViT `.npz` layout of a parameter tree, read and written: float32 arrays under flat
'/'-joined keys (older files put them under an optimizer's or a root's prefix). A BiT's `.npz` is in
the published BiT layout, which `load_npz` converts (bit.py), a big_vision ViT's in its own
(big_vision_layout.py).

Fitting a loaded tree to a model of another resolution or class count is
vit_jax/checkpoints/adapting.py; orbax checkpoints of whole train states are
vit_jax/checkpoints/checkpoint.py.
"""

import zipfile
from typing import Any, BinaryIO

import jax
import ml_dtypes
import numpy as np
from etils import epath
from flax import traverse_util

from vit_jax.checkpoints import big_vision_layout
from vit_jax.models import bit

_NPZ_PREFIXES = (
    'opt/target/',
    'params/',
)  # Older Flax optimizer checkpoints; trees saved with a root.


def load_npz(path: str, shapes_only: bool = False) -> dict[str, Any]:
  """The nested parameter tree of an `.npz` in the original ViT layout (keys joined by '/'), in
  big_vision's (its image tower, converted to the original layout), or in the published BiT layout
  (`resnet/...`, converted to our BiT's tree). `shapes_only`: only each array's header is read, and
  each is a broadcast float32 zero of its shape (no memory: what config.variant='checkpoint' and the
  planner read of a file of gigabytes)."""
  if not epath.Path(path).is_file():
    raise ValueError(
        f'no checkpoint file at {path!r}: download it (e.g. gsutil cp '
        'gs://vit_models/imagenet21k/ViT-B_16.npz .) or fix --config.init_from'
    )
  with epath.Path(path).open('rb') as f:
    if not zipfile.is_zipfile(f):
      raise ValueError(
          f'{path!r} is not an .npz file: pass an .npz checkpoint in the original ViT '
          'layout, or the workdir of a vit_jax run, as --config.init_from'
      )
    f.seek(0)
    if shapes_only:
      flat = _shapes(f)
    else:
      with np.load(f, allow_pickle=False) as npz:
        flat = {key: _float32(npz[key]) for key in npz.files}
  for prefix in _NPZ_PREFIXES:
    if any(key.startswith(prefix) for key in flat):
      # The rest of such a file (e.g. `opt/state/...`) is optimizer state, not parameters.
      flat = {key[len(prefix) :]: value for key, value in flat.items() if key.startswith(prefix)}
      break
  if bit.is_bit_npz(flat):
    return bit.from_bit_npz(flat)
  if big_vision_layout.recognises(flat):
    flat = big_vision_layout.original(flat, path)
  return traverse_util.unflatten_dict(flat, sep='/')


# The readers of the `.npy` header versions NumPy writes for numeric arrays.
_NPY_HEADERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def _shapes(f: BinaryIO) -> dict[str, np.ndarray]:
  """Broadcast float32 zeros of the shapes of an `.npz` file's arrays, from their `.npy` headers
  (another header version's array is read whole)."""
  shapes = {}
  with zipfile.ZipFile(f) as archive:
    for name in archive.namelist():
      with archive.open(name) as member:
        version = np.lib.format.read_magic(member)
        if version in _NPY_HEADERS:
          shape = _NPY_HEADERS[version](member)[0]
        else:
          member.seek(0)
          shape = np.lib.format.read_array(member, allow_pickle=False).shape
      shapes[name.removesuffix('.npy')] = np.broadcast_to(np.zeros((), np.float32), shape)
  return shapes


def _float32(array: np.ndarray) -> np.ndarray:
  """bfloat16 arrays as float32: NumPy writes them (ml_dtypes') as 2-byte voids, as in big_vision's
  `.bf16.npz` files (PaliGemma's)."""
  if array.dtype.kind == 'V' and array.dtype.itemsize == 2:
    return array.view(ml_dtypes.bfloat16).astype(np.float32)
  return array


def save_npz(params: Any, path: str) -> None:
  """Writes `params` as float32 arrays under flat '/'-joined keys: the original ViT `.npz` layout."""
  flat = traverse_util.flatten_dict(jax.device_get(params), sep='/')
  with epath.Path(path).open(
      'wb'
  ) as f:  # A file object: np.savez would append '.npz' to other names.
    np.savez(f, **{key: np.asarray(value, np.float32) for key, value in flat.items()})
