"""What the command-line tools share: bad input ends in one `error: ...` line, not a traceback, and a
finished command ends its process without the interpreter's teardown (`run`)."""

import atexit
import contextlib
import gc
import os
import re
import signal
import sys
import threading
import traceback
from typing import Any, Callable, Iterator, NoReturn, Sequence

from absl import app, flags
from etils import epath

from vit_jax.runtime import paths
from vit_jax.runtime import startup


def fail(message: str, status: int = 2) -> NoReturn:
  """One `error: ...` line on stderr and exit: status 2 for bad input, 1 for a run that failed."""
  print(f'error: {message}', file=sys.stderr)
  sys.exit(status)


# absl's help flags: they print the usage and exit with status 1, before main.
_HELP_FLAGS = ('help', 'helpshort', 'helpfull', 'helpxml', '?')


def asks_for_help(argv: Sequence[str]) -> bool:
  """Whether a command line (argv[0] the program) asks for the usage: --help, -?, --helpfull..."""
  for arg in argv[1:]:
    if arg == '--':
      return False
    if arg.startswith('-') and arg.lstrip('-').split('=', 1)[0] in _HELP_FLAGS:
      return True
  return False


def help_exits_0(error: SystemExit, argv: Sequence[str]) -> None:
  """absl's --help exits with status 1, as for an error; the usage asked for is a success."""
  if error.code == 1 and asks_for_help(argv):
    sys.exit(0)


def define_step_flag(of: str = '') -> None:
  """--step, the checkpoint of a run a tool reads (saved_state.find_checkpoint takes it as given)."""
  flags.DEFINE_string(
      'step',
      None,
      f'Checkpoint step{of}: a number, or best (the parameters config.best_checkpoint kept); '
      'default: the latest.',
  )
  flags.register_validator(
      'step',
      lambda step: step is None or step == 'best' or step.isdigit(),
      message='pass a checkpoint step (a number) or best',
  )


def define_size_flags(of: str) -> None:
  """--image_size and --patch_size: the resolution and patch size a tool reads a run's model at
  (run_dir.at_size; None: the run's)."""
  for name, what in (('image_size', 'image size'), ('patch_size', "patch size (a ViT's)")):
    flags.DEFINE_integer(name, None, f"{of}'s {what}; default: the run's.")
    flags.register_validator(
        name,
        lambda size: size is None or size >= 1,
        message="must be a positive number of pixels, or left out: the run's",
    )


def flag_error(error: flags.Error) -> str:
  """absl's error for a flag, in words: a required flag left out is '--NAME is required' (absl says
  'flag --NAME=None: Flag --NAME must have a value other than None.')."""
  first = str(error).strip().splitlines()[0]
  missing = re.search(r'Flag (--\w+) must have a value other than None', first)
  return f'{missing[1]} is required' if missing else first


# The flags that name a directory a command reads or writes: given empty (`--workdir=$DIR` with DIR
# unset) they would name the current directory, which a run or an export would then write into.
_DIRECTORY_FLAGS = ('workdir', 'out', 'export')


def check_directory_flags() -> None:
  """A one-line failure for a directory flag given as an empty string."""
  for name in _DIRECTORY_FLAGS:
    value = flags.FLAGS[name].value if name in flags.FLAGS else None
    if isinstance(value, str) and not value.strip():
      fail(
          f'--{name} is empty (an unset shell variable?), which would be the current directory: '
          f'pass the directory, --{name}=DIR'
      )


def flags_parser(usage: str) -> Callable[[list[str]], list[str]]:
  """An absl `flags_parser` that reports a missing or bad flag in one line naming the usage, and an
  empty directory flag in one line (`check_directory_flags`)."""

  def parse(argv: list[str]) -> list[str]:
    try:
      parsed = flags.FLAGS(argv)
      check_directory_flags()
      return parsed
    except flags.Error as e:
      fail(f'{flag_error(e)}: use {usage}')
    except SystemExit as e:
      help_exits_0(e, argv)
      raise

  return parse


def make_out_dir(out: str, timeout_s: float = 60.0) -> None:
  """Creates an --out directory (local or gs://), or raises a ValueError that says why in one line."""
  paths.check_writable(out, timeout_s, flag='--out')


@contextlib.contextmanager
def out_dir(out: str | None) -> Iterator[None]:
  """--out made (and found writable) before the block, so that a long command fails at once where
  it cannot write; removed again where the block raises a ValueError (bad input) and leaves the
  directory this made empty: bad input leaves nothing behind."""
  made = out is not None and not epath.Path(out).exists()
  if out is not None:
    make_out_dir(out)
  try:
    yield
  except ValueError:
    if made and not any(epath.Path(out).iterdir()):
      epath.Path(out).rmdir()
    raise


def run(
    main: Callable[[list[str]], Any], flags_parser: Callable[[list[str]], list[str]]
) -> NoReturn:
  """absl's `app.run(main)`, then the exit without the interpreter's teardown.

  Tearing down the modules and libraries a command loaded (TensorFlow, XLA's CPU client and their
  thread pools) takes ~2 s after a run has finished: 13% of a small run's 15 s. So once `main` has
  exited, this does what that exit must do (waits for the threads that keep a process alive, runs the
  atexit handlers: jax.distributed's shutdown, logging's flush) and ends the process with its status.
  A command that failed (a status other than 0) waits for its threads FAILED_EXIT_GRACE_S at most: a
  thread of a failed operation may wait for ever (orbax's, for the signal of a save that could not
  start). An unexpected exception prints its traceback and ends the same way with status 1, so a
  crash cannot hang the process at exit on a thread that waits for the failed run (on a pod, holding
  every host).
  """
  if signal.getsignal(signal.SIGINT) is startup.stop_while_starting:
    signal.signal(signal.SIGINT, interrupt)  # The command's to handle now.
  status = None

  def main_flushed(argv: list[str]) -> Any:
    result = main(argv)
    sys.stdout.flush()  # Here a reader that stopped reading is a BrokenPipeError, caught below.
    return result

  try:
    app.run(main_flushed, flags_parser=flags_parser)
  except SystemExit as exit_:  # app.run ends in sys.exit(the value main returns), or main's own.
    status = exit_.code
  except BrokenPipeError:
    # The reader of stdout stopped reading (`| head`): it has what it wanted. The flush at exit goes
    # to /dev/null, not into another BrokenPipeError's traceback.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    status = 0
  except Exception:  # pylint: disable=broad-except
    traceback.print_exc()
    status = 1
  if status is not None and not isinstance(status, int):  # sys.exit('message'): print it, status 1.
    print(status, file=sys.stderr)
    status = 1
  if status:
    deadline = threading.Timer(FAILED_EXIT_GRACE_S, _exit, args=(status,))
    deadline.daemon = True  # Not one of the threads the shutdown below waits for.
    deadline.start()
  # As the interpreter's exit does, in its order: the threading module's exit callbacks (which stop
  # concurrent.futures' idle workers), joining the non-daemon threads, then the atexit handlers.
  threading._shutdown()  # pylint: disable=protected-access
  atexit._run_exitfuncs()  # pylint: disable=protected-access
  _exit(status or 0)


FAILED_EXIT_GRACE_S = 10.0
_INTERRUPTED = threading.Event()


def interrupt(signum: int, frame: Any) -> None:
  """SIGINT while a command runs, before it takes SIGINT over: KeyboardInterrupt, as Python's default
  handler raises it, and remembered. Python would print an exception raised in a garbage collector's
  callback (XLA's has one) or a __del__ as 'Exception ignored', with its traceback, and drop it: the
  command would go on. There it is only remembered, and `raise_if_interrupted` raises it where the
  command takes SIGINT over."""
  del signum
  _INTERRUPTED.set()
  if not _in_unraisable_code(frame):
    raise KeyboardInterrupt


def _in_unraisable_code(frame: Any) -> bool:
  """Whether `frame` runs inside a garbage collector's callback or a __del__."""
  callbacks = {getattr(callback, '__code__', None) for callback in gc.callbacks}
  while frame is not None:
    if frame.f_code in callbacks or frame.f_code.co_name == '__del__':
      return True
    frame = frame.f_back
  return False


def raise_if_interrupted() -> None:
  """KeyboardInterrupt if `interrupt` ran, whether or not its own exception reached the command."""
  if _INTERRUPTED.is_set():
    raise KeyboardInterrupt


def _exit(status: int) -> NoReturn:
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except OSError:  # A reader that stopped reading: nothing to say, and no one to say it to.
      pass
  os._exit(status)
