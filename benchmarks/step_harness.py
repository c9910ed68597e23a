"""Our train step (or forward pass) compiled ahead of time from shapes alone, and the timing helpers of
train_step.py: steps timed with the kernel's page faults, paired ratios, a measured matmul peak, peak
memory, and where a step's time goes by jax source (a profiler trace).
"""

import abc
import collections
import functools
import glob
import os
import re
import resource
import statistics
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import sharding
from vit_jax.tasks import classification
from vit_jax.train import optim, param_groups
from vit_jax.train import state as train_state, step as train_step

NUM_CLASSES = 1000


class Steps(abc.ABC):
  """What is timed: `dispatch` starts a step, `wait` waits for those started."""

  @abc.abstractmethod
  def dispatch(self) -> None:
    """Starts a step, without waiting for it."""

  @abc.abstractmethod
  def wait(self) -> None:
    """Until the steps dispatched so far are done."""

  def step(self) -> None:
    self.dispatch()
    self.wait()

  def run(
      self, n: int, kernel: collections.Counter | None = None, in_flight: bool = False
  ) -> list[float]:
    """`time_steps` of `n` steps, each waited for or (`in_flight`) all in flight at once."""
    if in_flight:
      return time_steps(self.dispatch, n, kernel, wait=self.wait)
    return time_steps(self.step, n, kernel)


class Ours(Steps):
  """The jitted train step (or forward pass) of vit_jax, compiled ahead of time from shapes alone."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      model_config: dict[str, Any],
      mode: str,
      compiler_options: dict[str, Any] | None = None,
  ):
    self.mode, self.config = mode, config
    self.mesh = sharding.make_mesh(config.mesh)
    model = classification.make_model(config, model_config, NUM_CLASSES)
    tx, schedule = optim.make_optimizer(config, config.total_steps, model_config)
    init = functools.partial(
        train_state.init_state, model=model, tx=tx, image_size=config.image_size, polyak=False
    )
    init = lambda key, init=init: train_state.training_layout(
        init(key), model
    )  # As create_state does.
    shardings = sharding.state_shardings(jax.eval_shape(init, jax.random.key(0)), self.mesh)
    self.init = jax.jit(init, out_shardings=shardings)
    batch_sharding = sharding.batch_sharding(self.mesh)
    shape = (config.batch_size, config.image_size, config.image_size, 3)
    abstract_batch = {
        'image': jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sharding),
        'label': jax.ShapeDtypeStruct(shape[:1], jnp.int32, sharding=batch_sharding),
    }
    abstract_state = jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        jax.eval_shape(init, jax.random.key(0)),
        shardings,
    )
    if mode == 'train':
      fn = jax.jit(
          functools.partial(
              train_step.train_step,
              loss_fn=classification.make_loss(config, model),
              tx=tx,
              schedule=schedule,
              dropout_key=jax.random.key(1),
              frozen_labels=param_groups.labeller(config.optim, model_config),
          ),
          in_shardings=(shardings, batch_sharding),
          out_shardings=(shardings, sharding.replicated(self.mesh)),
          donate_argnums=0,
      )
      args = (abstract_state, abstract_batch)
    else:
      fn = jax.jit(lambda params, images: model.apply({'params': params}, images, train=False))
      args = (abstract_state.params, abstract_batch['image'])
    start = time.perf_counter()
    lowered = fn.lower(*args)
    self.trace_s = time.perf_counter() - start
    self.compiled = lowered.compile(compiler_options)
    self.compile_s = time.perf_counter() - start
    cost = self.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # A list in older JAX versions.
    # Of one device's program (times the devices for the total); a scan's body counts once.
    self.xla_flops = (
        float(cost.get('flops', float('nan'))) * self.mesh.size if cost else float('nan')
    )

  def allocate(self) -> None:
    """The initial state and a random batch on the mesh (compiling needed neither)."""
    self.state = self.init(jax.random.key(0))
    rng, config = np.random.default_rng(0), self.config
    images = rng.uniform(-1, 1, (config.batch_size, config.image_size, config.image_size, 3))
    self.batch = sharding.global_batch(
        {
            'image': images.astype(np.float32),
            'label': rng.integers(0, NUM_CLASSES, config.batch_size).astype(np.int32),
        },
        self.mesh,
    )

  def dispatch(self) -> None:
    """Starts a step, without waiting for it (JAX dispatches asynchronously)."""
    if self.mode == 'train':
      self.state, self._last = self.compiled(self.state, self.batch)
    else:
      self._last = self.compiled(self.state.params, self.batch['image'])

  def wait(self) -> None:
    """Until the steps dispatched so far are done."""
    jax.block_until_ready(self._last)


def time_steps(
    step: Callable[[], None],
    n: int,
    kernel: collections.Counter | None = None,
    wait: Callable[[], None] | None = None,
) -> list[float]:
  """Wall seconds of each of `n` steps; adds the process's minor page faults and system CPU seconds
  over them to `kernel` ('faults', 'sys_s'), where the kernel's time goes when memory is re-mapped.

  With `wait`, `step` only dispatches: the `n` steps are in flight back to back, as the training
  loop runs them, `wait` is called once after them, and each step's time is their mean. Without it
  each step is waited for, which on an accelerator leaves it idle while the next is dispatched.
  """
  before = resource.getrusage(resource.RUSAGE_SELF)
  if wait is None:
    times = []
    for _ in range(n):
      start = time.perf_counter()
      step()
      times.append(time.perf_counter() - start)
  else:
    start = time.perf_counter()
    for _ in range(n):
      step()
    wait()
    times = [(time.perf_counter() - start) / n] * n
  if kernel is not None:
    after = resource.getrusage(resource.RUSAGE_SELF)
    kernel['faults'] += after.ru_minflt - before.ru_minflt
    kernel['sys_s'] += after.ru_stime - before.ru_stime
  return times


def paired_ratio(
    our_rounds: list[list[float]], peer_rounds: list[list[float]]
) -> tuple[float, float, float]:
  """Ours/peer images/s of each round (its step times' sums), as (median, lowest, highest) over rounds."""
  ratios = [sum(peer) / sum(ours) for ours, peer in zip(our_rounds, peer_rounds, strict=True)]
  return statistics.median(ratios), min(ratios), max(ratios)


def gemm_tflops(
    dtype: str, sizes: tuple[int, ...] = (1024, 2048, 4096), repeats: int = 10
) -> float:
  """The fastest TFLOP/s of jitted n^3 matmuls on device 0: a measured peak, for CPUs (no datasheet).

  Several sizes, because on CPU the smaller ones that stay in cache are the fastest.
  """
  best = 0.0
  for size in sizes:
    a = jnp.ones((size, size), dtype)
    matmul = jax.jit(jnp.matmul)
    jax.block_until_ready(matmul(a, a))
    times = time_steps(lambda: jax.block_until_ready(matmul(a, a)), repeats)
    best = max(best, 2 * size**3 / min(times) / 1e12)
  return best


def cublaslt_epilogues(compiled_hlo: str) -> collections.Counter:
  """How many cuBLASLt matmuls of a compiled GPU program's HLO text end in each epilogue (DEFAULT,
  BIAS, BIAS_GELU_AUX...): which of the MLPs' biases and GELUs the matmuls compute themselves."""
  return collections.Counter(re.findall(r'"epilogue":"(\w+)"', compiled_hlo))


def max_rss_gb() -> float:
  """The process's peak resident memory. VmHWM, not ru_maxrss, which keeps the parent's peak in a
  child process and the peak before an exec."""
  with open('/proc/self/status') as status:
    return next(int(line.split()[1]) for line in status if line.startswith('VmHWM:')) / 2**20  # kB


def peak_memory() -> str:
  stats = jax.devices()[0].memory_stats()
  if stats and 'peak_bytes_in_use' in stats:
    return f'{stats["peak_bytes_in_use"] / 2**30:.2f} GB (device 0)'
  return f'{max_rss_gb():.2f} GB (process max RSS)'


def op_sources(compiled_hlo: str) -> dict[str, str]:
  """Op name -> the jax source of the op (blocks merged), from a compiled program's HLO metadata; each
  op also under its GPU kernel's name (its name with '_' for '.' and '-')."""
  sources = {}
  for match in re.finditer(r'%([\w.-]+) = .*?op_name="([^"]*)"', compiled_hlo):
    source = re.sub(r'encoderblock_\d+', 'encoderblock_*', re.sub(r'^jit\([^)]*\)/', '', match[2]))
    for name in (match[1], re.sub(r'[.-]', '_', match[1])):
      sources.setdefault(name, source)
  return sources


def time_by_source(
    durations: dict[str, list[float]], sources: dict[str, str], steps: int
) -> collections.Counter:
  """ms per step by (kind of op, source): an op of the program with its fastest execution times its
  count (what it costs without the neighbours' load); a library kernel (cuBLAS, cuDNN: one kernel runs
  many ops, of many shapes) with all its time."""
  by_source = collections.Counter()
  for name, ms in durations.items():
    kind = 'ynn (XNNPACK)' if name.startswith('ynn') else re.sub(r'[._]\d+$', '', name)[:40]
    if name in sources:
      by_source[(kind, sources[name])] += min(ms) * len(ms) / steps
    else:
      by_source[(kind, '(library kernel)')] += sum(ms) / steps
  return by_source


def profile(ours: Ours, steps: int, top: int) -> None:
  """Where our step's time goes: XLA ops grouped by source (`time_by_source`), from a jax.profiler
  trace of `steps` steps: on CPU the ops the host's threads run (independent ops may run at once, so
  the sum can exceed the step), on a GPU the kernels of its streams."""
  from jax._src.lib import _profile_data  # pylint: disable=g-import-not-at-top

  sources = op_sources(ours.compiled.as_text())
  with tempfile.TemporaryDirectory() as trace_dir:
    with jax.profiler.trace(trace_dir):
      time_steps(ours.step, steps)
    trace = _profile_data.ProfileData.from_file(
        glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'), recursive=True)[0]
    )
  durations = collections.defaultdict(list)
  for plane in trace.planes:
    for line in plane.lines:
      kernels = plane.name.startswith('/device:') and line.name.startswith('Stream')
      for event in line.events:
        if event.name in sources or kernels:
          durations[event.name].append(event.duration_ns / 1e6)
  by_source = time_by_source(durations, sources, steps)
  total = sum(by_source.values())
  print(
      f'# profile: {total:.0f} ms of XLA ops per step (each op at its fastest of {steps}, a library '
      f'kernel with all its time); top {top}:'
  )
  for (kind, source), ms in by_source.most_common(top):
    print(f'# {ms:8.1f} ms {100 * ms / total:5.1f}%  {kind:26s} {source}')
