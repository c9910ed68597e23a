"""This machine's CPU as Linux describes it (/proc/cpuinfo): what vit_jax's CPU-dependent choices key on
(cpu_kernels.py's routing, compile_cache.py's folder) and what the benchmarks record beside a result.
"""

import datetime
import os

CPUINFO = '/proc/cpuinfo'
_TRANSPARENT_HUGE_PAGES = '/sys/kernel/mm/transparent_hugepage/enabled'


def entries(path: str = CPUINFO) -> list[tuple[str, str]] | None:
  """(key, value) of every line, each CPU's in turn; None where the file is missing (not Linux)."""
  try:
    with open(path) as cpuinfo:
      lines = [line.partition(':') for line in cpuinfo]
  except OSError:
    return None
  return [(key.strip(), value.strip()) for key, _, value in lines if key.strip()]


def first(key: str, path: str = CPUINFO) -> str | None:
  """The first CPU's `key` ('model name', 'flags', ...), if there is one."""
  return next((value for k, value in entries(path) or [] if k == key), None)


def flags(path: str = CPUINFO) -> set[str]:
  """The first CPU's instruction-set flags (empty where /proc/cpuinfo is missing)."""
  return set((first('flags', path) or '').split())


def usable_cores() -> int:
  """Cores this process may run on: JAX's CPU client runs one thread on each (all of them where the
  OS does not say: macOS)."""
  if hasattr(os, 'sched_getaffinity'):
    return len(os.sched_getaffinity(0))
  return os.cpu_count() or 1


def transparent_huge_pages() -> str:
  """The kernel's transparent-huge-page mode (always, madvise or never), or 'unknown'."""
  try:
    with open(_TRANSPARENT_HUGE_PAGES) as setting:
      words = setting.read().split()
  except OSError:
    return 'unknown'
  return next((word.strip('[]') for word in words if word.startswith('[')), 'unknown')


def summary() -> str:
  """The CPU model, its AVX-512 flags, cores, transparent huge pages and today's date: what
  benchmarks/RESULTS.md records beside each result."""
  avx512 = sorted(flag for flag in flags(CPUINFO) if flag.startswith('avx512'))
  return (
      f'{first("model name", CPUINFO) or "unknown CPU"}, AVX-512: '
      f'{"yes (" + " ".join(avx512) + ")" if avx512 else "no"}, {os.cpu_count()} cores '
      f'({usable_cores()} usable), transparent huge pages: {transparent_huge_pages()}; '
      f'{datetime.date.today().isoformat()}'
  )
