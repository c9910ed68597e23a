"""docs/finetuning.md's hub walk-through, as a user runs it: a DINOv2 written by timm as the hub holds
it, fine-tuned with configs/finetune_dinov2.py (and with low-rank adapters, configs/finetune_lora.py)
through the CLI (tiny sizes, the digits), exported, and the export loaded by timm with our
predictions' logits."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch

import helpers
from torch_references import timm_saved
from vit_jax.checkpoints import run_dir, torch_files


@pytest.mark.parametrize(
    'config_file', ['configs/finetune_dinov2.py:cifar10', 'configs/finetune_lora.py:dinov2,cifar10']
)
def test_a_downloaded_dinov2_fine_tunes_and_exports_for_timm(tmp_path, config_file):
  timm_saved(
      tmp_path / 'dinov2',
      'vit_small_patch14_reg4_dinov2',
      img_size=28,
      patch_size=14,
      mlp_ratio=4.0,
      num_classes=0,
  )
  workdir = str(tmp_path / 'run')
  run = helpers.run_main(
      config_file,
      workdir,
      {
          'init_from': tmp_path / 'dinov2',
          'dataset': 'digits',
          'train_split': 'train',
          'eval_split': 'test',
          'image_size': 28,
          'batch_size': 16,
          'eval_batch_size': 120,
          'total_steps': 3,
          'eval_every_steps': 3,
          'checkpoint_every_steps': 3,
          'log_every_steps': 1,
          'dtype': 'float32',
          # The raw parameters, and a rate that moves the zero head in three steps.
          'polyak_decay': None,
          'lr.warmup_steps': 1,
          'lr.base': 0.05,
      },
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Model from' in run.stderr and 'folded its input normalisation' in run.stderr
  stored = json.loads(open(os.path.join(workdir, 'config.json')).read())
  assert stored['variant'] == 'checkpoint' and stored['model']['num_registers'] == 4
  if 'lora' in config_file:  # The downloaded weights are as they were; the adapters trained.
    assert ' trained), float32' in run.stderr
    saved = helpers.checkpoint_params(workdir, 3)
    block = saved['Transformer']['encoderblock_1']['MultiHeadDotProductAttention_1']
    assert np.abs(block['value_lora']['b']).max() > 0
    downloaded, _ = torch_files.read(str(tmp_path / 'dinov2' / 'model.safetensors'))
    width = block['value']['kernel'].shape[0]
    np.testing.assert_array_equal(  # timm's packed (3 D, D) qkv: the value's rows are the last D.
        block['value']['kernel'].reshape(width, width),
        np.asarray(downloaded['blocks.1.attn.qkv.weight'])[2 * width :].T,
    )
  out = str(tmp_path / 'export')
  export = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.export', f'--workdir={workdir}', f'--out={out}'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert export.returncode == 0, export.stderr[-3000:]
  trained = run_dir.load_trained(workdir)
  images = np.random.RandomState(0).uniform(-1, 1, (2, 28, 28, 3)).astype(np.float32)
  ours = np.asarray(trained.model.apply({'params': trained.params}, images))
  rebuilt = timm.create_model(f'local-dir:{out}/timm', pretrained=True).eval()
  with torch.no_grad():
    theirs = rebuilt(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()
  np.testing.assert_allclose(theirs, ours, atol=1e-4)
  assert (
      np.abs(ours).max() > 0.1
  )  # Three steps moved the zero head: the comparison is not of zeros.
