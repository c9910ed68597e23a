"""Speed of the real train step (forward, backward, AdamW update) or forward pass, beside timm's.

  python benchmarks/train_step.py --variant=ViT-B_16 --batch=8 --peer=timm --header
  python benchmarks/train_step.py --variant=ViT-Ti_16 --batch=32 --mode=inference --peer=timm
  python benchmarks/train_step.py --variant=ViT-B_16 --batch=8 --compile-only [--scan]
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/train_step.py --mesh="(('data', 2),)"

Our step is `vit_jax.train.step.train_step`, built as the training loop builds it (model, optimizer, loss
and shardings from a config of vit_jax/defaults.py; a scanned model's blocks stacked in the state, as
training keeps them) and jitted with the state donated; `--mode=inference` times the jitted forward
pass. One markdown row per framework: images/s at the median and at the fastest step, median step ms,
compile s, model TFLOP/s and MFU at the median, peak memory. Model FLOPs are the analytic count of
`vit_flops` (training: 3x the forward pass), printed beside XLA's cost analysis of the compiled program.

`--peer=timm` builds timm's VisionTransformer of the same shape in PyTorch, on the GPU where ours runs on
one (JAX then needs XLA_PYTHON_CLIENT_MEM_FRACTION=0.45 or so, to leave timm room), else with as many
threads as JAX's CPU client, each as its users run it: ours with mimalloc preloaded
(vit_jax/runtime/allocator.py), timm in a child process with the C library's malloc (`--peer-allocator=same`: in
this process, with ours); ours with matmuls on XLA's own kernels on AVX2 CPUs (vit_jax/runtime/cpu_kernels.py,
VIT_JAX_CPU_KERNELS=xla for XLA's default). It times the peer (forward, backward, clipping, AdamW; or
forward under `torch.inference_mode()`) in rounds that alternate with ours, so both see the same load on a
shared machine. The fastest step is what each does with the machine to itself; on a busy machine the
medians mostly measure the neighbours. A shared VM also drifts by 10-15% over minutes, so the ratio to
read is the paired one: each round's ours/peer ratio (the two sides a few seconds apart), their median and
range.
Each side first runs `--warmup` untimed steps: the first steps map the step's memory, and on a VM the
first touch of each page costs the host's fault too (ours' first step: ~8 s of system time for 2 GB at
ViT-Ti/16 batch 32). Once within about 16 steps, a step's temporaries are not yet freed when the next step
asks for its own, which then get a second span, touched for the first time: one round of ~8 s more, which
the faults column shows (RESULTS.md).
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator, cpu_kernels, cpuinfo  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates: the train step's memory stays mapped on CPU.
cpu_kernels.route_ops()  # As every entry point: matmuls on XLA's own kernels on AVX2 CPUs.

import argparse
import ast
import collections
import functools
import glob
import json
import re
import resource
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from vit_jax import defaults  # pylint: disable=wrong-import-position
from vit_jax import sharding  # pylint: disable=wrong-import-position
from vit_jax.train import optim  # pylint: disable=wrong-import-position
from vit_jax.planning.chips import vit_flops  # pylint: disable=wrong-import-position
from vit_jax.tasks import classification  # pylint: disable=wrong-import-position
from vit_jax.train import setup as train_setup  # pylint: disable=wrong-import-position
from vit_jax.train import state as train_state, step as train_step  # pylint: disable=wrong-import-position
from vit_jax.models import attention, variants  # pylint: disable=wrong-import-position

# Dense bfloat16 peak TFLOP/s by a substring of `device.device_kind`; CPUs need --peak-tflops.
PEAK_TFLOPS = {
    'H100': 989.0,
    'H200': 989.0,
    'A100': 312.0,
    'TPU v4': 275.0,
    'TPU v5 lite': 197.0,
    'TPU v5e': 197.0,
}
NUM_CLASSES = 1000


def make_config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  config = defaults.get_config()
  config.variant, config.image_size, config.batch_size = args.variant, args.image_size, args.batch
  config.dtype, config.mesh, config.total_steps = args.dtype, ast.literal_eval(args.mesh), 1000
  config.model.attention, config.model.remat, config.model.scan = (
      args.attention,
      args.remat,
      args.scan,
  )
  return config


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


class Ours:
  """The jitted train step (or forward pass) of vit_jax, compiled ahead of time from shapes alone."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      mode: str,
      compiler_options: dict[str, Any] | None = None,
  ):
    self.mode, self.config = mode, config
    self.mesh = sharding.make_mesh(config.mesh)
    model = classification.make_model(config, NUM_CLASSES)
    model_config = variants.get_model_config(config.variant, config.model.to_dict())
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

  def step(self) -> None:
    if self.mode == 'train':
      self.state, metrics = self.compiled(self.state, self.batch)
      jax.block_until_ready(metrics)
    else:
      jax.block_until_ready(self.compiled(self.state.params, self.batch['image']))


class Timm:
  """timm's VisionTransformer of the same shape: forward, backward, clipping and AdamW in PyTorch."""

  def __init__(
      self, model: dict[str, Any], config: ml_collections.ConfigDict, mode: str, device: str = 'cpu'
  ):
    if device == 'cpu':
      sys.modules.setdefault(
          'triton', None
      )  # Its import crashes after TensorFlow's; CPU never needs it.
    import timm.models.vision_transformer  # pylint: disable=g-import-not-at-top
    import torch  # pylint: disable=g-import-not-at-top

    self.torch, self.mode, self.device = torch, mode, device
    torch.set_num_threads(cpuinfo.usable_cores())
    torch.manual_seed(0)
    self.net = timm.models.vision_transformer.VisionTransformer(
        img_size=config.image_size,
        patch_size=model['patch_size'],
        embed_dim=model['hidden_size'],
        depth=model['num_layers'],
        num_heads=model['num_heads'],
        mlp_ratio=model['mlp_dim'] / model['hidden_size'],
        num_classes=NUM_CLASSES,
        global_pool='token' if model['classifier'] == 'token' else 'avg',
        class_token=model['classifier'] == 'token',
        act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
    )  # Ours is the tanh GELU.
    self.net.train(mode == 'train').to(device)
    self.images = (
        torch.rand(config.batch_size, 3, config.image_size, config.image_size) * 2 - 1
    ).to(device)
    self.labels = torch.randint(0, NUM_CLASSES, (config.batch_size,)).to(device)
    self.optimizer = torch.optim.AdamW(
        self.net.parameters(), lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1
    )
    self.dtype = getattr(torch, config.dtype)

  def run(self, n: int, kernel: collections.Counter | None = None) -> list[float]:
    return time_steps(self.step, n, kernel)

  def memory(self) -> str:
    """Peak memory, after the steps, as the child process reports its own."""
    if self.device == 'cuda':
      return f'{self.torch.cuda.max_memory_allocated() / 2**30:.2f} GB (device 0)'
    return f'{max_rss_gb():.2f} GB (process max RSS)'

  def step(self) -> None:
    torch = self.torch
    with torch.autocast(self.device, dtype=self.dtype, enabled=self.dtype != torch.float32):
      if self.mode == 'train':
        loss = torch.nn.functional.cross_entropy(self.net(self.images), self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)  # As ours: grad_clip_norm=1.
        self.optimizer.step()
      else:
        with torch.inference_mode():
          self.net(self.images)
    if self.device == 'cuda':
      torch.cuda.synchronize()  # As ours blocks until its step is done.


class PeerProcess:
  """The peer in a child process with the C library's malloc, as its users run it; it times `n` steps
  when asked, so its rounds still alternate with ours."""

  def __init__(self, device: str):
    self._child = subprocess.Popen(
        [sys.executable, *sys.orig_argv[1:], '--serve-peer', f'--peer-device={device}'],
        env=allocator.system_malloc_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    self._memory = ''

  def run(self, n: int, kernel: collections.Counter | None = None) -> list[float]:
    self._child.stdin.write(f'{n}\n')
    self._child.stdin.flush()
    while not (line := self._child.stdout.readline()).startswith(_PEER_REPLY):
      if not line:
        raise RuntimeError(f'The peer process ended with status {self._child.wait()}')
    reply = json.loads(line[len(_PEER_REPLY) :])
    if kernel is not None:
      kernel.update(faults=reply['faults'], sys_s=reply['sys_s'])
    self._memory = reply['memory']
    return reply['times']

  def memory(self) -> str:
    return self._memory


_PEER_REPLY = 'peer: '


def serve_peer(peer: 'Timm') -> None:
  """The child's side of PeerProcess: reads a number of steps a line, answers with their timings."""
  for line in sys.stdin:
    kernel = collections.Counter(faults=0, sys_s=0.0)
    times = time_steps(peer.step, int(line), kernel)
    print(_PEER_REPLY + json.dumps({'times': times, 'memory': peer.memory(), **kernel}), flush=True)


def time_steps(
    step: Callable[[], None], n: int, kernel: collections.Counter | None = None
) -> list[float]:
  """Wall seconds of each of `n` steps; adds the process's minor page faults and system CPU seconds
  over them to `kernel` ('faults', 'sys_s'), where the kernel's time goes when memory is re-mapped.
  """
  times = []
  before = resource.getrusage(resource.RUSAGE_SELF)
  for _ in range(n):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
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


HEADER = (
    '| framework | variant | px | batch | dtype | mode | devices | fast paths | img/s (median) | '
    'img/s (fastest) | step ms (median) | compile s | model TFLOP/s | MFU | peak memory | '
    'faults/step | sys s/step |\n'
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|'
)


def row(
    name: str,
    args: argparse.Namespace,
    times: list[float],
    compile_s: str,
    flops: float,
    peak: float | None,
    memory: str,
    kernel: collections.Counter,
) -> str:
  step_s = statistics.median(times)
  tflops = flops * args.batch / step_s / 1e12
  mfu = f'{100 * tflops / peak:.1f}%' if peak else 'n/a'
  if name == 'vit_jax':
    devices = str(jax.device_count())
    fast = ', '.join(
        f
        for f, on in (
            ('dot_product_attention', args.attention != 'xla'),
            (f'remat={args.remat}', args.remat),
            ('scan', args.scan),
        )
        if on
    )
  else:  # timm: one PyTorch process with its own attention (scaled_dot_product_attention).
    devices, fast = '-', 'timm defaults'
  return (
      f'| {name} | {args.variant} | {args.image_size} | {args.batch} | {args.dtype} | {args.mode} '
      f'| {devices} | {fast or "-"} | {args.batch / step_s:.2f} | {args.batch / min(times):.2f} | '
      f'{1000 * step_s:.0f} | {compile_s} | {tflops:.3f} | {mfu} | {memory} | '
      f'{kernel["faults"] / len(times):.0f} | {kernel["sys_s"] / len(times):.2f} |'
  )


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument('--variant', default='ViT-B_16')
  parser.add_argument('--image_size', type=int, default=224)
  parser.add_argument('--batch', type=int, default=8)
  parser.add_argument('--dtype', default='float32', choices=train_setup.DTYPES)
  parser.add_argument(
      '--mesh', default="(('data', -1),)", help='config.mesh, as on the command line'
  )
  parser.add_argument('--mode', default='train', choices=('train', 'inference'))
  parser.add_argument('--attention', default='xla', choices=tuple(attention.ATTENTION_FNS))
  parser.add_argument('--remat', default=None, choices=variants.REMAT_POLICIES)
  parser.add_argument('--scan', action='store_true')
  parser.add_argument('--peer', default=None, choices=('timm',))
  parser.add_argument(
      '--peer-allocator',
      default='system',
      choices=('system', 'same'),
      help="the peer's malloc: the C library's in a child process, as timm's users "
      'run it, or the same as ours, in this process',
  )
  parser.add_argument('--serve-peer', action='store_true', help=argparse.SUPPRESS)
  parser.add_argument(
      '--peer-device', default='cpu', choices=('cpu', 'cuda'), help=argparse.SUPPRESS
  )
  parser.add_argument(
      '--warmup',
      type=int,
      default=4,
      help='untimed steps of each, after compiling (the first ones map their memory)',
  )
  parser.add_argument('--steps', type=int, default=2, help='timed steps of each per round')
  parser.add_argument('--rounds', type=int, default=8, help='rounds alternating ours and the peer')
  parser.add_argument(
      '--peak-tflops',
      default=None,
      help='peak TFLOP/s of the device, for MFU (default: known accelerators only), or '
      '"gemm": what jitted matmuls in --dtype reach here (for CPUs)',
  )
  parser.add_argument(
      '--compile-only', action='store_true', help='only compile, and print the times'
  )
  parser.add_argument('--header', action='store_true', help='print the table header first')
  parser.add_argument(
      '--profile',
      type=int,
      default=0,
      metavar='TOP',
      help='also print the TOP XLA ops of our step by time (a jax.profiler trace)',
  )
  return parser


def main() -> None:
  args = make_parser().parse_args()
  config = make_config(args)
  model = variants.get_model_config(config.variant, config.model.to_dict())
  flops = vit_flops(model, args.image_size) * (3 if args.mode == 'train' else 1)
  if args.serve_peer:
    serve_peer(Timm(model, config, args.mode, args.peer_device))
    return
  device = jax.devices()[0]
  if args.peak_tflops == 'gemm':
    peak = gemm_tflops(args.dtype)
    print(f'# peak for MFU: {peak:.3f} TFLOP/s, the fastest jitted {args.dtype} matmul (1024-4096)')
  elif args.peak_tflops:
    peak = float(args.peak_tflops)
  else:
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in device.device_kind), None)

  ours = Ours(config, args.mode)
  peer_malloc = {'system': "the C library's, own process", 'same': 'the same, same process'}
  print(f'# machine: {cpuinfo.summary()}')
  print(
      f'# malloc: ours {allocator.in_effect()}'
      + (f', peer {peer_malloc[args.peer_allocator]}' if args.peer else '')
      + f'; XLA:CPU ops on YNNPACK: {cpu_kernels.in_effect()} (vit_jax/runtime/cpu_kernels.py)'
  )
  print(
      f'# {device.device_kind} x{jax.device_count()}, {cpuinfo.usable_cores()} threads; ours: trace '
      f'{ours.trace_s:.1f} s, trace+compile {ours.compile_s:.1f} s; FLOPs/step: analytic '
      f'{flops * args.batch / 1e9:.1f} G, XLA cost analysis {ours.xla_flops / 1e9:.1f} G'
      + (' (scan body counted once)' if args.scan else '')
  )
  if (
      device.platform == 'gpu' and args.attention != 'xla'
  ):  # jax.nn.dot_product_attention may fall back.
    print(
        '# cuDNN fused attention calls in our compiled program: '
        f'{attention.cudnn_attention_calls(ours.compiled.as_text())}'
    )
  if args.compile_only:
    return
  ours.allocate()
  time_steps(ours.step, args.warmup)
  our_memory = peak_memory()  # Before the peer exists: the process is ours alone.
  peer = None
  if args.peer:
    # On a GPU, timm runs on it too (JAX leaves it room: XLA_PYTHON_CLIENT_MEM_FRACTION).
    peer_device = 'cuda' if device.platform == 'gpu' else 'cpu'
    peer = (
        PeerProcess(peer_device)
        if args.peer_allocator == 'system'
        else Timm(model, config, args.mode, peer_device)
    )
    peer.run(args.warmup)
  our_rounds, peer_rounds = [], []
  our_kernel, peer_kernel = collections.Counter(), collections.Counter()
  for _ in range(args.rounds):
    our_rounds.append(time_steps(ours.step, args.steps, our_kernel))
    if peer:
      peer_rounds.append(peer.run(args.steps, peer_kernel))
  our_times, peer_times = sum(our_rounds, []), sum(peer_rounds, [])

  if args.profile:
    profile(ours, steps=5, top=args.profile)
  if args.header:
    print(HEADER)
  print(
      row('vit_jax', args, our_times, f'{ours.compile_s:.1f}', flops, peak, our_memory, our_kernel)
  )
  if peer:
    print(row('timm', args, peer_times, '-', flops, peak, peer.memory(), peer_kernel))
    print(
        f'# ours/timm images/s: {statistics.median(peer_times) / statistics.median(our_times):.2f}x '
        f'at the median, {min(peer_times) / min(our_times):.2f}x at the fastest step '
        f'({len(our_times)} steps each)'
    )
    print(
        '# ours/timm images/s paired by round: %.2fx median (%.2f-%.2fx over %d rounds)'
        % (*paired_ratio(our_rounds, peer_rounds), args.rounds)
    )


if __name__ == '__main__':
  main()
