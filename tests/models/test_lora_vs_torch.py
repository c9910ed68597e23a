"""Low-rank adapters against Hugging Face peft's LoRA on a transformers ViT: the same logits from the
same base weights and adapters, the same initial draw, and the same merged weights."""

import numpy as np
import peft
import pytest
import torch
from flax import traverse_util

from torch_references import prepared_from_checkpoint, torch_outputs, transformers_vit_saved
from vit_jax.models import lora

pytestmark = pytest.mark.slow

SIZE, RANK, ALPHA = 8, 4, 12.0
# peft's module names (of a ViTForImageClassification's layer i) -> our adapters of encoderblock_i.
ADAPTED = {
    'attention.q_proj': 'MultiHeadDotProductAttention_1/query_lora',
    'attention.k_proj': 'MultiHeadDotProductAttention_1/key_lora',
    'attention.v_proj': 'MultiHeadDotProductAttention_1/value_lora',
    'attention.o_proj': 'MultiHeadDotProductAttention_1/out_lora',
    'mlp.fc1': 'MlpBlock_3/Dense_0_lora',
    'mlp.fc2': 'MlpBlock_3/Dense_1_lora',
}
OUR_TARGETS = ('query', 'key', 'value', 'out', 'mlp_in', 'mlp_out')


def _peft(vit: torch.nn.Module, targets) -> peft.PeftModel:
  config = peft.LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=targets, lora_dropout=0.0)
  return peft.get_peft_model(vit, config)


def _adapters(peft_model: peft.PeftModel) -> dict[str, np.ndarray]:
  """peft's adapters as our '/'-joined parameters: a = lora_A.weight^T, b = lora_B.weight^T (shaped
  as our kernels' sides by the caller)."""
  ours = {}
  for name, p in peft_model.named_parameters():
    if '.lora_' not in name:
      continue
    layer, rest = name.split('.layers.')[1].split('.', 1)
    module, factor = rest.split('.lora_')
    side = 'a' if factor.startswith('A') else 'b'
    ours[f'Transformer/encoderblock_{layer}/{ADAPTED[module]}/{side}'] = p.detach().numpy().T
  return ours


def _images(n: int = 4) -> np.ndarray:
  return np.random.RandomState(3).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _ours(tmp_path, directory, targets=OUR_TARGETS):
  return prepared_from_checkpoint(
      tmp_path / 'run',
      str(directory),
      SIZE,
      **{
          'model.lora_rank': RANK,
          'model.lora_alpha': ALPHA,
          'model.lora_targets': targets,
      },
  )


def test_the_adapted_model_computes_peft_lora_logits(tmp_path):
  vit = transformers_vit_saved(tmp_path / 'vit', SIZE, 4)
  modules = '|'.join(module.replace('.', r'\.') for module in ADAPTED)
  peft_model = _peft(vit, rf'.*\.layers\.\d+\.({modules})')  # One string: a regex (fullmatch).
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():  # peft's B starts at zeros: random ones, so the adapters count.
    for name, p in peft_model.named_parameters():
      if '.lora_' in name:
        p.copy_(0.3 * torch.randn(p.shape, generator=generator))
  run = _ours(tmp_path, tmp_path / 'vit')
  flat = traverse_util.flatten_dict(run.init_params, sep='/')
  adapters = _adapters(peft_model)
  assert sorted(adapters) == sorted(k for k in flat if lora.ADAPTER_PATH.search(k))
  flat.update({k: v.reshape(flat[k].shape) for k, v in adapters.items()})
  inputs = _images()
  ours = run.model.apply({'params': traverse_util.unflatten_dict(flat, sep='/')}, inputs)
  expected = torch_outputs(peft_model, inputs).logits.numpy()
  with peft_model.disable_adapter():
    without = torch_outputs(peft_model, inputs).logits.numpy()
  assert np.abs(expected - without).max() > 0.1  # The adapters change the logits.
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)

  # peft's merge_and_unload folds them as lora.merge does, kernel for kernel.
  merged_reference = peft_model.merge_and_unload()
  merged_reference.save_pretrained(tmp_path / 'merged')
  plain = prepared_from_checkpoint(tmp_path / 'plain', str(tmp_path / 'merged'), SIZE)
  merged = lora.merge(traverse_util.unflatten_dict(flat, sep='/'), ALPHA / RANK)
  for path, value in traverse_util.flatten_dict(plain.init_params, sep='/').items():
    np.testing.assert_allclose(
        traverse_util.flatten_dict(merged, sep='/')[path], value, atol=1e-5, err_msg=path
    )


def test_fresh_adapters_are_drawn_as_peft_draws_them(tmp_path):
  vit = transformers_vit_saved(tmp_path / 'vit', SIZE, 4)
  peft_model = _peft(vit, ['q_proj', 'v_proj'])
  theirs = _adapters(peft_model)
  run = _ours(tmp_path, tmp_path / 'vit', ('query', 'value'))
  ours = {
      k: v for k, v in traverse_util.flatten_dict(run.init_params, sep='/').items() if k in theirs
  }
  assert sorted(ours) == sorted(theirs)
  for path, value in ours.items():
    if path.endswith('/b'):  # Zeros: the adapted model starts as the checkpoint.
      np.testing.assert_array_equal(value, 0)
      np.testing.assert_array_equal(theirs[path], 0)
    else:  # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(32), 1/sqrt(32)) for 32 inputs.
      bound = 32**-0.5
      for drawn in (value, theirs[path]):
        assert np.abs(drawn).max() <= bound and np.abs(drawn).max() > 0.8 * bound
        assert np.std(drawn) == pytest.approx(bound / np.sqrt(3), rel=0.25)
