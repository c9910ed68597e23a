"""Accelerators the planner knows, the share of them a run gets, and the analytic FLOPs that turn a
ViT's step into time on them (and a BiT's forward pass into the compute axis of the scaling study).

  python -m vit_jax.tools.plan --config=configs/vit_b16_i1k.py --devices=128 --chip=tpu-v4

`CHIPS` maps the names `--chip` accepts to each chip's HBM and peak dense bfloat16 FLOP/s, from its
vendor's page. Memory is the datasheet's number read as GiB: HBM stacks come in binary sizes (an
"80GB" H100 shows 81559 MiB in nvidia-smi), and the planner's headroom covers what the runtime keeps.
"""

import dataclasses
import math
from typing import Any, Mapping, Optional

from vit_jax.models import mae as mae_model, patch_dropout, resnet, vit, vit_variants
from vit_jax.models.encoder import blocks_kv_heads

GiB = 2**30
T = 1e12


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  hbm_bytes: int
  peak_flops: float  # Dense (not 2:4 sparse) bfloat16 FLOP/s of one chip.


CHIPS: dict[str, Chip] = {
    # https://cloud.google.com/tpu/docs/v4: 275 TFLOP/s (bf16), 32 GiB HBM2 per chip.
    'tpu-v4': Chip('TPU v4', 32 * GiB, 275 * T),
    # https://cloud.google.com/tpu/docs/v5e: 197 TFLOP/s (bf16), 16 GB HBM2 per chip.
    'tpu-v5e': Chip('TPU v5e', 16 * GiB, 197 * T),
    # https://cloud.google.com/tpu/docs/v5p: 459 TFLOP/s (bf16), 95 GB HBM2e per chip.
    'tpu-v5p': Chip('TPU v5p', 95 * GiB, 459 * T),
    # https://cloud.google.com/tpu/docs/v6e: 918 TFLOP/s (bf16), 32 GB HBM per chip.
    'tpu-v6e': Chip('TPU v6e', 32 * GiB, 918 * T),
    # https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf:
    # BFLOAT16 Tensor Core 312 TFLOPS (624 with sparsity), 40GB HBM2 / 80GB HBM2e.
    'a100-40gb': Chip('A100 40GB', 40 * GiB, 312 * T),
    'a100-80gb': Chip('A100 80GB', 80 * GiB, 312 * T),
    # https://www.nvidia.com/en-us/data-center/h100/ (SXM): BFLOAT16 Tensor Core 1979 TFLOPS with
    # sparsity, so 989 dense; 80GB HBM3.
    'h100-80gb': Chip('H100 80GB', 80 * GiB, 989 * T),
    # https://www.nvidia.com/en-us/data-center/h200/ (SXM): the H100's 1979 (sparse) BFLOAT16 TFLOPS,
    # 141GB HBM3e.
    'h200-141gb': Chip('H200 141GB', 141 * GiB, 989 * T),
}


@dataclasses.dataclass(frozen=True)
class Target:
  """Where a run would train: `devices` chips, of whose memory the runtime keeps `headroom`."""

  chip: Chip
  devices: int
  mfu: float = 0.4  # The model FLOPs utilisation step times assume.
  headroom: float = 0.1

  @property
  def usable_bytes(self) -> int:
    return int(self.chip.hbm_bytes * (1 - self.headroom))

  def fits(self, estimate: Any) -> bool:
    """Whether a plan (anything with a `total` of bytes per device) fits what the runtime leaves."""
    return estimate.total <= self.usable_bytes


def get(name: str) -> Chip:
  if name not in CHIPS:
    raise ValueError(f'unknown chip {name!r}: use one of {", ".join(CHIPS)} (--chip=NAME)')
  return CHIPS[name]


def _block_macs(
    model: Mapping[str, Any], tokens: int, kv_heads: Optional[int] = None
) -> tuple[int, int]:
  """Multiply-adds of one encoder block of `kv_heads` key and value heads (None: its query heads):
  (all of them, those of the attention's batched matmuls).

  An axial block is two blocks over the same tokens whose attention spans a row (w tokens), then a
  column (h): square grids, h = w = sqrt(tokens). Differential attention's two maps of half-width
  queries and keys weigh the values twice (differential.py).
  """
  d, mlp = model['hidden_size'], model['mlp_dim']
  # The query and output projections, and the key and value ones of fewer heads (grouped).
  kv_width = d if kv_heads is None else d // model['num_heads'] * kv_heads
  projections = 2 * tokens * d * d + 2 * tokens * d * kv_width
  # A gated MLP (SwiGLU) has a third matrix of the same size, its linear layer.
  mlp_macs = (3 if model.get('mlp_gated') else 2) * tokens * d * mlp
  span = math.isqrt(tokens) if model.get('block') == 'axial' else tokens
  # Scores and weighted values.
  attention = (3 if model.get('diff_attention') else 2) * tokens * span * d
  if model.get('block') == 'axial':
    return 2 * (projections + mlp_macs + attention), 2 * attention
  return projections + attention + mlp_macs, attention


def _blocks_macs(model: Mapping[str, Any], tokens: int) -> tuple[int, int]:
  """`_block_macs` summed over the blocks, each of its key heads (model.num_kv_heads)."""
  each = [
      _block_macs(model, tokens, kv)
      for kv in blocks_kv_heads(model.get('num_kv_heads'), model['num_layers'])
  ]
  return sum(m for m, _ in each), sum(a for _, a in each)


def vit_tokens(model: Mapping[str, Any], image_size: int, train: bool = False) -> int:
  """The tokens a ViT's blocks attend over: the patches (at train time those `patch_dropout` keeps)
  and the tokens before them."""
  return _tokens(model, image_size, train)[1]


def _tokens(model: Mapping[str, Any], image_size: int, train: bool = False) -> tuple[int, int]:
  """(the patches, the tokens the blocks see: those before the patches and the patches, at train
  time those `model.patch_dropout` keeps)."""
  patches = (image_size // vit_variants.input_stride(model)) ** 2  # A hybrid's stem strides first.
  prefix = (
      vit.has_class_token(model['classifier'], model['class_token'])
      + model['distilled']
      + model['num_registers']
  )
  rate = model.get('patch_dropout') or 0.0
  seen = patch_dropout.kept(patches, rate) if train else patches
  return patches, prefix + seen


def vit_flops(
    model: Mapping[str, Any], image_size: int, num_classes: int = 1000, train: bool = False
) -> float:
  """Forward FLOPs of one image (2 per multiply-add): patch embedding, blocks, pre-logits, head;
  with `train`, the blocks over the patches that `model.patch_dropout` keeps.

  Per block with N tokens of width D: Q, K, V and output projections 4 N D^2 (K and V of fewer heads
  with num_kv_heads), attention scores and weighted values 2 N^2 D (3 N^2 D differential), MLP 2 N D
  mlp multiply-adds (3 N D mlp gated). Norms, softmax, GELU and a hybrid's ResNet
  stem are not counted.
  """
  p, d = model['patch_size'], model['hidden_size']
  patches, tokens = _tokens(model, image_size, train)
  macs = patches * p * p * 3 * d + _blocks_macs(model, tokens)[0]
  width = model['representation_size'] or d
  macs += d * width * (model['representation_size'] is not None) + width * num_classes
  return 2.0 * macs


def mae_flops(
    model: Mapping[str, Any], image_size: int, mae: Mapping[str, Any]
) -> tuple[float, int, int]:
  """A masked autoencoder's (config.task='mae', `mae` config.mae) forward FLOPs of one image, and the
  multiply-adds of its blocks (all, the attention's batched ones), as `vit_flops` and `_blocks_macs`
  count them: the patch embedding of every patch, the encoder's blocks over the prefix and the visible
  patches, the decoder's embedding of those, its blocks over the prefix and every patch, and its pixel
  predictions."""
  p, d = vit_variants.input_stride(model), model['hidden_size']
  patches, tokens = _tokens(model, image_size)
  seen = tokens - patches + mae_model.visible_patches(patches, mae['mask_ratio'])
  width = mae['decoder_hidden_size']
  decoder = {
      'hidden_size': width,
      'mlp_dim': mae['decoder_mlp_dim'],
      'num_heads': mae['decoder_num_heads'],
      'num_layers': mae['decoder_num_layers'],
  }
  encoder_blocks, encoder_attention = _blocks_macs(model, seen)
  decoder_blocks, decoder_attention = _blocks_macs(decoder, tokens)
  pixels = p * p * 3
  macs = patches * pixels * d + encoder_blocks + seen * d * width + decoder_blocks
  macs += patches * width * pixels
  return 2.0 * macs, encoder_blocks + decoder_blocks, encoder_attention + decoder_attention


def _conv_macs(
    size: int, kernel: int, stride: int, pad: int, channels: tuple[int, int]
) -> tuple[int, int]:
  """(output size, multiply-adds) of a square convolution on a square input: the kernel taps that fall
  on the input, not on its padding, as XLA's cost analysis counts them."""
  out = (size + 2 * pad - kernel) // stride + 1
  taps = sum(min(size, o * stride - pad + kernel) - max(0, o * stride - pad) for o in range(out))
  return out, taps * taps * channels[0] * channels[1]


def bit_flops(model: Mapping[str, Any], image_size: int, num_classes: int = 1000) -> float:
  """Forward FLOPs of one image through a BiT (2 per multiply-add): its convolutions and the head.

  GroupNorm, ReLU, pooling and the weight standardisation (per parameter, not per image) are not
  counted; nor are the taps of the 3x3 and 7x7 kernels on zero padding, as XLA counts them (whole
  windows, the count of most papers, are 3.6% more for BiT-R50x1 at 224 px).
  """
  width = resnet.root_width(model['resnet_width_factor'])
  size, macs = _conv_macs(image_size, 7, 2, 3, (3, width))
  size = (size + 2 - 3) // 2 + 1  # The max-pool of the zero-padded root.
  channels = width
  for s, units in enumerate(model['resnet_layers']):
    features = width * 2**s
    for u in range(units):
      stride = 2 if s and not u else 1
      if not u:  # The projected shortcut.
        macs += _conv_macs(size, 1, stride, 0, (channels, 4 * features))[1]
      macs += _conv_macs(size, 1, 1, 0, (channels, features))[1]
      out, conv2 = _conv_macs(size, 3, stride, 1, (features, features))
      macs += conv2 + _conv_macs(out, 1, 1, 0, (features, 4 * features))[1]
      size, channels = out, 4 * features
  return 2.0 * (macs + channels * num_classes)


# Forward FLOPs of one image: (model config, image size, classes) -> FLOPs, by variants.FAMILIES key.
FLOPS = {'ViT': vit_flops, 'BiT': bit_flops}


# What each remat policy recomputes in the backward pass, of the matmuls: every block's ('blocks'), the
# attention's batched ones ('attention': the policies that save only dots without batch dimensions),
# or none (the policies that save every dot recompute only elementwise work, which is not counted).
RECOMPUTED = {
    'nothing_saveable': 'blocks',
    'dots_with_no_batch_dims_saveable': 'attention',
    'checkpoint_dots_with_no_batch_dims': 'attention',
}


def train_flops(
    model: Mapping[str, Any],
    image_size: int,
    num_classes: int,
    remat: str | None,
    gradients: tuple[float, float] = (1.0, 1.0),
    mae: Optional[Mapping[str, Any]] = None,
) -> float:
  """Training FLOPs of one image: the forward pass, the backward pass and the remat recomputation;
  of a masked autoencoder's (`mae_flops`) where `mae` (config.mae of a task='mae' run) is given.

  `gradients`: (whether the activations' gradients are computed through the blocks, the share of the
  weights whose gradients are), each as many FLOPs as the forward pass when whole: (1, 1), the
  backward twice the forward, when everything trains; (1, ~0) for low-rank adapters; (0, ~0) for a
  linear probe (train/step.py computes no gradient of a frozen parameter)."""
  if mae is None:
    forward = vit_flops(model, image_size, num_classes, train=True)
    blocks, attention = _blocks_macs(model, _tokens(model, image_size, train=True)[1])
  else:
    forward, blocks, attention = mae_flops(model, image_size, mae)
  recomputed = {'blocks': blocks, 'attention': attention}.get(RECOMPUTED.get(remat), 0)
  through_blocks, weight_share = gradients
  return (1 + through_blocks + weight_share) * forward + 2.0 * recomputed * through_blocks


def step_seconds(flops: float, target: Target) -> float:
  """A step of `flops` (all devices together) at the target's MFU: communication, input and anything
  else that keeps the chips from their peak is in that fraction."""
  return flops / target.devices / (target.chip.peak_flops * target.mfu)
