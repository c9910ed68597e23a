"""One run at a time in a workdir: two runs writing one workdir's checkpoints and curves (a command
started twice, a sweep launched again over its runs) would save over each other's steps. Process 0
holds an advisory lock (flock) on a file in the workdir while the run trains; the kernel drops it
when the process ends, however it ends (a SIGKILL, a node gone), so no stale lock outlives a run.

Cloud storage (gs://...) has no locks, nor have some cluster file systems (Lustre mounted without
`flock`): there the workdir is not locked.
"""

import contextlib
import errno
import fcntl
import os
import socket
import time
from typing import Iterator

from absl import logging

from vit_jax.runtime import hosts, paths, workdir_files

# What a file system without locks answers: the run goes on unlocked.
_NO_LOCKS = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class InUse(Exception):
  """Another run holds the workdir's lock."""


def _take(workdir: str) -> tuple[int | None, str]:
  """The locked file's descriptor (None where nothing is locked), or why the lock was refused."""
  if paths.is_url(workdir):
    return None, ''
  path = os.path.join(workdir, workdir_files.LOCK)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    holder = os.read(fd, 1000).decode(errors='replace').strip()
    os.close(fd)
    if e.errno in _NO_LOCKS:
      logging.debug('--workdir=%s is not locked: its file system has no locks (%s)', workdir, e)
      return None, ''
    return None, (
        f'--workdir={workdir} is in use by another run ({holder or "its lock is held"}): wait for '
        'it to end or stop it, or pass another --workdir'
    )
  os.ftruncate(fd, 0)
  when = time.strftime('%Y-%m-%d %H:%M:%S %Z')
  os.write(fd, f'process {os.getpid()} on {socket.gethostname()}, since {when}\n'.encode())
  return fd, ''


@contextlib.contextmanager
def held(workdir: str) -> Iterator[None]:
  """The run's lock on `workdir`, taken by process 0; raises InUse on every process where another
  run holds it."""
  fd, refusal = _take(workdir) if hosts.index() == 0 else (None, '')
  refusal = hosts.gathered(refusal.encode)[0].decode()  # Process 0's answer, for all.
  if refusal:
    raise InUse(refusal)
  try:
    yield
  finally:
    if fd is not None:
      os.close(fd)  # The file stays: removing it could let two runs lock two files of one name.
