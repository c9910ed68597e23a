"""What every command does first, before it imports anything heavy (jax, TensorFlow)."""

import os
import signal
import sys

from vit_jax.runtime import allocator
from vit_jax.runtime import compile_cache
from vit_jax.runtime import cpu_kernels
from vit_jax.runtime import quiet


def prepare_process() -> None:
  """mimalloc preloaded on CPU (re-executes the command; vit_jax/runtime/allocator.py), matmuls on XLA's own
  kernels on AVX2 CPUs (vit_jax/runtime/cpu_kernels.py), this machine's compilation cache
  (vit_jax/runtime/compile_cache.py), TensorFlow's start-up lines off (vit_jax/runtime/quiet.py)."""
  allocator.use_mimalloc()
  cpu_kernels.route_ops()
  compile_cache.use_persistent_cache()
  quiet.quiet_tensorflow()
  # A Ctrl-C while the command imports its modules would print Python's traceback of the import.
  # An ignored SIGINT (nohup, a job in the background) stays ignored. `cli.run` gives Ctrl-C back to
  # the command.
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, stop_while_starting)


def stop_while_starting(signum: int, frame) -> None:
  """SIGINT before the command has started: nothing is done yet, so one line and status 130."""
  del signum, frame
  sys.stderr.write('error: interrupted while starting: nothing was done\n')
  sys.stderr.flush()
  os._exit(130)  # pylint: disable=protected-access


def requeue_on_sigterm() -> None:
  """A run's SIGTERM (preemption, a scheduler's time limit) outside its train steps, which
  train/preemption.py takes over: status 75, which launch/slurm.sbatch requeues on, not the default
  death (143) that loses the job. An ignored SIGTERM stays ignored."""
  if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _terminated_outside_the_steps)


def _terminated_outside_the_steps(signum: int, frame) -> None:
  del signum, frame
  sys.stderr.write(
      'error: terminated outside the train steps (SIGTERM): nothing new was saved; the same '
      'command resumes from the last checkpoint, if there is one\n'
  )
  sys.stderr.flush()
  os._exit(75)  # pylint: disable=protected-access
