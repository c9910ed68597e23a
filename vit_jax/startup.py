"""What every command does first, before it imports anything heavy (jax, TensorFlow)."""
from vit_jax import allocator
from vit_jax import compile_cache
from vit_jax import cpu_kernels
from vit_jax import quiet


def prepare_process() -> None:
  """mimalloc preloaded on CPU (re-executes the command; vit_jax/allocator.py), matmuls on XLA's own
  kernels on AVX2 CPUs (vit_jax/cpu_kernels.py), this machine's compilation cache
  (vit_jax/compile_cache.py), TensorFlow's start-up lines off (vit_jax/quiet.py)."""
  allocator.use_mimalloc()
  cpu_kernels.route_ops()
  compile_cache.use_persistent_cache()
  quiet.quiet_tensorflow()
