"""Runs a multi-process vit_jax job on this machine, e.g. to try multi-host code on CPU.

  python launch/local.py --num_processes=2 --devices_per_process=4 -- \\
      --config=configs/demo.py --workdir=workdirs/demo_2x4

Each process gets `devices_per_process` fake CPU devices and joins the run through jax.distributed on
localhost; process 0 prints, the others log warnings only, and a message process 0 printed too is
shown once (launch/console.py). If any process fails, the rest are stopped.
Ctrl-C or SIGTERM to the launcher stops the run as a preemption does: every process saves the same
step and the launcher exits with their status 75 (REQUEUE_STATUS); the same command resumes there.
A second signal kills them unsaved; a launcher killed outright leaves none running (stopping.py).
"""

import argparse
import os
import socket
import sys
import time

import console as console_lib
import stopping

# A process that stopped to be preempted (vit_jax.train.preemption.REQUEUE_STATUS) is not a failure:
# the others are finishing the same save.
REQUEUE_STATUS = 75


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch(
    main_args: list[str],
    *,
    num_processes: int,
    devices_per_process: int,
    module: str = 'vit_jax.main',
    port: int | None = None,
    timeout: float | None = None,
) -> int:
  """Starts the processes, waits for all of them, and returns the first exit code that is neither 0
  nor REQUEUE_STATUS, else REQUEUE_STATUS if any process stopped to be requeued, else 0.

  SIGINT and SIGTERM to the launcher reach the processes as SIGTERM, the preemption signal their
  coordination service acts on. SIGTERM for Ctrl-C too: a terminal's Ctrl-C also reaches them (the
  same process group), and a second SIGINT would interrupt them at once, unsaved; a second signal
  to the launcher kills them (stopping.Stopper).
  """
  address = f'127.0.0.1:{port or free_port()}'
  env = dict(
      os.environ,
      JAX_PLATFORMS='cpu',
      XLA_FLAGS=f'--xla_force_host_platform_device_count={devices_per_process}',
  )
  console = console_lib.Console()
  with stopping.Stopper() as stopper:
    procs = stopper.processes
    try:
      for i in range(num_processes):
        command = [
            sys.executable,
            '-m',
            module,
            *main_args,
            f'--coordinator_address={address}',
            f'--num_processes={num_processes}',
            f'--process_id={i}',
        ]
        stopper.add(console.popen(i, stopping.ended_with_launcher(command), env=env))
      deadline = None if timeout is None else time.time() + timeout
      failures = []  # The exit codes of the processes that failed, in the order they ended.
      while True:
        codes = [p.poll() for p in procs]  # Every one, each time: any of them may fail first.
        failures += [c for c in codes if c not in (None, 0, REQUEUE_STATUS) and c not in failures]
        if None not in codes:
          break
        if failures or (deadline is not None and time.time() > deadline):
          # The others would wait on the failed one's collectives until they time out.
          for p in procs:
            if p.poll() is None:
              p.kill()
          break
        console.flush()
        time.sleep(0.2)
    finally:
      for p in procs:
        p.wait()
      console.close()
  if stopper.killed:
    print('error: killed the processes unsaved (a second signal to the launcher)', file=sys.stderr)
  if failures:  # The first: the others' are those of processes it stopped, or the launcher killed.
    return failures[0]
  codes = [p.returncode for p in procs]
  # A kill at the timeout over the others' requeue: a run whose processes did not all save is not
  # one to requeue.
  return next(
      (code for code in codes if code not in (0, REQUEUE_STATUS)),
      REQUEUE_STATUS if REQUEUE_STATUS in codes else 0,
  )


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--num_processes', type=int, default=2)
  parser.add_argument('--devices_per_process', type=int, default=4)
  parser.add_argument('--module', default='vit_jax.main', help='Python module each process runs.')
  parser.add_argument(
      'main_args', nargs=argparse.REMAINDER, help='Arguments for the module, after --.'
  )
  args = parser.parse_args()
  for flag in ('num_processes', 'devices_per_process'):
    if getattr(args, flag) < 1:  # 0 processes ran nothing and exited 0.
      print(f'error: --{flag}={getattr(args, flag)} must be at least 1', file=sys.stderr)
      sys.exit(2)
  main_args = args.main_args[1:] if args.main_args[:1] == ['--'] else args.main_args
  code = launch(
      main_args,
      num_processes=args.num_processes,
      devices_per_process=args.devices_per_process,
      module=args.module,
  )
  sys.exit(code if code >= 0 else 128 - code)  # Killed by signal N: the shell's status, 128 + N.


if __name__ == '__main__':
  main()
