"""Checkpoints named on the Hugging Face hub: `config.init_from=hf-hub:<repo>[@<revision>]` (timm's
prefix; config.distill.teacher too) is downloaded into the Hugging Face cache (HF_HOME, HF_HUB_CACHE)
and read from there as the local directory it then is: only the weights vit_jax reads, in the order
torch_files.py prefers them (a laion repository's transformers weights, not OpenCLIP's beside them),
and the JSON files beside them. Offline (HF_HUB_OFFLINE=1, or no network) the cached copy is read;
gated repositories take the token of `hf auth login` or HF_TOKEN.
"""

import functools

from vit_jax.checkpoints import torch_files
from vit_jax.runtime import paths

PREFIX = 'hf-hub:'
# The files beside the weights that the layouts read.
_CONFIGS = ('config.json', 'preprocessor_config.json', 'open_clip_config.json')


def local(path: str) -> str:
  """The local path of a `config.init_from`: a hub repository's cached snapshot directory
  (downloaded if needed), else `path` resolved (paths.absolute)."""
  return _snapshot(path) if path.startswith(PREFIX) else paths.absolute(path)


def _weights(files: list[str]) -> list[str]:
  """The patterns of the first of torch_files' directory weights the repository holds (a sharded
  checkpoint's index and its shards, named as transformers names them: model-00001-of-00002...)."""
  for name in torch_files.DIRECTORY_WEIGHTS:
    if name in files and name.endswith('.index.json'):
      stem, _, suffix = name.removesuffix('.index.json').rpartition('.')
      return [name, f'{stem}-*.{suffix}']
    if name in files:
      return [name]
  return []


@functools.cache  # Setup reads the fields, then the weights: one download, one listing.
def _snapshot(given: str) -> str:
  import huggingface_hub  # pylint: disable=g-import-not-at-top  # Its import takes a second.
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  repo, _, revision = given[len(PREFIX) :].partition('@')
  revision = revision or None
  try:
    files = huggingface_hub.list_repo_files(repo, revision=revision)
  except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.HFValidationError):
    raise ValueError(
        f'{given!r}: no such repository{" or revision" if revision else ""} on the Hugging Face '
        'hub, or a private one: check the name (hf-hub:<org>/<name>[@<revision>]), or log in '
        '(`hf auth login`, or HF_TOKEN)'
    ) from None
  except errors.GatedRepoError:
    raise ValueError(
        f"{given!r}: a gated repository: accept its terms on the hub's page, then log in "
        '(`hf auth login`, or HF_TOKEN)'
    ) from None
  except Exception as error:  # pylint: disable=broad-except  # Offline or unreachable: the cache.
    try:
      return huggingface_hub.snapshot_download(repo, revision=revision, local_files_only=True)
    except errors.LocalEntryNotFoundError:
      reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
      raise ValueError(
          f'{given!r}: the Hugging Face hub cannot be reached ({reason}) and no copy is cached: '
          'connect (or unset HF_HUB_OFFLINE), or download the repository elsewhere and pass its '
          'directory'
      ) from None
  weights = _weights(files)
  if not weights:
    readable = ', '.join(torch_files.DIRECTORY_WEIGHTS)
    raise ValueError(
        f'{given!r} holds none of the weights vit_jax reads from a repository ({readable}): '
        'download the file you want and pass its path'
    )
  return huggingface_hub.snapshot_download(
      repo, revision=revision, allow_patterns=[*weights, *_CONFIGS]
  )
