"""timm (PyTorch) as the benchmarks' peer, run as its users run it: imported by `load`, recorded by
`machine` (the versions RESULTS.md lists), a ViT of our model's shape timed step by step (`Timm`,
train_step.py), in a child process with the C library's malloc (`PeerProcess`: train_step.py here,
timm_loop.py's `run_timm` for a whole training run).
"""

import collections
import functools
import importlib.metadata
import json
import subprocess
import sys
from typing import Any

import ml_collections

from vit_jax.runtime import allocator, cpuinfo
import step_harness

NUM_CLASSES = step_harness.NUM_CLASSES


def load(device: str = 'cpu') -> tuple[Any, Any]:
  """(timm, torch) with the submodules the benchmarks use, imported for `device` ('cpu', 'cuda')."""
  if device == 'cpu':  # triton's import crashes after TensorFlow's; CPU never needs it.
    sys.modules.setdefault('triton', None)
  import timm  # pylint: disable=g-import-not-at-top
  import timm.data  # pylint: disable=g-import-not-at-top,unused-import
  import timm.loss  # pylint: disable=g-import-not-at-top,unused-import
  import timm.models.vision_transformer  # pylint: disable=g-import-not-at-top,unused-import
  import timm.optim  # pylint: disable=g-import-not-at-top,unused-import
  import timm.scheduler  # pylint: disable=g-import-not-at-top,unused-import
  import timm.utils  # pylint: disable=g-import-not-at-top,unused-import
  import torch  # pylint: disable=g-import-not-at-top

  return timm, torch


def machine() -> str:
  """The machine (vit_jax/runtime/cpuinfo.py) and the versions, as benchmarks/RESULTS.md records."""
  versions = ', '.join(
      f'{name} {importlib.metadata.version(name)}' for name in ('jax', 'torch', 'timm')
  )
  return f'# machine: {cpuinfo.summary()}; {versions}'


class Timm(step_harness.Steps):
  """timm's VisionTransformer of the same shape: forward, backward, clipping and AdamW in PyTorch."""

  def __init__(
      self, model: dict[str, Any], config: ml_collections.ConfigDict, mode: str, device: str = 'cpu'
  ):
    torch = load(device)[1]
    self.torch, self.mode, self.device = torch, mode, device
    torch.set_num_threads(cpuinfo.usable_cores())
    torch.manual_seed(0)
    self.net = self.network(model, config).train(mode == 'train').to(device)
    self.images = (
        torch.rand(config.batch_size, 3, config.image_size, config.image_size) * 2 - 1
    ).to(device)
    self.labels = torch.randint(0, NUM_CLASSES, (config.batch_size,)).to(device)
    trained = [p for p in self.net.parameters() if p.requires_grad]
    self.optimizer = torch.optim.AdamW(trained, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1)
    self.dtype = getattr(torch, config.dtype)

  def network(self, model: dict[str, Any], config: ml_collections.ConfigDict) -> Any:
    """The PyTorch module of our model's shape, its every parameter trained."""
    timm, torch = load(self.device)
    return timm.models.vision_transformer.VisionTransformer(
        img_size=config.image_size,
        patch_size=model['patch_size'],
        embed_dim=model['hidden_size'],
        depth=model['num_layers'],
        num_heads=model['num_heads'],
        mlp_ratio=model['mlp_dim'] / model['hidden_size'],
        num_classes=NUM_CLASSES,
        global_pool='token' if model['classifier'] == 'token' else 'avg',
        class_token=model['classifier'] == 'token',
        patch_drop_rate=model['patch_dropout'],
        act_layer=functools.partial(torch.nn.GELU, approximate='tanh'),
    )  # Ours is the tanh GELU.

  def memory(self) -> str:
    """Peak memory, after the steps, as the child process reports its own."""
    if self.device == 'cuda':
      return f'{self.torch.cuda.max_memory_allocated() / 2**30:.2f} GB (device 0)'
    return f'{step_harness.max_rss_gb():.2f} GB (process max RSS)'

  def wait(self) -> None:
    """Until the steps queued on the GPU are done (on CPU each step is done when it returns)."""
    if self.device == 'cuda':
      self.torch.cuda.synchronize()

  def logits(self, images: Any) -> Any:
    return self.net(images)

  def dispatch(self) -> None:
    torch = self.torch
    with torch.autocast(self.device, dtype=self.dtype, enabled=self.dtype != torch.float32):
      if self.mode == 'train':
        loss = torch.nn.functional.cross_entropy(self.logits(self.images), self.labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)  # As ours: grad_clip_norm=1.
        self.optimizer.step()
      else:
        with torch.inference_mode():
          self.logits(self.images)


_PEER_REPLY = 'peer: '


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

  def run(
      self, n: int, kernel: collections.Counter | None = None, in_flight: bool = False
  ) -> list[float]:
    self._child.stdin.write(f'{n} {int(in_flight)}\n')
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


def serve_peer(peer: 'Timm') -> None:
  """The child's side of PeerProcess: reads a number of steps and whether they are in flight at once
  a line, answers with their timings."""
  for line in sys.stdin:
    kernel = collections.Counter(faults=0, sys_s=0.0)
    n, in_flight = map(int, line.split())
    times = peer.run(n, kernel, in_flight=bool(in_flight))
    print(_PEER_REPLY + json.dumps({'times': times, 'memory': peer.memory(), **kernel}), flush=True)
