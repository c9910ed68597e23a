"""Paths as users type them: local paths relative to where they typed them, or URLs (gs://...).

Every path a user gives (workdir, init_from, export directories) is resolved once, at the entry
points and where it reaches orbax, which misreads relative paths. URLs are left as they are:
`os.path.abspath('gs://b/run')` would make a local directory `./gs:/b/run` of them.
"""
import os


def is_url(path: str) -> bool:
  return '://' in path


def absolute(path: str) -> str:
  """`path` resolved against the current working directory; a URL unchanged."""
  return path if is_url(path) else os.path.abspath(path)
