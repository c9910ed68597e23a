"""Checkpoints named on the Hugging Face hub: `config.init_from=hf-hub:<repo>[@<revision>]` (timm's
prefix; config.distill.teacher too) is downloaded into the Hugging Face cache (runtime/hf_hub.py) and
read from there as the local directory it then is: only the weights vit_jax reads, in the order
torch_files.py prefers them (a laion repository's transformers weights, not OpenCLIP's beside them),
and the JSON files beside them.
"""

from vit_jax.checkpoints import torch_files
from vit_jax.runtime import hf_hub
from vit_jax.runtime import paths

PREFIX = hf_hub.PREFIX
# The files beside the weights that the layouts read.
_CONFIGS = ('config.json', 'preprocessor_config.json', 'open_clip_config.json')


def local(path: str) -> str:
  """The local path of a `config.init_from`: a hub repository's cached snapshot directory
  (downloaded if needed), else `path` resolved (paths.absolute)."""
  return _snapshot(path) if path.startswith(PREFIX) else paths.absolute(path)


# peft's LoRA adapters: a repository of them holds these (their base is another repository).
_ADAPTERS = (torch_files.ADAPTER_CONFIG, 'adapter_model.safetensors', 'adapter_model.bin')


def _weights(files: list[str]) -> list[str]:
  """The patterns of the first of torch_files' directory weights the repository holds (a sharded
  checkpoint's index and its shards, named as transformers names them: model-00001-of-00002...),
  or of peft's adapters."""
  if torch_files.ADAPTER_CONFIG in files:
    return [name for name in _ADAPTERS if name in files][:2]
  for name in torch_files.DIRECTORY_WEIGHTS:
    if name in files and name.endswith('.index.json'):
      stem, _, suffix = name.removesuffix('.index.json').rpartition('.')
      return [name, f'{stem}-*.{suffix}']
    if name in files:
      return [name]
  return []


def _files(given: str, files: list[str]) -> list[str]:
  weights = _weights(files)
  if not weights:
    readable = ', '.join(torch_files.DIRECTORY_WEIGHTS)
    raise ValueError(
        f'{given!r} holds none of the weights vit_jax reads from a repository ({readable}): '
        'download the file you want and pass its path'
    )
  return [*weights, *_CONFIGS]


def _snapshot(given: str) -> str:
  return hf_hub.snapshot(given, 'model', _files)
