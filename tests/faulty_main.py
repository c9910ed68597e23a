"""`python tests/faulty_main.py <vit_jax.main flags>`: vit_jax.main with one fault from the
environment's FAULT, at an exact point of the run, for the fault-injection tests:

  kill_before_step:S    SIGKILL once the loop takes step S's batch (earlier steps are dispatched)
  kill_in_save:S        SIGKILL inside the async save of step S, its files half written
  kill_before_commit:S  SIGKILL when the save of step S is written and about to be renamed final
  kill_in_eval:S        SIGKILL inside the evaluation at step S
  block:P:S             process P sleeps for good before step S (a collective its peers never see end)
"""

import os
import signal
import sys
import time

from vit_jax.runtime import cli, config_files
from vit_jax import main as vit_main


def _kill() -> None:
  sys.stderr.flush()
  os.kill(os.getpid(), signal.SIGKILL)


def _at_step(step: int, fault) -> None:
  """Calls `fault` when the train loop takes the batch of `step`, just before dispatching that step
  (the batch itself went to the devices config.device_prefetch steps earlier)."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top

  train_iterator, device_batches = data.train_iterator, loop.device_batches
  first = []

  def faulty_train_iterator(config, *, start_step: int, **kwargs):
    first.append(start_step + 1)
    return train_iterator(config, start_step=start_step, **kwargs)

  def faulty_device_batches(*args, **kwargs):
    for s, batch in enumerate(device_batches(*args, **kwargs), first[-1]):
      if s == step:
        fault()
      yield batch

  data.train_iterator, loop.device_batches = faulty_train_iterator, faulty_device_batches


def _kill_in_async_path(name: str, when) -> None:
  """Kills when orbax's async_path.`name` (a file write or rename of a save) is called with
  arguments for which `when(path, *args)` holds."""
  from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top

  original = getattr(async_path, name)

  async def faulty(path, *args, **kwargs):
    if when(str(path), *args):
      _kill()
    return await original(path, *args, **kwargs)

  setattr(async_path, name, faulty)


def _in_save(step: int) -> None:
  """Kills at the first file the save of `step` writes through orbax's async_path (its metadata),
  while the arrays' writes are in flight."""
  _kill_in_async_path('write_text', lambda path, *_: f'{os.sep}{step}.orbax-checkpoint-tmp' in path)


def _before_commit(step: int) -> None:
  _kill_in_async_path('rename', lambda src, dst, *_: os.path.basename(str(dst)) == str(step))


def _in_eval(step: int) -> None:
  from vit_jax.train import loop  # pylint: disable=g-import-not-at-top

  evaluate = loop.evaluate

  def faulty_evaluate(evaluator, state):
    if int(state.step) == step:
      _kill()
    return evaluate(evaluator, state)

  loop.evaluate = faulty_evaluate


def _block(process: int, step: int) -> None:
  import jax  # pylint: disable=g-import-not-at-top

  def sleep():
    if jax.process_index() == process:
      while True:
        time.sleep(60)

  _at_step(step, sleep)


FAULTS = {
    'kill_before_step': lambda s: _at_step(int(s), _kill),
    'kill_in_save': lambda s: _in_save(int(s)),
    'kill_before_commit': lambda s: _before_commit(int(s)),
    'kill_in_eval': lambda s: _in_eval(int(s)),
    'block': lambda p, s: _block(int(p), int(s)),
}


if __name__ == '__main__':
  kind, *args = os.environ['FAULT'].split(':')
  FAULTS[kind](*args)
  cli.run(vit_main.main, flags_parser=config_files.flags_parser(vit_main.USAGE))
