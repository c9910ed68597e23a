"""Runs a multi-process vit_jax job on this machine, e.g. to try multi-host code on CPU.

  python launch/local.py --num_processes=2 --devices_per_process=4 -- \\
      --config=configs/demo.py --workdir=workdirs/demo_2x4

Each process gets `devices_per_process` fake CPU devices and joins the run through jax.distributed on
localhost; process 0 prints, the others log warnings only. If any process fails, the rest are stopped.
"""
import argparse
import os
import socket
import subprocess
import sys
import time


# A process that stopped to be preempted (vit_jax.train.preemption.REQUEUE_STATUS) is not a failure:
# the others are finishing the same save.
REQUEUE_STATUS = 75


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def launch(main_args: list[str], *, num_processes: int, devices_per_process: int,
           module: str = 'vit_jax.main', port: int | None = None, timeout: float | None = None) -> int:
  """Starts the processes, waits for all of them, and returns the first non-zero exit code (or 0)."""
  address = f'127.0.0.1:{port or free_port()}'
  env = dict(os.environ, JAX_PLATFORMS='cpu',
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices_per_process}')
  procs = [subprocess.Popen(
      [sys.executable, '-m', module, *main_args, f'--coordinator_address={address}',
       f'--num_processes={num_processes}', f'--process_id={i}'], env=env)
           for i in range(num_processes)]
  deadline = None if timeout is None else time.time() + timeout
  try:
    while any(p.poll() is None for p in procs):
      failed = [p.returncode for p in procs if p.returncode not in (None, 0, REQUEUE_STATUS)]
      if failed or (deadline is not None and time.time() > deadline):
        for p in procs:
          if p.poll() is None:
            p.kill()
        break
      time.sleep(0.2)
  finally:
    for p in procs:
      p.wait()
  codes = [p.returncode for p in procs]
  return next((code for code in codes if code), 0)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
  parser.add_argument('--num_processes', type=int, default=2)
  parser.add_argument('--devices_per_process', type=int, default=4)
  parser.add_argument('--module', default='vit_jax.main', help='Python module each process runs.')
  parser.add_argument('main_args', nargs=argparse.REMAINDER, help='Arguments for the module, after --.')
  args = parser.parse_args()
  main_args = args.main_args[1:] if args.main_args[:1] == ['--'] else args.main_args
  sys.exit(launch(main_args, num_processes=args.num_processes,
                  devices_per_process=args.devices_per_process, module=args.module))


if __name__ == '__main__':
  main()
