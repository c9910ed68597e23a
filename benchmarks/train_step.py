"""Speed of the real train step (forward, backward, AdamW update) or forward pass, beside timm's.

  python benchmarks/train_step.py --variant=ViT-B_16 --batch=8 --peer=timm --header
  python benchmarks/train_step.py --variant=ViT-Ti_16 --batch=32 --mode=inference --peer=timm
  python benchmarks/train_step.py --variant=ViT-B_16 --batch=8 --compile-only [--scan]
  XLA_FLAGS=--xla_force_host_platform_device_count=2 python benchmarks/train_step.py --mesh="(('data', 2),)"
  python benchmarks/train_step.py --variant=ViT-B_16 --batch=8 --lora_rank=16 --peer=peft

Our step is `vit_jax.train.step.train_step`, built as the training loop builds it (model, optimizer, loss
and shardings from a config of vit_jax/defaults.py; a scanned model's blocks stacked in the state, as
training keeps them) and jitted with the state donated; `--mode=inference` times the jitted forward
pass. One markdown row per framework: images/s at the median and at the fastest step, median step ms,
compile s, model TFLOP/s and MFU at the median, peak memory. Model FLOPs are the analytic count of
`vit_flops` (training: 3x the forward pass, of the patches `--patch_dropout` keeps), printed beside XLA's cost analysis of the compiled program.
Each step is waited for before the next is dispatched, unless `--in-flight`: then a round's steps are
dispatched back to back and waited for once, as the training loop runs them (on an accelerator the
default leaves it idle while each step is dispatched; the CLI's images/s compare with --in-flight's).

`--lora_rank=R` trains low-rank adapters of `--lora_targets` and the head alone (vit_jax/models/lora.py);
`--peer=peft` is then Hugging Face peft's LoRA of the same layers on a transformers ViT
(peft_peer.py), its model FLOPs without the frozen weights' gradients (2x the forward pass).
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
import statistics
from typing import Any

import jax
import ml_collections

from vit_jax import defaults  # pylint: disable=wrong-import-position
from vit_jax.planning.chips import vit_flops  # pylint: disable=wrong-import-position
from vit_jax.train import field_checks  # pylint: disable=wrong-import-position
from vit_jax.models import attention, fp8, variants, vit_checks  # pylint: disable=wrong-import-position
import peft_peer  # pylint: disable=wrong-import-position
import step_harness  # pylint: disable=wrong-import-position
import timm_peer  # pylint: disable=wrong-import-position

# --peer: who trains a ViT of the same shape, beside ours.
PEERS = {'timm': timm_peer.Timm, 'peft': peft_peer.PeftVit}

# Dense bfloat16 peak TFLOP/s by a substring of `device.device_kind`; CPUs need --peak-tflops.
PEAK_TFLOPS = {
    'H100': 989.0,
    'H200': 989.0,
    'A100': 312.0,
    'TPU v4': 275.0,
    'TPU v5 lite': 197.0,
    'TPU v5e': 197.0,
}


def make_config(args: argparse.Namespace) -> ml_collections.ConfigDict:
  config = defaults.get_config()
  config.variant, config.image_size, config.batch_size = args.variant, args.image_size, args.batch
  config.dtype, config.mesh, config.total_steps = args.dtype, ast.literal_eval(args.mesh), 1000
  config.model.attention, config.model.remat, config.model.scan = (
      args.attention,
      args.remat,
      args.scan,
  )
  config.model.matmul, config.model.patch_dropout = args.matmul, args.patch_dropout
  if args.lora_rank:  # Low-rank adapters: they and the head train (vit_jax/models/lora.py).
    config.model.lora_rank, config.model.lora_targets = args.lora_rank, tuple(args.lora_targets)
  return config


def step_flops(model: dict[str, Any], args: argparse.Namespace) -> float:
  """Model FLOPs of a step of one image: the forward pass, and in training the gradients of the
  activations (as many) and of the trained weights (as many again; adapters: next to none)."""
  passes = 1 if args.mode == 'inference' else (2 if args.lora_rank else 3)
  return passes * vit_flops(model, args.image_size, train=args.mode == 'train')


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
            ('matmul=fp8 (MFU against the bf16 peak)', args.matmul == 'fp8'),
            (f'remat={args.remat}', args.remat),
            ('scan', args.scan),
            (f'patch_dropout={args.patch_dropout}', args.patch_dropout),
            (f'LoRA rank {args.lora_rank} of {",".join(args.lora_targets)}', args.lora_rank),
        )
        if on
    )
  else:  # One PyTorch process with its own attention (scaled_dot_product_attention).
    devices, fast = '-', f'{name} defaults'
    fast += f', patch_drop_rate={args.patch_dropout}' if args.patch_dropout else ''
  return (
      f'| {name} | {args.variant} | {args.image_size} | {args.batch} | {args.dtype} | {args.mode}'
      f'{" (in flight)" if args.in_flight else ""} '
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
  parser.add_argument('--dtype', default='float32', choices=field_checks.DTYPES)
  parser.add_argument(
      '--mesh', default="(('data', -1),)", help='config.mesh, as on the command line'
  )
  parser.add_argument('--mode', default='train', choices=('train', 'inference'))
  parser.add_argument('--attention', default='xla', choices=tuple(attention.ATTENTION_FNS))
  parser.add_argument('--matmul', default='default', choices=tuple(fp8.MATMULS))
  parser.add_argument('--remat', default=None, choices=vit_checks.REMAT_POLICIES)
  parser.add_argument('--scan', action='store_true')
  parser.add_argument(
      '--patch_dropout',
      type=float,
      default=0.0,
      help="model.patch_dropout (the peer's patch_drop_rate): the share of the patches dropped",
  )
  parser.add_argument(
      '--peer',
      default=None,
      choices=tuple(PEERS),
      help="timm's VisionTransformer; with --lora_rank, peft's LoRA on a transformers ViT",
  )
  parser.add_argument(
      '--lora_rank', type=int, default=None, help='low-rank adapters of this rank (model.lora_rank)'
  )
  parser.add_argument(
      '--lora_targets',
      type=lambda s: s.split(','),
      default=('query', 'value'),
      help='their layers, e.g. query,value (model.lora_targets)',
  )
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
  parser.add_argument(
      '--in-flight',
      action='store_true',
      help="a round's steps dispatched back to back and waited for once, as the training loop "
      'runs them (each step: their mean); by default each step is waited for, which on an '
      'accelerator leaves it idle while the next one is dispatched',
  )
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
  flops = step_flops(model, args)
  if args.peer and (args.peer == 'peft') != bool(args.lora_rank):
    raise SystemExit('--peer=peft times LoRA (it needs --lora_rank), --peer=timm full training')
  if args.serve_peer:
    timm_peer.serve_peer(PEERS[args.peer](model, config, args.mode, args.peer_device))
    return
  device = jax.devices()[0]
  if args.peak_tflops == 'gemm':
    peak = step_harness.gemm_tflops(args.dtype)
    print(f'# peak for MFU: {peak:.3f} TFLOP/s, the fastest jitted {args.dtype} matmul (1024-4096)')
  elif args.peak_tflops:
    peak = float(args.peak_tflops)
  else:
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in device.device_kind), None)

  ours = step_harness.Ours(config, model, args.mode)
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
  if device.platform == 'gpu' and args.matmul == 'fp8':  # Whether XLA rewrote them for FP8 cores.
    print(
        '# cuBLASLt FP8 matmul calls in our compiled program: '
        f'{fp8.fp8_matmul_calls(ours.compiled.as_text())}'
    )
  if device.platform == 'gpu':  # Which matmuls add the MLP's bias and GELU themselves.
    print(
        '# cuBLASLt epilogues in our compiled program: '
        f'{dict(step_harness.cublaslt_epilogues(ours.compiled.as_text()))}'
    )
  if args.compile_only:
    return
  ours.allocate()
  step_harness.time_steps(ours.step, args.warmup)
  our_memory = step_harness.peak_memory()  # Before the peer exists: the process is ours alone.
  peer = None
  if args.peer:
    # On a GPU, timm runs on it too (JAX leaves it room: XLA_PYTHON_CLIENT_MEM_FRACTION).
    peer_device = 'cuda' if device.platform == 'gpu' else 'cpu'
    peer = (
        timm_peer.PeerProcess(peer_device)
        if args.peer_allocator == 'system'
        else PEERS[args.peer](model, config, args.mode, peer_device)
    )
    peer.run(args.warmup)
  our_rounds, peer_rounds = [], []
  our_kernel, peer_kernel = collections.Counter(), collections.Counter()
  for _ in range(args.rounds):
    our_rounds.append(ours.run(args.steps, our_kernel, in_flight=args.in_flight))
    if peer:
      peer_rounds.append(peer.run(args.steps, peer_kernel, in_flight=args.in_flight))
  our_times, peer_times = sum(our_rounds, []), sum(peer_rounds, [])

  if args.profile:
    step_harness.profile(ours, steps=5, top=args.profile)
  if args.header:
    print(HEADER)
  print(
      row('vit_jax', args, our_times, f'{ours.compile_s:.1f}', flops, peak, our_memory, our_kernel)
  )
  if peer:
    name = args.peer
    print(row(name, args, peer_times, '-', flops, peak, peer.memory(), peer_kernel))
    print(
        f'# ours/{name} images/s: '
        f'{statistics.median(peer_times) / statistics.median(our_times):.2f}x '
        f'at the median, {min(peer_times) / min(our_times):.2f}x at the fastest step '
        f'({len(our_times)} steps each)'
    )
    print(
        f'# ours/{name} images/s paired by round: %.2fx median (%.2f-%.2fx over %d rounds)'
        % (*step_harness.paired_ratio(our_rounds, peer_rounds), args.rounds)
    )


if __name__ == '__main__':
  main()
