"""peft's LoRA adapters as config.init_from (vit_jax/checkpoints/peft_adapters.py): the adapter
directory PeftModel.save_pretrained writes, over its base, reads as the base with the adapters folded
in and peft's trained classifier: the logits of the PeftModel."""

import json

import numpy as np
import peft
import pytest
import torch

from torch_references import prepared_from_checkpoint, torch_outputs, transformers_vit_saved
from flax import traverse_util

from vit_jax.checkpoints import peft_transformers, torch_files
from vit_jax.models import lora

SIZE = 8


def _saved(tmp_path, **lora) -> peft.PeftModel:
  """A random transformers ViT saved as the base, and peft's adapters over it (random, the classifier
  trained whole) saved beside it, their config naming the base by a path relative to them."""
  vit = transformers_vit_saved(tmp_path / 'base', SIZE, 4)
  settings = dict(r=4, lora_alpha=12, target_modules=['q_proj', 'v_proj', 'fc2'])
  model = peft.get_peft_model(
      vit, peft.LoraConfig(**{**settings, **lora}, modules_to_save=['classifier'])
  )
  generator = torch.Generator().manual_seed(1)
  with torch.no_grad():  # B starts at zeros and the classifier at the base's: both random here.
    for name, p in model.named_parameters():
      if '.lora_' in name or 'modules_to_save' in name:
        p.copy_(0.3 * torch.randn(p.shape, generator=generator))
  model.save_pretrained(tmp_path / 'adapter')
  config_file = tmp_path / 'adapter' / 'adapter_config.json'
  config = json.loads(config_file.read_text())
  config_file.write_text(json.dumps({**config, 'base_model_name_or_path': '../base'}))
  return model.eval()


def _as_transformers_4_names(adapter_dir) -> None:
  """The adapters, and the modules alpha_pattern names, renamed as peft names them over transformers
  4's ViT (the hub's older adapters: 'vit.encoder.layer.0.attention.attention.query.lora_A.weight'),
  which its files keep."""
  config_file = adapter_dir / 'adapter_config.json'
  config = json.loads(config_file.read_text())
  alphas = {
      peft_transformers.file_name(k, 'vit'): v
      for k, v in (config.get('alpha_pattern') or {}).items()
  }
  config_file.write_text(json.dumps({**config, 'alpha_pattern': alphas}))
  weights = str(adapter_dir / 'adapter_model.safetensors')
  tensors, _ = torch_files.read(weights)
  renamed = {}
  for key, value in tensors.items():
    module, dot, factor = key.partition('.lora_')
    renamed[peft_transformers.file_name(module, 'vit') + dot + factor if dot else key] = value
  assert any('attention.attention.query.lora_A' in k for k in renamed)
  torch_files.write_safetensors(renamed, weights)


@pytest.mark.parametrize('use_rslora', [False, True])
@pytest.mark.parametrize('names', ['transformers 5', 'transformers 4'])
@pytest.mark.parametrize(
    'patterns',
    [{}, {'rank_pattern': {'v_proj': 2}, 'alpha_pattern': {'layers.1.mlp.fc2': 5}}],
    ids=['one rank', 'rank and alpha patterns'],
)
def test_an_adapter_directory_loads_as_its_peft_model(tmp_path, use_rslora, names, patterns):
  reference = _saved(tmp_path, use_rslora=use_rslora, **patterns)
  if patterns:  # What the patterns name differs from the rest.
    assert (
        reference.base_model.model.vit.layers[0].attention.v_proj.lora_A['default'].out_features
        == 2
    )
    assert reference.base_model.model.vit.layers[1].mlp.fc2.scaling['default'] == 5 / (
        2 if use_rslora else 4
    )
  if names == 'transformers 4':
    _as_transformers_4_names(tmp_path / 'adapter')
  run = prepared_from_checkpoint(tmp_path / 'run', str(tmp_path / 'adapter'), SIZE)
  inputs = np.random.RandomState(2).uniform(-1, 1, (3, SIZE, SIZE, 3)).astype(np.float32)
  expected = torch_outputs(reference, inputs).logits.numpy()
  with reference.disable_adapter():  # The base alone (its own classifier): far from it.
    assert np.abs(torch_outputs(reference, inputs).logits.numpy() - expected).max() > 0.1
  ours = run.model.apply({'params': run.init_params}, inputs)
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)
  assert run.model_config['lora_rank'] is None  # Folded: a plain ViT, fine-tuned as any.


def test_adapters_folding_cannot_express_are_one_line_errors(tmp_path):
  _saved(tmp_path, use_dora=True)
  with pytest.raises(
      ValueError, match=r'adapter_config.json: use_dora=True; vit_jax folds LoRA adapters whose '
  ) as raised:
    prepared_from_checkpoint(tmp_path / 'run', str(tmp_path / 'adapter'), SIZE)
  assert '\n' not in str(raised.value)


def _adapters(params) -> dict[str, np.ndarray]:
  flat = traverse_util.flatten_dict(params, sep='/')
  return {p: np.asarray(x) for p, x in flat.items() if lora.ADAPTER_PATH.search(p)}


@pytest.mark.parametrize(
    'targets, rank, folded',
    [
        (('query', 'value', 'mlp_out'), 4, 0),
        (('query', 'value'), 4, 2),  # fc2's adapters fold into the kernels, one a block.
        (('query', 'value', 'mlp_out'), 6, 0),  # Two more directions a layer, b zeros.
    ],
    ids=['every adapted layer', 'some', 'a higher rank'],
)
def test_a_model_with_adapters_keeps_peft_adapters_as_its_own(
    tmp_path, targets, rank, folded, caplog
):
  reference = _saved(tmp_path)
  with caplog.at_level('INFO'):
    run = prepared_from_checkpoint(
        tmp_path / 'run',
        str(tmp_path / 'adapter'),
        SIZE,
        **{'model.lora_rank': rank, 'model.lora_targets': targets},
    )
  inputs = np.random.RandomState(2).uniform(-1, 1, (3, SIZE, SIZE, 3)).astype(np.float32)
  ours = run.model.apply({'params': run.init_params}, inputs)
  np.testing.assert_allclose(
      np.asarray(ours), torch_outputs(reference, inputs).logits.numpy(), atol=1e-4
  )
  adapters = _adapters(run.init_params)
  layers = {'query', 'value', 'Dense_1'} if 'mlp_out' in targets else {'query', 'value'}
  assert {p.split('/')[-2].removesuffix(lora.SUFFIX) for p in adapters} == layers
  block = 'Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query'
  # The base's kernel as it was, the update in the adapter: its b trained, not zeros.
  plain = prepared_from_checkpoint(tmp_path / 'plain', str(tmp_path / 'base'), SIZE)
  flat = traverse_util.flatten_dict(run.init_params, sep='/')
  np.testing.assert_array_equal(
      flat[f'{block}/kernel'],
      traverse_util.flatten_dict(plain.init_params, sep='/')[f'{block}/kernel'],
  )
  b = adapters[f'{block}{lora.SUFFIX}/b']
  assert b.shape[0] == rank
  assert np.abs(b[:4]).min(axis=tuple(range(1, b.ndim))).min() > 0  # Four directions trained.
  assert not b[4:].any()  # Directions beyond the update's rank start at zero...
  a = adapters[f'{block}{lora.SUFFIX}/a']
  assert np.abs(a[:, 4:]).max(initial=1) > 0  # ...with a drawn, so that they train.
  assert f"kept its adapters' updates of {len(layers) * 2} layers" in caplog.text
  assert (f'folded those of {folded} layers' in caplog.text) == bool(folded)


def test_peft_adapters_of_a_higher_rank_than_the_models_are_one_line(tmp_path):
  _saved(tmp_path)
  with pytest.raises(
      ValueError, match=r'has rank 4, beyond model.lora_rank=2: set --config.model.lora_rank=4'
  ) as raised:
    prepared_from_checkpoint(
        tmp_path / 'run', str(tmp_path / 'adapter'), SIZE, **{'model.lora_rank': 2}
    )
  assert '\n' not in str(raised.value)
