"""What the tests that compare with timm and transformers share: PyTorch models made fully random, and
their outputs on our NHWC images."""

import numpy as np
import torch


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Every tensor random: a zero head, bias or class token (timm's and transformers' inits) would hide
  a layout bug. LayerNorm scales stay near 1."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for layer in module.modules():
      for name, p in layer.named_parameters(recurse=False):
        noise = 0.3 * torch.randn(p.shape, generator=generator)
        p.copy_(1 + noise if isinstance(layer, torch.nn.LayerNorm) and name == 'weight' else noise)
  return module.eval()


def torch_outputs(module: torch.nn.Module, images: np.ndarray, **kwargs) -> torch.Tensor:
  with torch.no_grad():
    return module(torch.from_numpy(images.transpose(0, 3, 1, 2)), **kwargs)  # PyTorch takes NCHW.


def timm_input(reference: torch.nn.Module, images: np.ndarray) -> np.ndarray:
  """Our images x = 2u - 1 of pixels u in [0, 1] as the timm model's data config normalises u: the
  same pixels through each model's own preprocessing (ours folds a checkpoint's into its patch
  embedding)."""
  cfg = reference.pretrained_cfg
  pixels = (images + 1) / 2
  return ((pixels - np.asarray(cfg['mean'])) / np.asarray(cfg['std'])).astype(np.float32)
