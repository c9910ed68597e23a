"""Indexing WebDataset tar shards in one process's threads, in its processes (one a core, from
hf_webdataset._TARS_FOR_PROCESSES tars on), and in the two processes of a multi-host run
(jax.distributed on this machine, as two hosts), which divide a split's tars between them
(vit_jax/data/hf_webdataset.py, vit_jax/runtime/hosts.py).

  python benchmarks/divided_index.py --tars=64 --samples=2000

Writes `--tars` shards of `--samples` samples each (a small PNG and a `cls` file), then times the
source's start (the train split's index, into an empty cache of its own): in one process with
threads only (the peer), in one process with its indexing processes, and in each of two processes,
which index half the tars each and all-gather the halves (the gather's compile included). Prints
the times and the ratios to the peer; each process's cache must hold the same index.
"""

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'launch')
)


def write_shards(root: str, tars: int, samples: int) -> None:
  from PIL import Image  # pylint: disable=g-import-not-at-top

  png = io.BytesIO()
  Image.new('RGB', (8, 8), (200, 30, 90)).save(png, format='PNG')
  for t in range(tars):
    with tarfile.open(os.path.join(root, f'imagenet-train-{t:04d}.tar'), 'w') as tar:
      for k in range(samples):
        for column, content in (('png', png.getvalue()), ('cls', b'%d' % (k % 10))):
          info = tarfile.TarInfo(f'{t:04d}_{k:06d}.{column}')
          info.size = len(content)
          tar.addfile(info, io.BytesIO(content))


def worker(args: argparse.Namespace) -> None:
  """One process: the source's start, timed; prints seconds and the index's hash."""
  import jax  # pylint: disable=g-import-not-at-top

  if args.num_processes > 1:
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(
        args.coordinator_address, num_processes=args.num_processes, process_id=args.process_id
    )
  os.environ['VIT_JAX_DATASETS_CACHE'] = args.cache
  from vit_jax.data import hf_source, hf_webdataset  # pylint: disable=g-import-not-at-top

  if args.threads_only:
    hf_webdataset._TARS_FOR_PROCESSES = sys.maxsize  # pylint: disable=protected-access

  start = time.perf_counter()
  source = hf_source.HuggingFaceSource(args.root, 'train', 'cls')
  seconds = time.perf_counter() - start
  folder = source._rows._indices['train']  # pylint: disable=protected-access
  with open(os.path.join(folder, 'extents.npy'), 'rb') as f:
    digest = hashlib.sha256(f.read()).hexdigest()[:12]
  print(f'{seconds:.3f} {digest}')


def run(
    root: str, cache: str, processes: int, threads_only: bool = False
) -> list[tuple[float, str]]:
  import local  # pylint: disable=g-import-not-at-top

  address = f'127.0.0.1:{local.free_port()}'
  env = dict(os.environ, JAX_PLATFORMS='cpu')
  procs = [
      subprocess.Popen(
          [
              sys.executable,
              os.path.abspath(__file__),
              '--worker',
              f'--root={root}',
              f'--cache={cache}_{i}',
              f'--coordinator_address={address}',
              f'--num_processes={processes}',
              f'--process_id={i}',
              *(['--threads_only'] if threads_only else []),
          ],
          env=env,
          stdout=subprocess.PIPE,
          text=True,
      )
      for i in range(processes)
  ]
  results = []
  for proc in procs:
    out, _ = proc.communicate(timeout=1800)
    if proc.returncode:
      raise SystemExit(f'a process failed ({proc.returncode})')
    seconds, digest = out.split()[-2:]
    results.append((float(seconds), digest))
  return results


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--tars', type=int, default=64)
  parser.add_argument('--samples', type=int, default=2000, help='samples a tar')
  parser.add_argument('--worker', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument('--root', help=argparse.SUPPRESS)
  parser.add_argument('--cache', help=argparse.SUPPRESS)
  parser.add_argument('--coordinator_address', help=argparse.SUPPRESS)
  parser.add_argument('--num_processes', type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument('--process_id', type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument('--threads_only', action='store_true', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    worker(args)
    return
  with tempfile.TemporaryDirectory() as tmp:
    root = os.path.join(tmp, 'shards')
    os.makedirs(root)
    write_shards(root, args.tars, args.samples)
    os.sync()
    threads = run(root, os.path.join(tmp, 'threads'), 1, threads_only=True)
    one = run(root, os.path.join(tmp, 'one'), 1)
    two = run(root, os.path.join(tmp, 'two'), 2)
  if len({digest for _, digest in threads + one + two}) != 1:
    raise SystemExit(f'the indices differ: {threads} {one} {two}')
  peer = threads[0][0]
  slowest = max(seconds for seconds, _ in two)
  print(f'# {args.tars} tars of {args.samples} samples; {os.cpu_count()} cores')
  print('| run | index s (slowest process) | as fast as one process in threads x |')
  print('|---|---|---|')
  print(f'| 1 process, threads | {peer:.2f} | 1.00 |')
  print(f'| 1 process, its indexing processes | {one[0][0]:.2f} | **{peer / one[0][0]:.2f}** |')
  print(f'| 2 processes (hosts), divided | {slowest:.2f} | **{peer / slowest:.2f}** |')


if __name__ == '__main__':
  main()
