"""What the command-line tools share: bad input ends in one `error: ...` line, not a traceback."""
import sys
from typing import Callable, NoReturn

from absl import flags

from vit_jax import paths


def fail(message: str, status: int = 2) -> NoReturn:
  """One `error: ...` line on stderr and exit: status 2 for bad input, 1 for a run that failed."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


def flags_parser(usage: str) -> Callable[[list[str]], list[str]]:
  """An absl `flags_parser` that reports a missing or bad flag in one line naming the usage."""

  def parse(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(f'{str(e).splitlines()[0]}: use {usage}')

  return parse


def make_out_dir(out: str, timeout_s: float = 60.0) -> None:
  """Creates an --out directory (local or gs://), or raises a ValueError that says why in one line."""
  paths.check_writable(out, timeout_s, flag='--out')
