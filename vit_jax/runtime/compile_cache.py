"""A persistent XLA compilation cache for the commands, one folder per machine.

Compiling is most of a small run's start-up on CPU: of the demo's ~20 s, 4.4 s compile the state's
initialisation, 6.3 s the train step and ~1 s the evaluation. JAX keeps compiled programs on disk when
JAX_COMPILATION_CACHE_DIR is set, so running the same model again (another seed, a resumed run, a
sweep's next learning rate, predict after export) loads them instead. Every command calls
`use_persistent_cache()` before it imports jax; it sets that variable, unless the user did, to
$XDG_CACHE_HOME/vit_jax/xla/<machine> (~/.cache/... by default), bounded to `MAX_BYTES` (least
recently used entries go first).

<machine> hashes the CPU's model and instruction-set flags: XLA:CPU's entries are native code for the
CPU that compiled them, and a home folder shared by cluster nodes with different CPUs would otherwise
hand one node another's code. VIT_JAX_COMPILATION_CACHE=off turns the cache off.
"""

import hashlib
import os
import platform

from vit_jax.runtime import cpuinfo
from vit_jax.runtime import paths

OPT_OUT = 'VIT_JAX_COMPILATION_CACHE'  # 'off' (or 0, false, no): compile every time.
MAX_BYTES = 4 << 30


def machine_key(cpuinfo_path: str = cpuinfo.CPUINFO) -> str:
  """12 hex digits naming this machine's CPU: its architecture, model and instruction-set flags."""
  described = [platform.machine()]
  lines = cpuinfo.entries(cpuinfo_path)
  if lines is None:  # Not Linux: the processor's name is what there is.
    described.append(platform.processor())
  for key, value in lines or []:
    if key in ('model name', 'flags', 'Features', 'CPU part') and value not in described:
      described.append(value)
  return hashlib.sha256('\n'.join(described).encode()).hexdigest()[:12]


def default_dir() -> str:
  return paths.user_cache('xla', machine_key())


def use_persistent_cache() -> None:
  """Points JAX's compilation cache at this machine's folder; before jax is imported."""
  if os.environ.get(OPT_OUT, '').lower() in ('off', '0', 'false', 'no'):
    return
  if 'JAX_COMPILATION_CACHE_DIR' in os.environ:  # The user's own choice (the tests set theirs).
    return
  os.environ['JAX_COMPILATION_CACHE_DIR'] = default_dir()
  os.environ.setdefault('JAX_COMPILATION_CACHE_MAX_SIZE', str(MAX_BYTES))
