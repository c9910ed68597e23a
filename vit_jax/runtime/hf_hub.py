"""Repositories named on the Hugging Face hub (`hf-hub:<repo>[@<revision>]`, timm's prefix): the
files a caller reads, downloaded into the Hugging Face cache (HF_HOME, HF_HUB_CACHE) and read from
there as the local directory they then are. Offline (HF_HUB_OFFLINE=1, or no network) the cached
copy is read; gated repositories take the token of `hf auth login` or HF_TOKEN. Every refusal is one
line.
"""

import functools
from typing import Callable

PREFIX = 'hf-hub:'


def is_hub(path: str) -> bool:
  return path.startswith(PREFIX)


# Setup reads the fields, then the weights (or the splits): one download, one listing.
@functools.cache
def snapshot(given: str, repo_type: str, patterns: Callable[[str, list[str]], list[str]]) -> str:
  """The local snapshot directory of repository `given` ('hf-hub:<repo>[@<revision>]') of
  `repo_type` ('model', 'dataset'), downloaded if needed: the files `patterns(given, listing)`
  selects of the repository's listing (a one-line ValueError where it selects none)."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top  # Its import takes a second.
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  repo, _, revision = given[len(PREFIX) :].partition('@')
  revision = revision or None
  try:
    files = huggingface_hub.list_repo_files(repo, revision=revision, repo_type=repo_type)
  except (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.HFValidationError):
    raise ValueError(
        f'{given!r}: no such {repo_type} repository{" or revision" if revision else ""} on the '
        'Hugging Face hub, or a private one: check the name (hf-hub:<org>/<name>[@<revision>]), '
        'or log in (`hf auth login`, or HF_TOKEN)'
    ) from None
  except errors.GatedRepoError:
    raise ValueError(
        f"{given!r}: a gated repository: accept its terms on the hub's page, then log in "
        '(`hf auth login`, or HF_TOKEN)'
    ) from None
  except Exception as error:  # pylint: disable=broad-except  # Offline or unreachable: the cache.
    try:
      return huggingface_hub.snapshot_download(
          repo, revision=revision, repo_type=repo_type, local_files_only=True
      )
    except errors.LocalEntryNotFoundError:
      reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
      raise ValueError(
          f'{given!r}: the Hugging Face hub cannot be reached ({reason}) and no copy is cached: '
          'connect (or unset HF_HUB_OFFLINE), or download the repository elsewhere and pass its '
          'directory'
      ) from None
  return huggingface_hub.snapshot_download(
      repo, revision=revision, repo_type=repo_type, allow_patterns=patterns(given, files)
  )
