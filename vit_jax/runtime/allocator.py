"""Keeps the CPU train step's memory mapped between steps: entry points re-run themselves with mimalloc.

XLA:CPU allocates each step's temporaries (about 2 GB for ViT-Ti/16 at batch 32) in one buffer freed at
the end of the step. glibc's malloc hands a block that large to mmap and gives it back with munmap, so
every step maps fresh memory and takes a minor page fault on the first write to each of its pages:
~550k faults and 1.5-2.5 s of kernel time a step on a 2-core machine, a third of the step. mimalloc
(from the `cmeel-mimalloc` wheel on PyPI) keeps freed memory for reuse when told never to purge it,
so the next step writes into pages that are already mapped.

An allocator must be in place before the process allocates anything, so `use_mimalloc()` re-executes
the command it is called from (`sys.orig_argv`, same pid, same file descriptors) with mimalloc in
LD_PRELOAD. It does nothing when:
  VIT_JAX_ALLOCATOR=system          (the opt-out) is set,
  it is not Linux x86-64, or the wheel is not installed,
  JAX will not run on the CPU (JAX_PLATFORMS names no cpu, or a CUDA / TPU / ROCm plugin is
  installed and JAX_PLATFORMS does not ask for cpu): accelerator steps keep their memory on the device,
  the process already has mimalloc (a child of a process that re-executed inherits LD_PRELOAD).
"""

import importlib.metadata
import importlib.util
import os
import sys
from typing import Callable

OPT_OUT = 'VIT_JAX_ALLOCATOR'  # 'system' keeps the C library's malloc.
_REEXECUTED = 'VIT_JAX_ALLOCATOR_REEXECUTED'  # Guards against a loop if the preload did not take.
_LIBRARY = 'libmimalloc.so.3'
# Never hand freed memory back to the OS: each step reuses the pages the last one faulted in.
MIMALLOC_OPTIONS = {'MIMALLOC_PURGE_DELAY': '-1'}
_ACCELERATOR_PLUGINS = (
    'jax_cuda12_plugin',
    'jax_cuda13_plugin',
    'libtpu',
    'jax_rocm60_plugin',
    'jax_rocm7_plugin',
)


def library() -> str | None:
  """The path of mimalloc's shared library from the cmeel-mimalloc wheel, if it is installed here."""
  try:
    files = importlib.metadata.files('cmeel-mimalloc') or []
  except importlib.metadata.PackageNotFoundError:
    return None
  paths = [str(f.locate()) for f in files if f.name == _LIBRARY]
  return next((p for p in paths if os.path.exists(p)), None)


def in_effect() -> str:
  """'mimalloc' where this process runs with mimalloc loaded, else 'system'."""
  try:
    with open('/proc/self/maps') as maps:
      return 'mimalloc' if 'libmimalloc' in maps.read() else 'system'
  except OSError:  # Not Linux.
    return 'system'


def system_malloc_env() -> dict[str, str]:
  """This process's environment for a child that runs with the C library's malloc (a peer measured
  as its users run it): no preloaded library, and the opt-out, so it does not re-execute itself."""
  env = {k: v for k, v in os.environ.items() if k != 'LD_PRELOAD'}
  env[OPT_OUT] = 'system'
  return env


def runs_on_cpu() -> bool:
  """Whether JAX will run on the CPU: JAX_PLATFORMS names cpu first, or no accelerator plugin is here."""
  platforms = os.environ.get('JAX_PLATFORMS', '')
  if platforms:
    return platforms.split(',')[0].strip() == 'cpu'
  return not any(importlib.util.find_spec(name) for name in _ACCELERATOR_PLUGINS)


def use_mimalloc(before_exec: Callable[[], None] | None = None) -> None:
  """Re-executes this process with mimalloc preloaded, where that applies (see the module docstring).
  Call it first thing in an entry point, before anything heavy is imported; `before_exec` runs just
  before (pytest restores the file descriptors it captures)."""
  if (
      os.environ.get(OPT_OUT, 'mimalloc') == 'system'
      or os.environ.get(_REEXECUTED)
      or not sys.platform.startswith('linux')
      or in_effect() == 'mimalloc'
      or not runs_on_cpu()
  ):
    return
  path = library()
  if path is None:
    return
  env = dict(os.environ, **{_REEXECUTED: '1'})
  for name, value in MIMALLOC_OPTIONS.items():
    env.setdefault(name, value)
  env['LD_PRELOAD'] = ' '.join(filter(None, [path, os.environ.get('LD_PRELOAD')]))
  if before_exec:
    before_exec()
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
