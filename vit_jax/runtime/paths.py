"""Paths as users type them: local paths relative to where they typed them, or URLs (gs://...).

Every path a user gives (workdir, init_from, export directories) is resolved once, at the entry
points and where it reaches orbax, which misreads relative paths. URLs are left as they are:
`os.path.abspath('gs://b/run')` would make a local directory `./gs:/b/run` of them. Files are read and
written through `etils.epath` (as orbax does), so a gs:// path works wherever a local one does.

A remote file system that does not answer (no network, no credentials, a firewalled bucket) would
hang or end in a traceback from deep inside TensorFlow's GCS client; `check_reachable` and
`check_writable` turn that into one line, within a time limit.
"""

import os
import threading
import uuid
from typing import Callable

from etils import epath

_CREDENTIALS_HINT = (
    'check the path, the network and the credentials (e.g. `gcloud auth '
    'application-default login`)'
)


def is_url(path: str) -> bool:
  return '://' in path


def absolute(path: str) -> str:
  """`path` resolved against the current working directory, with a leading ~ as the shell's (which
  leaves `--flag=~/x` as it is); a URL unchanged."""
  return path if is_url(path) else os.path.abspath(os.path.expanduser(path))


def user_cache(*parts: str) -> str:
  """A folder of vit_jax's own under the user's cache, $XDG_CACHE_HOME (~/.cache by default)."""
  home = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(home, 'vit_jax', *parts)


def _first_line(error: BaseException) -> str:
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def _within(seconds: float, action: Callable[[], object]) -> tuple[bool, BaseException | None]:
  """(whether `action` finished within `seconds`, the exception it raised if any).

  A daemon thread: an action stuck in a network call cannot keep the process from exiting.
  """
  outcome: list[BaseException | None] = []

  def run():
    try:
      action()
      outcome.append(None)
    except Exception as e:  # pylint: disable=broad-except  # Reported in one line by the caller.
      outcome.append(e)

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  return bool(outcome), (outcome[0] if outcome else None)


def check_reachable(path: str, timeout_s: float, what: str) -> None:
  """Raises a one-line ValueError unless `path`'s file system answers within `timeout_s` seconds."""
  finished, error = _within(timeout_s, lambda: epath.Path(path).exists())
  if not finished:
    raise ValueError(
        f'{what} {path!r} did not answer within {timeout_s:g} s: {_CREDENTIALS_HINT}, or '
        'raise config.storage_timeout_s'
    )
  if error is not None:
    raise ValueError(f'{what} {path!r} cannot be read ({_first_line(error)}): {_CREDENTIALS_HINT}')


def check_writable(directory: str, timeout_s: float, flag: str = '--workdir') -> None:
  """Creates `directory` (given as `flag`) and writes and deletes a file in it within `timeout_s`
  seconds, or raises a one-line ValueError."""

  def probe():
    path = epath.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    probe_file = path / f'.write_probe_{uuid.uuid4().hex}'
    probe_file.write_text('')
    probe_file.unlink()

  finished, error = _within(timeout_s, probe)
  if not finished:
    raise ValueError(
        f'{flag}={directory!r} did not answer within {timeout_s:g} s: '
        f'{_CREDENTIALS_HINT}, or raise config.storage_timeout_s'
    )
  if error is not None:
    reason = error.strerror if isinstance(error, OSError) and error.strerror else _first_line(error)
    if isinstance(error, FileExistsError) or (not is_url(directory) and os.path.isfile(directory)):
      reason = 'it is a file, not a directory'  # mkdir's "File exists" would not say which.
    raise ValueError(
        f'{flag}={directory!r} is not writable ({reason}): pass {flag}=DIR with a '
        f'directory you can write to{"; " + _CREDENTIALS_HINT if is_url(directory) else ""}'
    )
