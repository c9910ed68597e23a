"""peft loads a run's exported adapters (vit_jax/checkpoints/peft_export.py, vit_jax.tools.export's
peft/) over the timm checkpoint the run started from, and predicts as the run's model; the files are
named and shaped as peft's own save_pretrained names and shapes them, and init_from reads them back.
transformers loads those of a run from a transformers checkpoint over its *ForImageClassification.
"""

import dataclasses
import json
import os
import re

import numpy as np
import peft
import pytest
import timm
import torch
import transformers

import helpers
from torch_references import (
    prepared_from_checkpoint,
    randomize,
    timm_input,
    timm_saved,
    torch_outputs,
)
from vit_jax.checkpoints import peft_export, run_dir, torch_files
from vit_jax.models import lora
from vit_jax.tools import export
from vit_jax.train import loop, setup as train_setup

ALL = ('query', 'key', 'value', 'out', 'mlp_in', 'mlp_out')
EVA = dict(img_size=28, patch_size=7, mlp_ratio=4 * 2 / 3)
# timm's architectures, tiny: (image size, their arguments, the run's model.lora_targets).
BASES = {
    # Fused qkv: the adapters of query, key and value are one of rank 3r.
    'vit_tiny_patch16_224': (8, {}, ALL),
    # Separate q, k, v projections; SwiGLU's fc1_g and fc1_x; rotary embeddings; CLIP's
    # normalisation (folded into the run's patch embedding, timm's own over the base).
    'eva02_base_patch14_224': (28, EVA, ALL),
    # The SwiGLU's two halves packed in one fc1 (rank 2r). Its fused qkv with q and v biases is
    # computed past peft's adapter (test_peft_export.py).
    'eva02_small_patch14_224': (28, EVA, ('out', 'mlp_in', 'mlp_out')),
}


# transformers' models, tiny: (their classifier class, a model of their files' kind, the run's model
# fields the class's logits need: its pooling, model.classifier, and any other the checkpoint's
# fields are not).
_SIZES = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=8, patch_size=4
)


def _image_and_text(model, config):
  """A whole tiny two-tower model (SigLIP's, CLIP's), as the hub holds them."""
  return lambda: model(
      config(
          vision_config=dict(**_SIZES, intermediate_size=48),
          text_config=dict(_SIZES, intermediate_size=48, vocab_size=64),
      )
  )


TRANSFORMERS_BASES = {
    'vit': (
        transformers.ViTForImageClassification,
        lambda: transformers.ViTModel(transformers.ViTConfig(**_SIZES, intermediate_size=48)),
        {'classifier': 'token'},
    ),
    # The class token beside the patches' mean, which its Dinov2Model does not pool.
    'dinov2': (
        transformers.Dinov2ForImageClassification,
        lambda: transformers.Dinov2Model(transformers.Dinov2Config(**_SIZES, mlp_ratio=2)),
        {'classifier': 'token_gap'},
    ),
    'dinov2_with_registers': (
        transformers.Dinov2WithRegistersForImageClassification,
        lambda: transformers.Dinov2WithRegistersModel(
            transformers.Dinov2WithRegistersConfig(**_SIZES, mlp_ratio=2, num_register_tokens=2)
        ),
        {'classifier': 'token_gap'},
    ),
    # A distillation token beside the class token: the mean of their two classifiers.
    'deit': (
        transformers.DeiTForImageClassificationWithTeacher,
        lambda: transformers.DeiTModel(transformers.DeiTConfig(**_SIZES, intermediate_size=48)),
        {'classifier': 'token'},
    ),
    # The patches' mean, LayerNormed by its pooler (our fc_norm); no key bias; layer scale.
    'beit': (
        transformers.BeitForImageClassification,
        lambda: transformers.BeitModel(transformers.BeitConfig(**_SIZES, intermediate_size=48)),
        {'classifier': 'gap'},
    ),
    # A BEiT without use_mean_pooling: its class token, after the final LayerNorm.
    'beit_class_token': (
        transformers.BeitForImageClassification,
        lambda: transformers.BeitModel(
            transformers.BeitConfig(**_SIZES, intermediate_size=48, use_mean_pooling=False)
        ),
        {'classifier': 'token'},
    ),
    # No class token: every token's mean.
    'ijepa': (
        transformers.IJepaForImageClassification,
        lambda: transformers.IJepaModel(transformers.IJepaConfig(**_SIZES, intermediate_size=48)),
        {'classifier': 'gap'},
    ),
    # A whole SigLIP (the hub's google/siglip-*), whose image tower the class reads.
    'siglip': (
        transformers.SiglipForImageClassification,
        _image_and_text(transformers.SiglipModel, transformers.SiglipConfig),
        {'classifier': 'gap'},
    ),
    # A whole CLIP (the hub's openai/clip-*; its tower alone loads no class): the patches' mean of
    # the blocks' output, with no final LayerNorm (its post_layernorm, the class token's, unread).
    'clip': (
        transformers.CLIPForImageClassification,
        _image_and_text(transformers.CLIPModel, transformers.CLIPConfig),
        {'classifier': 'gap', 'final_norm': False},
    ),
}


def _exported_run(tmp_path, name, data_dir, init_from, size, targets, **overrides):
  """The export of a tiny LoRA run (rank 4, alpha 8) of `targets` on the digits from `init_from`."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': init_from,
          'data_dir': data_dir,
          'model.lora_rank': 4,
          'model.lora_alpha': 8.0,
          'model.lora_targets': targets,
          'lr.base': 0.05,
          'image_size': size,
          **overrides,
      },
  )
  workdir, out = str(tmp_path / name), tmp_path / f'{name}_export'
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  return export.export(workdir, str(out)), out


@pytest.mark.parametrize('architecture', list(BASES))
def test_peft_loads_a_runs_adapters_over_the_timm_checkpoint_it_started_from(
    tmp_path, data_dir, architecture
):
  size, arguments, targets = BASES[architecture]
  timm_saved(tmp_path / 'base', architecture, **arguments)
  description, out = _exported_run(tmp_path, 'run', data_dir, str(tmp_path / 'base'), size, targets)
  assert description['peft'] == (
      'peft/adapter_model.safetensors, peft/adapter_config.json over ' f'{tmp_path / "base"}'
  )
  inputs = np.random.default_rng(0).uniform(-1, 1, (6, size, size, 3)).astype(np.float32)
  _, infer = run_dir.load_export(str(out))
  expected = np.asarray(infer(inputs))

  base = timm.create_model(f'local-dir:{tmp_path / "base"}', pretrained=True).eval()
  model = peft.PeftModel.from_pretrained(base, str(out / 'peft')).eval()
  theirs = torch_outputs(model, timm_input(base, inputs)).numpy()
  np.testing.assert_allclose(theirs, expected, atol=1e-4)
  with torch.no_grad():  # The trained head without the adapters' updates: far from it.
    for name, p in model.named_parameters():
      if '.lora_B.' in name:
        p.zero_()
  assert np.abs(torch_outputs(model, timm_input(base, inputs)).numpy() - expected).max() > 0.1

  # Named and shaped as peft writes the adapters of this config over the base.
  adapter_config = json.loads((out / 'peft' / 'adapter_config.json').read_text())
  fresh = timm.create_model(f'local-dir:{tmp_path / "base"}', pretrained=True)
  fields = {k: v for k, v in adapter_config.items() if k not in ('peft_type', 'inference_mode')}
  peft.get_peft_model(fresh, peft.LoraConfig(**fields)).save_pretrained(str(tmp_path / 'theirs'))
  shapes = lambda d: {
      k: v.shape
      for k, v in torch_files.read(os.path.join(d, 'adapter_model.safetensors'))[0].items()
  }
  assert shapes(out / 'peft') == shapes(tmp_path / 'theirs')

  # config.init_from reads them back over the base: the run's model.
  again = prepared_from_checkpoint(tmp_path / 'again', str(out / 'peft'), size)
  ours = again.model.apply({'params': again.init_params}, inputs)
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)


def test_peft_loads_an_mae_runs_encoder_adapters_over_timms_encoder_it_started_from(
    tmp_path, data_dir
):
  """Continued MAE pretraining with adapters from timm's encoder-only MAE weights: the export is the
  encoder, and peft's adapters over the base give its features (the decoder, the task's own, is
  not among them)."""
  timm_saved(tmp_path / 'base', 'vit_base_patch16_224.mae', num_classes=0)
  description, out = _exported_run(
      tmp_path,
      'mae',
      data_dir,
      str(tmp_path / 'base'),
      8,
      ALL,
      task='mae',
      **{
          'model.head_dropout_rate': None,
          'mae.mask_ratio': 0.5,
          'mae.decoder_hidden_size': 16,
          'mae.decoder_num_layers': 1,
          'mae.decoder_num_heads': 2,
          'mae.decoder_mlp_dim': 24,
          'label_smoothing': 0.0,
      },
  )
  assert description['task'] == 'mae' and description['peft'].startswith('peft/')
  inputs = np.random.default_rng(0).uniform(-1, 1, (6, 8, 8, 3)).astype(np.float32)
  _, infer = run_dir.load_export(str(out))
  base = timm.create_model(f'local-dir:{tmp_path / "base"}', pretrained=True).eval()
  model = peft.PeftModel.from_pretrained(base, str(out / 'peft')).eval()
  theirs = torch_outputs(model, timm_input(base, inputs)).numpy()
  np.testing.assert_allclose(theirs, np.asarray(infer(inputs)), atol=1e-4)
  adapters = torch_files.read(str(out / 'peft' / 'adapter_model.safetensors'))[0]
  assert adapters and not any('decoder' in name for name in adapters)


@pytest.mark.parametrize('model_type', list(TRANSFORMERS_BASES))
def test_transformers_loads_a_runs_adapters_over_the_transformers_checkpoint_it_started_from(
    tmp_path, data_dir, model_type
):
  classifier_class, base_model, fields = TRANSFORMERS_BASES[model_type]
  overrides = {f'model.{name}': value for name, value in fields.items()}
  randomize(base_model()).save_pretrained(tmp_path / 'base')
  init_from = str(tmp_path / 'base')
  description, out = _exported_run(tmp_path, 'run', data_dir, init_from, 8, ALL, **overrides)
  assert description['peft'] == (
      f'peft/adapter_model.safetensors, peft/adapter_config.json over {init_from}'
  )
  adapter_config = json.loads((out / 'peft' / 'adapter_config.json').read_text())
  heads = ['cls_classifier', 'distillation_classifier'] if model_type == 'deit' else ['classifier']
  assert adapter_config['modules_to_save'] == heads
  assert len(adapter_config['target_modules']) == 2 * 6  # Each block's six projections.
  inputs = np.random.default_rng(0).uniform(-1, 1, (6, 8, 8, 3)).astype(np.float32)
  _, infer = run_dir.load_export(str(out))
  expected = np.asarray(infer(inputs))

  # Named as transformers 5 names the modules: peft's loader and transformers' own.
  base = classifier_class.from_pretrained(init_from, num_labels=10)
  model = peft.PeftModel.from_pretrained(base, str(out / 'peft')).eval()
  np.testing.assert_allclose(torch_outputs(model, inputs).logits.numpy(), expected, atol=1e-4)
  model = classifier_class.from_pretrained(init_from, num_labels=10)
  model.load_adapter(str(out / 'peft'))
  model.eval()
  theirs = torch_outputs(model, inputs).logits.numpy()
  np.testing.assert_allclose(theirs, expected, atol=1e-4)
  with torch.no_grad():  # The trained head without the adapters' updates: far from it.
    for name, p in model.named_parameters():
      if '.lora_B.' in name:
        p.zero_()
  assert np.abs(torch_outputs(model, inputs).logits.numpy() - expected).max() > 0.1
  # config.init_from reads them back over the base: the run's model.
  again = prepared_from_checkpoint(tmp_path / 'again', str(out / 'peft'), 8, **overrides)
  ours = again.model.apply({'params': again.init_params}, inputs)
  np.testing.assert_allclose(np.asarray(ours), expected, atol=1e-4)

  # Another pooling than the class's classifier, the other fields the checkpoint's (CLIP's final
  # LayerNorm): one line naming every flag to set, and the merged export. (DeiT's distilled model
  # pools its class token alone.)
  if model_type == 'deit':
    return
  pooling = fields['classifier']
  other = {'token': 'gap', 'token_gap': 'token', 'gap': 'map'}[pooling]
  description, _ = _exported_run(
      tmp_path, 'other', data_dir, init_from, 8, ('query',), **{'model.classifier': other}
  )
  rest = {name: value for name, value in fields.items() if name != 'classifier'}  # Booleans.
  runs = ''.join(f', model.{name}={not value!r}' for name, value in rest.items())
  flags = ''.join(f' --config.model.{name}={value}' for name, value in rest.items())
  assert description['peft'] == (
      f"not written: transformers' {classifier_class.__name__} computes its logits otherwise than "
      f'the run (model.classifier={other!r}{runs}): train with --config.model.classifier={pooling}'
      f'{flags} (and no model.representation_size) for peft adapters of it, or use the merged '
      'timm/ export'
  )


def test_a_run_from_exported_adapters_trains_them_on_and_exports_them_over_the_same_base(
    tmp_path, data_dir
):
  timm_saved(tmp_path / 'base')
  _, first = _exported_run(tmp_path, 'first', data_dir, str(tmp_path / 'base'), 8, ALL)
  inputs = np.random.default_rng(0).uniform(-1, 1, (6, 8, 8, 3)).astype(np.float32)
  _, first_infer = run_dir.load_export(str(first))
  # Read as a model with adapters on the same layers: the first run's model, its adapters apart.
  lora_fields = {'model.lora_rank': 4, 'model.lora_alpha': 8.0, 'model.lora_targets': ALL}
  kept = prepared_from_checkpoint(tmp_path / 'kept', str(first / 'peft'), 8, **lora_fields)
  logits = kept.model.apply({'params': kept.init_params}, inputs)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(first_infer(inputs)), atol=1e-4)
  adapters = {p for p in helpers.flat_params(kept.init_params) if lora.ADAPTER_PATH.search(p)}
  assert len(adapters) == 2 * 2 * 6  # a and b of each of the six layers of both blocks.
  # The adapters go on as the next run's (the base's kernels as they were): exported over it again.
  description, out = _exported_run(tmp_path, 'next', data_dir, str(first / 'peft'), 8, ALL)
  assert description['peft'].endswith(f' over {tmp_path / "base"}')
  _, infer = run_dir.load_export(str(out))
  base = timm.create_model(f'local-dir:{tmp_path / "base"}', pretrained=True).eval()
  model = peft.PeftModel.from_pretrained(base, str(out / 'peft')).eval()
  theirs = torch_outputs(model, timm_input(base, inputs)).numpy()
  np.testing.assert_allclose(theirs, np.asarray(infer(inputs)), atol=1e-4)
  assert (
      np.abs(np.asarray(infer(inputs)) - np.asarray(first_infer(inputs))).max() > 1e-3
  )  # Trained.
  # A run that adapts fewer layers folds the others' adapters into the base's kernels: no base.
  description, fewer = _exported_run(
      tmp_path, 'fewer', data_dir, str(first / 'peft'), 8, ('query',)
  )
  assert description['peft'].startswith(
      "not written: the run's Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel is not its "
      "base's:"
  )
  # Exported over the earlier export, it leaves none of the earlier adapters there.
  assert os.path.exists(out / 'peft' / 'adapter_model.safetensors')
  export.export(str(tmp_path / 'fewer'), str(out), overwrite=True)
  assert not os.listdir(out / 'peft')
  assert os.path.exists(out / 'timm' / 'model.safetensors')


def test_what_peft_cannot_hold_over_a_transformers_checkpoint_is_one_line(tmp_path):
  """Over a transformers ViT: its classes' other model_types, a trained part beside the classifier,
  a pre-logits layer and an adapted layer no projection of the base holds alone are each one line.
  """
  _, base_model, _ = TRANSFORMERS_BASES['vit']
  randomize(base_model()).save_pretrained(tmp_path / 'vit')
  base = peft_export.base(str(tmp_path / 'vit'))
  assert (base.layout, base.config['model_type']) == ('transformers', 'vit')
  run = prepared_from_checkpoint(
      tmp_path / 'run', str(tmp_path / 'vit'), 8, keep_head=False, **{'model.lora_rank': 4}
  )
  spec = lora.model_spec(run.model_config)
  params = run.init_params
  head = lambda path: path.startswith('head/')
  tensors, config = peft_export.export(params, spec, head, run.model_config, base)
  assert config['target_modules'] == [
      f'vit.layers.{i}.attention.{p}' for i in range(2) for p in ('q_proj', 'v_proj')
  ]
  assert tensors['base_model.model.classifier.weight'].shape == (10, 32)
  for _, trained, model_config, checkpoint, message in (  # What is refused first.
      (
          'another model_type',
          head,
          run.model_config,
          dataclasses.replace(base, config={**base.config, 'model_type': 'clip_vision_model'}),
          "peft's adapters over {path} name the modules of transformers' *ForImageClassification "
          "of its model_type, 'clip_vision_model': vit_jax writes those of vit, deit, beit, ijepa, "
          'dinov2, dinov2_with_registers, siglip, clip (the merged timm/ export holds the run)',
      ),
      (
          'a trained LayerNorm',
          lambda path: head(path) or path.startswith('Transformer/encoder_norm/'),
          run.model_config,
          base,
          "peft saves trained modules whole, and the run's Transformer/encoder_norm/bias trains "
          "outside transformers' classifier: keep it frozen (config.optim.trained), or use the "
          'merged timm/ export',
      ),
      (
          'another pooling',
          head,
          {**run.model_config, 'classifier': 'gap'},
          base,
          "transformers' ViTForImageClassification computes its logits otherwise than the run "
          "(model.classifier='gap'): train with --config.model.classifier=token (and no "
          'model.representation_size) for peft adapters of it, or use the merged timm/ export',
      ),
      (
          'a distillation token',
          head,
          {**run.model_config, 'distilled': True},
          base,
          "transformers' ViTForImageClassification computes its logits otherwise than the run "
          '(model.distilled=True): train with --config.model.distilled=False (and no '
          'model.representation_size) for peft adapters of it, or use the merged timm/ export',
      ),
      (
          'no final LayerNorm',
          head,
          {**run.model_config, 'final_norm': False},
          base,
          "transformers' ViTForImageClassification computes its logits otherwise than the run "
          '(model.final_norm=False): train with --config.model.final_norm=True (and no '
          'model.representation_size) for peft adapters of it, or use the merged timm/ export',
      ),
  ):
    with pytest.raises(ValueError, match=re.escape(message.format(path=base.path))):
      peft_export.export(params, spec, trained, model_config, checkpoint)
  with_pre_logits = {**params, 'pre_logits': {'kernel': np.zeros((32, 32)), 'bias': np.zeros(32)}}
  with pytest.raises(
      ValueError,
      match=r'otherwise than the run \(a pre-logits layer\): train with no model.representation_size '
      'for peft',
  ):
    peft_export.export(with_pre_logits, spec, head, run.model_config, base)
  # An adapted layer the base holds in no projection of its own.
  renamed = {**params, 'Transformer': dict(params['Transformer'])}
  block = renamed['Transformer']['encoderblock_0'] = dict(params['Transformer']['encoderblock_0'])
  block['Unknown_9'] = block['MultiHeadDotProductAttention_1']
  with pytest.raises(ValueError, match='the adapted layer Transformer/encoderblock_0/Unknown_9/'):
    peft_export.export(renamed, spec, head, run.model_config, base)
