"""config.variant='checkpoint': the model is the ViT of config.init_from, its fields read from the
checkpoint's tensors and config.json, so that fine-tuning a downloaded timm or transformers ViT needs
no model field spelt out. The references are checkpoints written by timm and transformers themselves.
"""

import json

import ml_collections
import numpy as np
import pytest
import safetensors.torch
import timm
import torch
import transformers

import helpers
from torch_references import (
    transformers_vit_saved,
    prepared_from_checkpoint,
    assert_exported_tensors,
    timm_input,
    timm_rebuilt,
    timm_saved,
    torch_outputs,
)
from vit_jax.checkpoints import label_order, state_dicts, timm_export_tensors
from vit_jax.data import digits
from vit_jax.tasks import classification
from vit_jax.train import setup

SIZE, NUM_CLASSES = 28, 10  # The digits' classes: keep_head keeps a head of the checkpoint's.


def _timm_saved(directory, architecture: str, **kwargs):
  """torch_references.timm_saved at SIZE px with timm's MLP ratio, 4."""
  return timm_saved(directory, architecture, img_size=SIZE, mlp_ratio=4.0, **kwargs)


def _timm_dinov2_reg4(directory, **kwargs):
  """vit_small_patch14_reg4_dinov2's shape: 4 registers, layer scale, patch 14."""
  return _timm_saved(directory, 'vit_small_patch14_reg4_dinov2', patch_size=14, **kwargs)


def _rebuilt_by_timm(run: setup.Setup, directory) -> torch.nn.Module:
  return timm_rebuilt(
      run.init_params, run.model_config, SIZE, run.config.pp_eval.to_dict(), directory
  )


def _prepare(tmp_path, init_from: str, **overrides) -> setup.Setup:
  overrides = {'image_size': SIZE, **overrides}
  return prepared_from_checkpoint(
      tmp_path / 'workdir', init_from, overrides.pop('image_size'), **overrides
  )


def _images(n: int) -> np.ndarray:
  return np.random.RandomState(2).uniform(-1, 1, (n, SIZE, SIZE, 3)).astype(np.float32)


def _logits(run: setup.Setup, inputs: np.ndarray) -> np.ndarray:
  return np.asarray(run.model.apply({'params': run.init_params}, inputs))


def test_timms_dinov2_with_registers_is_built_from_its_files_alone(tmp_path):
  reference = _timm_dinov2_reg4(tmp_path / 'dinov2')
  run = _prepare(tmp_path, str(tmp_path / 'dinov2'))
  expected = {
      'patch_size': 14,
      'hidden_size': 32,
      'num_layers': 2,
      'num_heads': 2,
      'mlp_dim': 128,
      'num_registers': 4,
      'layer_scale': 1e-5,
      'classifier': 'token',
      'fc_norm': False,
      'pre_norm': False,
      'mlp_activation': 'gelu',  # timm's default, not the original checkpoints' tanh form.
      'layernorm_epsilon': 1e-6,
  }
  assert {k: run.model_config[k] for k in expected} == expected
  # The config holds them, so the run's config.json rebuilds the model for export and predict.
  assert {k: run.config.model[k] for k in expected} == expected
  inputs = _images(3)
  np.testing.assert_allclose(
      _logits(run, inputs),
      torch_outputs(reference, timm_input(reference, inputs)).numpy(),
      atol=1e-4,
  )


def test_a_field_that_contradicts_the_checkpoint_is_one_line_naming_it(tmp_path):
  _timm_dinov2_reg4(tmp_path / 'dinov2')
  with pytest.raises(
      ValueError,
      match=r'^config.model.num_registers=0 contradicts config.init_from, whose num_registers '
      r"is 4: drop that setting \(config.variant='checkpoint' takes it from the checkpoint\)",
  ):
    _prepare(tmp_path, str(tmp_path / 'dinov2'), **{'model.num_registers': 0})
  with pytest.raises(ValueError, match=r'^config.model.mlp_activation=.gelu_tanh. contradicts'):
    _prepare(tmp_path, str(tmp_path / 'dinov2'), **{'model.mlp_activation': 'gelu_tanh'})
  # Settings the checkpoint does not fix are the run's: regularisation, and layer scale's initial
  # value, which the checkpoint's scales replace.
  run = _prepare(
      tmp_path,
      str(tmp_path / 'dinov2'),
      **{'model.drop_path_rate': 0.1, 'model.layer_scale': 1.0},
  )
  assert run.model_config['drop_path_rate'] == 0.1 and run.model_config['num_registers'] == 4


def test_a_checkpoint_without_a_config_json_needs_the_fields_it_cannot_show(tmp_path):
  reference = _timm_dinov2_reg4(tmp_path / 'dinov2')
  bare = tmp_path / 'bare.safetensors'
  safetensors.torch.save_file(reference.state_dict(), bare)
  with pytest.raises(
      ValueError,
      match=r'bare.safetensors does not say its number of attention heads \(model.num_heads\): '
      r'there is no config.json beside it.*; set --config.model.num_heads$',
  ):
    _prepare(tmp_path, str(bare))
  fields = {'model.num_heads': 2, 'model.mlp_activation': 'gelu', 'model.layernorm_epsilon': 1e-6}
  run = _prepare(tmp_path, str(bare), **fields)
  inputs = _images(2)
  np.testing.assert_allclose(
      _logits(run, inputs), torch_outputs(reference, inputs).numpy(), atol=1e-4
  )


@pytest.mark.parametrize(
    'init_from,message',
    [
        (None, r'it is unset|, unset:'),
        ('model.msgpack', r"not '.*model.msgpack'"),
    ],
)
def test_variant_checkpoint_without_a_timm_or_transformers_checkpoint_names_the_fix(
    tmp_path, init_from, message
):
  if init_from:
    (tmp_path / init_from).write_bytes(b'flax')
    init_from = str(tmp_path / init_from)
  with pytest.raises(
      ValueError,
      match=r"^config.variant='checkpoint' builds the model of config.init_from.*" + message,
  ) as error:
    _prepare(tmp_path, init_from, keep_head=False)
  assert 'set --config.init_from' in str(error.value) and '\n' not in str(error.value)


def test_variant_checkpoint_with_a_missing_download_names_where_it_looked(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(
      ValueError,
      match=r"^config.init_from='checkpoints/clip' does not exist: a relative path is taken from the "
      r"current directory, here '.*', so it is '.*/checkpoints/clip'; download the checkpoint there "
      r"\(the config file's docstring says from where\) or pass it by an absolute path, e.g. "
      r'--config.init_from=/abs/path/to/it, or run from the directory it is relative to$',
  ):
    _prepare(tmp_path, 'checkpoints/clip', keep_head=False)


def test_timms_quickgelu_clip_and_a_transformers_vit_say_their_activation_and_epsilon(tmp_path):
  clip = _timm_saved(tmp_path / 'clip', 'vit_base_patch16_clip_quickgelu_224', patch_size=7)
  fixed = state_dicts.architecture(str(tmp_path / 'clip'))
  assert (fixed['mlp_activation'], fixed['layernorm_epsilon'], fixed['pre_norm']) == (
      'quick_gelu',
      1e-5,
      True,
  )
  run = _prepare(tmp_path, str(tmp_path / 'clip'))
  inputs = _images(2)
  np.testing.assert_allclose(
      _logits(run, inputs), torch_outputs(clip, timm_input(clip, inputs)).numpy(), atol=1e-4
  )

  vit = transformers_vit_saved(tmp_path / 'hf', SIZE, 7)
  assert 'layer_norm_eps' in json.loads((tmp_path / 'hf' / 'config.json').read_text())
  run = _prepare(tmp_path, str(tmp_path / 'hf'))
  assert (run.model_config['mlp_activation'], run.model_config['layernorm_epsilon']) == (
      'gelu',
      1e-12,
  )
  assert run.model_config['mlp_dim'] == 48
  np.testing.assert_allclose(
      _logits(run, inputs), torch_outputs(vit, inputs).logits.numpy(), atol=1e-4
  )


def test_the_run_config_rebuilds_the_model_without_the_checkpoint(tmp_path):
  """What export, predict and a resume read: the run's config with the filled fields, resolved
  again with the checkpoint gone."""
  _timm_dinov2_reg4(tmp_path / 'dinov2')
  run = _prepare(tmp_path, str(tmp_path / 'dinov2'))
  stored = run.config.to_dict()
  (tmp_path / 'dinov2' / 'model.safetensors').unlink()
  assert helpers.model_config(ml_collections.ConfigDict(stored)) == run.model_config


@pytest.mark.parametrize(
    'config_name,architecture',
    [
        ('finetune_dinov2', 'vit_small_patch14_reg4_dinov2'),
        ('finetune_dinov3', 'vit_small_patch16_dinov3'),
        ('finetune_siglip', 'vit_base_patch16_siglip_224'),
        ('finetune_clip', 'vit_base_patch16_clip_quickgelu_224'),
        ('finetune_eva02', 'eva02_small_patch14_224'),
    ],
)
def test_the_fine_tuning_configs_build_their_familys_checkpoint(
    tmp_path, config_name, architecture
):
  """configs/finetune_<family>.py with a tiny random checkpoint of its family (and the digits for
  its dataset): the run is set up with the checkpoint's architecture and the config's recipe."""
  reference = _timm_saved(
      tmp_path / 'downloaded',
      architecture,
      patch_size=14 if 'dinov2' in architecture else 7,
      num_classes=0,
  )
  config = helpers.load_config(
      f'{config_name}:cifar10',
      {
          'init_from': str(tmp_path / 'downloaded'),
          'dataset': 'digits',
          'train_split': 'train',
          'eval_split': 'test',
          'image_size': SIZE,
          'batch_size': 16,
          'eval_batch_size': 16,
          'dtype': 'float32',
      },
  )
  run = setup.prepare(config, str(tmp_path / 'workdir'))
  assert run.model_config['hidden_size'] == 32 and run.model_config['drop_path_rate'] == 0.1
  assert helpers.model_config(run.config) == run.model_config
  # What the new zero head reads: timm's pooled features.
  features = classification.features_model(run.config, run.model_config)
  params = {k: v for k, v in run.init_params.items() if k != 'head'}
  inputs = _images(2)
  np.testing.assert_allclose(
      features.apply({'params': params}, inputs),
      torch_outputs(reference, timm_input(reference, inputs)).numpy(),
      atol=1e-4,
  )


def test_timms_qk_norm_vit_loads_with_equal_logits_and_exports_back(tmp_path):
  """timm's qk_norm (LayerNorms of each head's queries and keys, with biases): read from the tensors,
  timm's logits, the tensors exported back unchanged and timm's model rebuilt from our export."""
  reference = _timm_saved(tmp_path / 'qk', 'vit_tiny_patch16_224', patch_size=7, qk_norm=True)
  run = _prepare(tmp_path, str(tmp_path / 'qk'))
  assert run.model_config['qk_norm'] is True
  inputs = _images(3)
  expected = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(_logits(run, inputs), expected, atol=1e-4)
  exported = timm_export_tensors.to_state_dict(run.init_params)
  assert_exported_tensors(exported, reference, folded=('patch_embed.',))
  rebuilt = _rebuilt_by_timm(run, tmp_path / 'export')
  np.testing.assert_allclose(torch_outputs(rebuilt, inputs).numpy(), expected, atol=1e-4)
  # A variant without the norms says which field to set.
  with pytest.raises(
      ValueError, match=r'/[qk]_norm/.*query/key normalisation; set --config.model.qk_norm=True$'
  ):
    _prepare(
        tmp_path,
        str(tmp_path / 'qk'),
        variant='ViT-testing_7',
        **{'model.mlp_dim': 128, 'model.mlp_activation': 'gelu'},
    )


@pytest.mark.parametrize(
    'architecture', ['deit_small_distilled_patch16_224', 'deit3_small_patch16_224']
)
def test_timms_deit_distilled_and_deit3_load_with_equal_logits_and_export_back(
    tmp_path, architecture
):
  """DeiT's distilled model (a distillation token and its head; timm averages the two heads' logits
  in evaluation) and DeiT III (layer scale, no position embedding for the class token): read from
  the files alone, timm's logits, the tensors exported back, timm's model rebuilt from our export;
  fine-tuning replaces both heads with zeros."""
  reference = _timm_saved(tmp_path / 'deit', architecture, patch_size=7)
  run = _prepare(tmp_path, str(tmp_path / 'deit'))
  distilled = 'distilled' in architecture
  assert run.model_config['distilled'] is distilled
  assert (run.model_config['layer_scale'] is not None) is not distilled
  inputs = _images(3)
  expected = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(_logits(run, inputs), expected, atol=1e-4)
  exported = timm_export_tensors.to_state_dict(run.init_params)
  if not distilled:  # DeiT III gives the class token no position embedding; ours is a zero one.
    np.testing.assert_array_equal(exported['pos_embed'][:, :1], 0)
    exported['pos_embed'] = exported['pos_embed'][:, 1:]
  assert_exported_tensors(exported, reference, folded=('patch_embed.',))
  rebuilt = _rebuilt_by_timm(run, tmp_path / 'export')
  np.testing.assert_allclose(torch_outputs(rebuilt, inputs).numpy(), expected, atol=1e-4)
  fresh = _prepare(tmp_path, str(tmp_path / 'deit'), keep_head=False)
  for head in ('head', 'head_dist') if distilled else ('head',):
    np.testing.assert_array_equal(fresh.init_params[head]['kernel'], 0)
  if distilled:
    with pytest.raises(
        ValueError,
        match=r"^dist: .* the checkpoint has a distillation token \(DeiT's\); set "
        r'--config.model.distilled=True$',
    ):
      _prepare(
          tmp_path,
          str(tmp_path / 'deit'),
          variant='ViT-testing_7',
          **{'model.mlp_dim': 128, 'model.mlp_activation': 'gelu'},
      )


@pytest.mark.parametrize(
    'mean, std',
    [
        ([0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]),
        (0.45, 0.25),  # One for every channel, as transformers' processors also take them.
    ],
)
def test_a_hub_snapshots_image_processor_normalisation_is_folded_into_the_patch_embedding(
    tmp_path, mean, std
):
  """A transformers hub snapshot has the image processor's preprocessor_config.json beside the
  weights (OpenAI CLIP's mean and std here): our images of the same pixels give transformers' logits
  on its normalised ones; without the file, the weights load as they are."""
  vit = transformers_vit_saved(tmp_path / 'hf', SIZE, 7)
  transformers.ViTImageProcessor(image_mean=mean, image_std=std).save_pretrained(tmp_path / 'hf')
  run = _prepare(tmp_path, str(tmp_path / 'hf'))
  inputs = _images(2)
  theirs = (((inputs + 1) / 2 - np.asarray(mean)) / np.asarray(std)).astype(np.float32)
  np.testing.assert_allclose(
      _logits(run, inputs), torch_outputs(vit, theirs).logits.numpy(), atol=1e-4
  )


def test_a_transformers_directory_without_its_image_processor_says_so(tmp_path, caplog):
  """save_pretrained of a model alone writes no preprocessor_config.json: DINOv2's weights then read
  un-normalised pixels, silently."""
  transformers_vit_saved(tmp_path / 'hf', SIZE, 7)
  with caplog.at_level('INFO'):
    _prepare(tmp_path, str(tmp_path / 'hf'))
  assert 'found no preprocessor_config.json beside it (a save_pretrained of the model alone' in (
      caplog.text
  )
  transformers.ViTImageProcessor().save_pretrained(tmp_path / 'hf')
  caplog.clear()
  with caplog.at_level('INFO'):
    _prepare(tmp_path, str(tmp_path / 'hf'))
  assert 'found no preprocessor_config.json' not in caplog.text
  assert 'folded its input normalisation' not in caplog.text  # ViT's 0.5, 0.5: ours.


def test_a_kept_heads_classes_are_read_in_the_datasets_order(tmp_path):
  """A classifier's config.json names its classes (id2label) in another order than the dataset's
  (the digits' '0' to '9'): each of our logits is the one transformers gives the same class."""
  vit = transformers_vit_saved(tmp_path / 'hf', SIZE, 7)
  names = [str(d) for d in (3, 1, 4, 0, 5, 9, 2, 6, 8, 7)]
  config = json.loads((tmp_path / 'hf' / 'config.json').read_text())
  config['id2label'] = dict(enumerate(names))
  config['label2id'] = {name: i for i, name in enumerate(names)}
  (tmp_path / 'hf' / 'config.json').write_text(json.dumps(config))
  run = _prepare(tmp_path, str(tmp_path / 'hf'))
  inputs = _images(2)
  theirs = torch_outputs(vit, inputs).logits.numpy()
  order = [names.index(name) for name in digits.CLASS_NAMES]
  np.testing.assert_allclose(_logits(run, inputs), theirs[:, order], atol=1e-4)
  assert label_order.checkpoint_classes(str(tmp_path / 'hf')) == names
  # transformers' names of no class: the head's own order.
  (tmp_path / 'hf' / 'config.json').write_text(
      json.dumps({**config, 'id2label': {i: f'LABEL_{i}' for i in range(10)}})
  )
  assert label_order.checkpoint_classes(str(tmp_path / 'hf')) is None


@pytest.mark.parametrize('as_dict', [False, True])
def test_the_classes_timms_save_for_hf_names_are_the_checkpoints(tmp_path, as_dict):
  """timm writes label_names beside pretrained_cfg in config.json (and reads them there): a kept
  head was read in its own order, each logit as another class."""
  names = [str(d) for d in (3, 1, 4, 0, 5, 9, 2, 6, 8, 7)]
  model = timm.create_model(
      'vit_tiny_patch16_224',
      img_size=8,
      patch_size=4,
      num_classes=10,
      embed_dim=16,
      depth=1,
      num_heads=2,
  )
  label_names = {str(i): name for i, name in enumerate(names)} if as_dict else names
  timm.models.save_for_hf(model, str(tmp_path / 'timm'), model_config={'label_names': label_names})
  saved = json.loads((tmp_path / 'timm' / 'config.json').read_text())
  assert saved['label_names'] == label_names and 'label_names' not in saved['pretrained_cfg']
  assert label_order.checkpoint_classes(str(tmp_path / 'timm')) == names


@pytest.mark.parametrize('fc_norm', [True, False])
def test_a_class_token_the_pooling_does_not_read_loads_with_timms_logits(tmp_path, fc_norm):
  """timm's class_token with global_pool='avg' (MAE's, BEiT's, EVA's fine-tuning): the mean of the
  patches' tokens, the class token attending but not pooled; with fc_norm after the pooling (timm's
  default for 'avg') or the encoder's final norm before it."""
  reference = _timm_saved(
      tmp_path / 'mae',
      'vit_tiny_patch16_224',
      patch_size=7,
      class_token=True,
      global_pool='avg',
      fc_norm=fc_norm,
  )
  run = _prepare(tmp_path, str(tmp_path / 'mae'))
  fields = ('classifier', 'class_token', 'fc_norm')
  assert tuple(run.model_config[k] for k in fields) == ('gap', True, fc_norm)
  inputs = _images(3)
  expected = torch_outputs(reference, timm_input(reference, inputs)).numpy()
  np.testing.assert_allclose(_logits(run, inputs), expected, atol=1e-4)
  rebuilt = _rebuilt_by_timm(run, tmp_path / 'export')
  np.testing.assert_allclose(torch_outputs(rebuilt, inputs).numpy(), expected, atol=1e-4)
