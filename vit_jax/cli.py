"""What the command-line tools share: bad input ends in one `error: ...` line, not a traceback."""
import os
import sys
from typing import Callable, NoReturn

from absl import flags


def fail(message: str) -> NoReturn:
  print(f'error: {message}', file=sys.stderr)
  sys.exit(2)


def flags_parser(usage: str) -> Callable[[list[str]], list[str]]:
  """An absl `flags_parser` that reports a missing or bad flag in one line naming the usage."""

  def parse(argv: list[str]) -> list[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(f'{str(e).splitlines()[0]}: use {usage}')

  return parse


def make_out_dir(out: str) -> None:
  """Creates an --out directory, or raises a ValueError that says so in one line."""
  try:
    os.makedirs(out, exist_ok=True)
  except OSError as e:
    raise ValueError(f'cannot create --out={out!r} ({e.strerror}): pass a directory you can write to'
                     ) from None
