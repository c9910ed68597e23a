"""A run's adapters as peft's (vit_jax/checkpoints/peft_export.py): each timm module's factors hold
the update the run's adapters make to it (B A * alpha / r; the fused query-key-value projection's
parts block-diagonal, at r and alpha per part), what trained beside them is saved whole, and what peft
cannot hold over timm's model is one line. peft itself loading them over timm's model is
test_peft_export_vs_torch.py."""

import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import helpers
from vit_jax.checkpoints import (
    peft_adapters,
    peft_export,
    timm_export_args,
    timm_export_tensors,
    torch_files,
)
from vit_jax.models import lora, variants

ALL = ('query', 'key', 'value', 'out', 'mlp_in', 'mlp_out')
TINY = dict(num_layers=2, hidden_size=32, num_heads=2, mlp_dim=48, lora_rank=4, lora_alpha=6.0)


def _adapted(**fields):
  """Random parameters (the adapters' b too) of a tiny adapted ViT of `fields`, its resolved model
  config and its adapters' Spec."""
  fields = {**TINY, **fields}
  model_config = variants.get_model_config('ViT-testing_4', fields)
  model = variants.make_model('ViT-testing_4', fields, num_classes=5, dtype=jnp.float32)
  spec = lora.spec(4, 6.0, 0.0, model_config['lora_targets'])
  return helpers.random_params(model, 8), model_config, spec


def _exported(params, model_config, spec, trained=lambda path: path.startswith('head/'), base=None):
  """peft_export.export over a base of the run's own tensors (timm's names of its class), or `base`'s
  shapes."""
  cls = timm_export_args.timm_class(model_config)
  ours = timm_export_tensors.to_state_dict(_plain(params), cls)
  shapes = base or {name: x.shape for name, x in ours.items()}
  checkpoint = peft_export.Base('base', '', 'timm', shapes, {}, False)
  return peft_export.export(params, spec, trained, model_config, checkpoint)


def _plain(params):
  flat = traverse_util.flatten_dict(params, sep='/')
  return traverse_util.unflatten_dict(
      {p: x for p, x in flat.items() if not lora.ADAPTER_PATH.search(p)}, sep='/'
  )


@pytest.mark.parametrize(
    'fields, modules, fused',
    [
        (dict(lora_targets=ALL), {'attn.qkv', 'attn.proj', 'mlp.fc1', 'mlp.fc2'}, {'attn.qkv': 3}),
        # Query and value: rank 2r, zeros in the key's rows.
        (dict(), {'attn.qkv'}, {'attn.qkv': 2}),
        (dict(lora_targets=('key', 'mlp_out')), {'attn.qkv', 'mlp.fc2'}, {}),
        # Eva's class: separate projections (grouped-query attention), a gated MLP's two first layers
        # packed in one.
        (
            dict(lora_targets=ALL, num_kv_heads=1, mlp_gated=True, mlp_activation='silu'),
            {'attn.q_proj', 'attn.k_proj', 'attn.v_proj', 'attn.proj', 'mlp.fc1', 'mlp.fc2'},
            {'mlp.fc1': 2},
        ),
    ],
    ids=['all', 'query and value', 'key and mlp_out', 'grouped, gated'],
)
def test_each_timm_module_gets_the_update_of_its_adapted_parts(fields, modules, fused):
  params, model_config, spec = _adapted(**fields)
  tensors, config = _exported(params, model_config, spec)
  cls = timm_export_args.timm_class(model_config)
  base = timm_export_tensors.to_state_dict(_plain(params), cls)
  merged = timm_export_tensors.to_state_dict(lora.merge(params, spec.scale), cls)
  adapted = set()
  for name, weight in merged.items():
    module = name.removesuffix('.weight')
    if module not in config['target_modules']:
      np.testing.assert_array_equal(weight, base[name], err_msg=name)
      continue
    adapted.add(module)
    a = tensors[f'{peft_adapters.PREFIX}{module}.lora_A.weight']
    b = tensors[f'{peft_adapters.PREFIX}{module}.lora_B.weight']
    parts = fused.get(module.split('.', 2)[-1], 1)
    key = re.escape(module)
    assert a.shape[0] == b.shape[1] == config['rank_pattern'].get(key, config['r']) == 4 * parts
    alpha = config['alpha_pattern'].get(key, config['lora_alpha'])
    assert alpha == 6.0 * parts
    np.testing.assert_allclose(base[name] + alpha / a.shape[0] * b @ a, weight, atol=1e-5)
    assert np.abs(b @ a).max() > 0.1, name
  assert (
      adapted
      == set(config['target_modules'])
      == {f'blocks.{i}.{m}' for i in range(2) for m in modules}
  )
  # The new head trained: saved whole, as peft saves modules_to_save.
  assert config['modules_to_save'] == ['head']
  for name in ('head.weight', 'head.bias'):
    np.testing.assert_array_equal(tensors[peft_adapters.PREFIX + name], base[name])
  assert config['base_model_name_or_path'] == 'base' and config['peft_type'] == 'LORA'


def test_norms_that_train_beside_the_adapters_are_saved_whole_with_the_head():
  params, model_config, spec = _adapted()
  trained = lambda path: path.startswith('head/') or 'LayerNorm_0' in path
  tensors, config = _exported(params, model_config, spec, trained)
  assert config['modules_to_save'] == ['blocks.0.norm1', 'blocks.1.norm1', 'head']
  flat = traverse_util.flatten_dict(params, sep='/')
  np.testing.assert_array_equal(
      tensors[f'{peft_adapters.PREFIX}blocks.1.norm1.weight'],
      flat['Transformer/encoderblock_1/LayerNorm_0/scale'],
  )


@pytest.mark.parametrize(
    'trained, fields, error',
    [
        (
            lambda path: path == 'cls',
            {},
            "peft saves trained modules whole, and timm's cls_token trains outside any module: keep "
            'it frozen (config.optim.trained), or use the merged timm/ export',
        ),
        (
            lambda path: path.startswith('embedding/'),
            {},
            "timm's patch_embed.proj.bias trains in the patch embedding, which reads images as the "
            'base normalises them',
        ),
        (
            lambda path: 'MultiHeadDotProductAttention_1/key/' in path,
            {},
            "timm's blocks.0.attn.qkv.bias trains in a module with adapters (blocks.0.attn.qkv)",
        ),
        (
            lambda path: False,
            dict(parallel_block=True),
            'the base has no timm module of the adapted layer Transformer/encoderblock_0/'
            "MultiHeadDotProductAttention_1/query alone (timm's parallel blocks pack the "
            'projections into one): the merged timm/ export holds the run',
        ),
    ],
    ids=[
        'the class token',
        'the patch embedding',
        'a part of an adapted module',
        'parallel blocks',
    ],
)
def test_what_peft_over_timm_cannot_hold_is_one_line(trained, fields, error):
  params, model_config, spec = _adapted(**fields)
  with pytest.raises(ValueError, match=re.escape(error)) as raised:
    _exported(params, model_config, spec, trained)
  assert '\n' not in str(raised.value)


def test_the_base_is_the_timm_checkpoint_the_run_started_from(
    tmp_path, trained_tiny_run, monkeypatch
):
  params, model_config, _ = _adapted()
  (tmp_path / 'snapshot').mkdir()
  timm_file = str(tmp_path / 'snapshot' / torch_files.SAFETENSORS)
  cls = timm_export_args.timm_class(model_config)
  torch_files.write_safetensors(timm_export_tensors.to_state_dict(_plain(params), cls), timm_file)
  found = peft_export.base(timm_file)
  name, shapes = found.name, found.shapes
  assert name == timm_file == found.path and not found.through_adapters
  assert shapes['blocks.1.attn.qkv.weight'] == (96, 32)
  monkeypatch.chdir(tmp_path)
  assert peft_export.base('snapshot').name == str(tmp_path / 'snapshot')  # Absolute.
  # A hub repository: by its name, which peft and peft_adapters.py look up.
  helpers.fake_hub(monkeypatch, [torch_files.SAFETENSORS], str(tmp_path / 'snapshot'))
  assert peft_export.base('hf-hub:timm/vit_tiny').name == 'timm/vit_tiny'
  for init_from, error in (
      (None, 'the run started from no checkpoint (config.init_from) for peft to adapt'),
      (
          trained_tiny_run,
          f"the adapters name timm's or transformers' modules, and the run started from "
          f"{trained_tiny_run}, neither a timm nor a transformers checkpoint: start from timm's copy "
          'of those weights (e.g. hf-hub:timm/...)',
      ),
  ):
    with pytest.raises(ValueError, match=re.escape(error)):
      peft_export.base(init_from)
  # peft's adapters (a run's export): their base.
  adapters = tmp_path / 'adapters'
  adapters.mkdir()
  config = {'peft_type': 'LORA', 'base_model_name_or_path': '../snapshot'}
  (adapters / peft_adapters.CONFIG).write_text(json.dumps(config))
  snapshot = str(tmp_path / 'snapshot')
  assert peft_export.base(str(adapters)) == peft_export.Base(
      snapshot, snapshot, 'timm', shapes, {}, True
  )


def test_the_adapters_name_the_bases_modules():
  """EVA-02 B's timm checkpoint keeps separate query, key and value projections, which the run
  computes as timm's fused ones: the adapters are the base's, each of rank r."""
  params, model_config, spec = _adapted(lora_targets=ALL)
  cls = timm_export_args.timm_class(model_config)
  merged = timm_export_tensors.to_state_dict(lora.merge(params, spec.scale), cls)
  ours = timm_export_tensors.to_state_dict(_plain(params), cls)
  base = {name: x.shape for name, x in ours.items() if '.attn.qkv.' not in name}
  base.update({f'blocks.{i}.attn.{n}_proj.weight': (32, 32) for i in range(2) for n in 'qkv'})
  tensors, config = _exported(params, model_config, spec, base=base)
  assert config['rank_pattern'] == config['alpha_pattern'] == {}
  for i in range(2):
    qkv = f'blocks.{i}.attn.qkv.weight'
    for part, n in enumerate('qkv'):
      module = f'{peft_adapters.PREFIX}blocks.{i}.attn.{n}_proj'
      a, b = tensors[f'{module}.lora_A.weight'], tensors[f'{module}.lora_B.weight']
      assert a.shape == (4, 32) and b.shape == (32, 4)
      rows = slice(32 * part, 32 * (part + 1))
      np.testing.assert_allclose(ours[qkv][rows] + 6 / 4 * b @ a, merged[qkv][rows], atol=1e-5)


@pytest.mark.parametrize(
    'base, trained, error',
    [
        (
            {'blocks.0.attn.qkv.weight': (96, 48)},
            lambda path: path.startswith('head/'),
            "the base's blocks.0.attn.qkv.weight (96, 48) is not a projection of the run's adapted "
            'layers: is config.init_from the checkpoint the run started from?',
        ),
        (
            {'blocks.0.norm1.weight': None, 'blocks.0.norm1.bias': None},
            lambda path: 'encoderblock_0/LayerNorm_0' in path,
            "timm's blocks.0.norm1.bias trains in no module of the base",
        ),
        (
            {'blocks.0.attn.q_bias': (32,), 'blocks.0.attn.v_bias': (32,)},
            lambda path: path.startswith('head/'),
            "timm computes the base's blocks.0.attn.qkv from its weight with q_bias and v_bias "
            "(Eva's and Beit's F.linear), past peft's adapter of it: the merged timm/ export holds "
            'the run, or train adapters of other layers than query, key and value',
        ),
    ],
    ids=['another width', 'a module it lacks', "Eva's fused qkv with biases"],
)
def test_a_base_other_than_the_runs_is_one_line(base, trained, error):
  params, model_config, spec = _adapted()
  cls = timm_export_args.timm_class(model_config)
  shapes = {n: x.shape for n, x in timm_export_tensors.to_state_dict(_plain(params), cls).items()}
  shapes.update(base)
  shapes = {n: shape for n, shape in shapes.items() if shape is not None}
  with pytest.raises(ValueError, match=re.escape(error)):
    _exported(params, model_config, spec, trained, base=shapes)


def test_a_run_from_peft_adapters_exports_over_their_base_where_its_frozen_kernels_are_its(
    tmp_path,
):
  params, model_config, _ = _adapted()
  (tmp_path / 'base').mkdir()
  cls = timm_export_args.timm_class(model_config)
  torch_files.write_safetensors(
      timm_export_tensors.to_state_dict(_plain(params), cls),
      str(tmp_path / 'base' / torch_files.SAFETENSORS),
  )
  (tmp_path / 'adapters').mkdir()
  config = {'peft_type': 'LORA', 'base_model_name_or_path': str(tmp_path / 'base')}
  (tmp_path / 'adapters' / peft_adapters.CONFIG).write_text(json.dumps(config))
  adapters = peft_export.base(str(tmp_path / 'adapters'))
  frozen = lambda path: False
  peft_export.check_unfolded(adapters, params, model_config, frozen)
  kernel = 'Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel'
  flat = traverse_util.flatten_dict(params, sep='/')
  changed = traverse_util.unflatten_dict({**flat, kernel: flat[kernel] + 1}, sep='/')
  with pytest.raises(ValueError, match=re.escape(f"the run's {kernel} is not its base's: ")):
    peft_export.check_unfolded(adapters, changed, model_config, frozen)
  peft_export.check_unfolded(adapters, changed, model_config, lambda path: path == kernel)
  plain = peft_export.base(str(tmp_path / 'base'))  # No adapters.
  peft_export.check_unfolded(plain, changed, model_config, frozen)
