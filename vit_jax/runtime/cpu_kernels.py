"""Which library runs XLA:CPU's ops on x86 CPUs: matmuls on Eigen, reductions and convolutions on YNNPACK.

By default XLA:CPU (jax 0.10.2) hands matmuls, elementwise fusions, reductions and convolutions to
YNNPACK. On an AVX2 CPU without AVX-512 (2-core AMD EPYC Zen 3) its matmuls are slower than XLA's own
Eigen ones at the shapes of a small ViT: attention's batched matmuls (96 matrices of 197x64 at ViT-Ti/16
batch 32) take 1.5-2.5x Eigen's time, and its elementwise fusions of the MLP's GELU with its gradient run
several times slower than the same GELU alone. Keeping dots and elementwise ops on XLA's kernels makes
the ViT-Ti/16 train step 11-19% faster there, and ViT-B/16 (768 wide) is within the noise (0.97-1.01x).
On an AVX-512 CPU (2-core Intel Xeon with AMX) it makes the ViT-Ti/16 train step 7-9% faster (0.82-0.83x
timm's images/s instead of 0.76-0.77x), ViT-B/16 2% (0.86x instead of 0.84x), and inference is level
(1.15x timm's either way). benchmarks/RESULTS.md has the runs.

`route_ops()` adds `--xla_cpu_experimental_ynn_fusion_type=<YNNPACK_OPS>` to XLA_FLAGS before JAX starts
its CPU client. It does nothing when:
  VIT_JAX_CPU_KERNELS=xla   (the opt-out: XLA's default) is set,
  XLA_FLAGS already sets that option (the user's own choice),
  the CPU is not x86-64 with AVX2,
  JAX will not run on the CPU (allocator.runs_on_cpu).
"""

import os
import platform

from vit_jax.runtime import allocator, cpuinfo

OPT_OUT = 'VIT_JAX_CPU_KERNELS'  # 'xla' keeps XLA's default library for every op.
OPTION = 'xla_cpu_experimental_ynn_fusion_type'
YNNPACK_OPS = 'LIBRARY_FUSION_TYPE_REDUCE,LIBRARY_FUSION_TYPE_INDIVIDUAL_CONVOLUTION'


def applies(cpuinfo_path: str = cpuinfo.CPUINFO) -> bool:
  """Whether this machine is of the kind the routing was measured on: x86-64 with AVX2 (AVX-512 or not)."""
  return platform.machine() in ('x86_64', 'AMD64') and 'avx2' in cpuinfo.flags(cpuinfo_path)


def route_ops() -> None:
  """Keeps matmuls and elementwise ops off YNNPACK on x86 CPUs (see the module docstring); call it
  before jax is imported."""
  xla_flags = os.environ.get('XLA_FLAGS', '')
  if (
      os.environ.get(OPT_OUT, '') == 'xla'
      or OPTION in xla_flags
      or not allocator.runs_on_cpu()
      or not applies()
  ):
    return
  os.environ['XLA_FLAGS'] = f'{xla_flags} --{OPTION}={YNNPACK_OPS}'.strip()


def in_effect() -> str:
  """What XLA_FLAGS hands to YNNPACK: this module's setting or the user's, else "XLA's default"."""
  for flag in os.environ.get('XLA_FLAGS', '').split():
    if flag.startswith(f'--{OPTION}='):
      return flag.partition('=')[2] or 'none'
  return "XLA's default"
