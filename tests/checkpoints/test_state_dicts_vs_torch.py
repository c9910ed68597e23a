"""timm and Hugging Face transformers weights in (`config.init_from`) and out (export's timm/).

The references are the libraries themselves: models built by timm and transformers, saved by their own
`save` functions, run by PyTorch on the same images. torch, timm and transformers are in the `test`
extra; without them these tests fail rather than skip.
"""

import json
import os
import shutil

import jax
import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
import safetensors.torch
import timm
import timm.models.vision_transformer as timm_vit
import torch
import transformers
from etils import epath

import helpers
from torch_references import (
    HF_EPSILON,
    IMAGE_SIZE,
    MODEL,
    NUM_CLASSES,
    OR_VARIANT,
    TIMM_TINY,
    assert_exported_tensors,
    images,
    ours,
    randomize,
    timm_input,
    timm_rebuilt,
    timm_saved,
    torch_outputs,
)
from vit_jax.checkpoints import run_dir, state_dicts, warm_start
from vit_jax.checkpoints import timm_export, timm_export_tensors
from vit_jax.checkpoints import torch_files
from vit_jax.models import vit_variants
from vit_jax.models import variants
from vit_jax.tasks import classification


def _timm_model(**kwargs) -> timm_vit.VisionTransformer:
  return randomize(timm_vit.VisionTransformer(**{**TIMM_TINY, **kwargs}))


@pytest.mark.parametrize(
    'timm_kwargs,overrides',
    [
        ({}, {}),
        (
            {'class_token': False, 'global_pool': 'avg'},
            {'model.classifier': 'gap', 'model.fc_norm': True},
        ),
        (
            {'class_token': False, 'global_pool': 'avg', 'fc_norm': False},
            {'model.classifier': 'gap'},
        ),
        # DeiT III's blocks: layer scale, and no position embedding for the class token.
        ({'init_values': 1e-6, 'no_embed_class': True}, {'model.layer_scale': 1e-6}),
    ],
    ids=['token', 'gap_fc_norm', 'gap', 'deit3'],
)
def test_a_timm_vit_saved_by_timm_loads_through_init_from_with_equal_logits(
    tmp_path, timm_kwargs, overrides
):
  reference = _timm_model(**timm_kwargs)
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(reference.state_dict(), path)
  np.testing.assert_allclose(
      ours(path, NUM_CLASSES, **overrides), torch_outputs(reference, images()).numpy(), atol=1e-4
  )


def test_a_timm_vit_without_a_class_token_embedding_loads_with_equal_logits(tmp_path):
  # no_embed_class (FlexiViT's): the class token is added no position embedding, and pos_embed has
  # rows for the patches only; ours is the same with a zero row for the class token.
  reference = timm_saved(tmp_path / 'flexi', no_embed_class=True)
  assert reference.pos_embed.shape[1] == (IMAGE_SIZE // 4) ** 2
  np.testing.assert_allclose(
      ours(str(tmp_path / 'flexi'), NUM_CLASSES),
      torch_outputs(reference, images()).numpy(),
      atol=1e-4,
  )


def test_timms_dinov2_loads_with_equal_logits_and_exports_back(tmp_path):
  """vit_small_patch14_dinov2's shape (patch 14, layer scale, the exact GELU; smaller here), made by
  timm.create_model and saved by its save_for_hf: our logits are timm's, and export's state dict
  loads back into timm's model with its tensors unchanged."""
  size = 28
  reference = timm_saved(
      tmp_path / 'dinov2', 'vit_small_patch14_dinov2', img_size=size, patch_size=14, mlp_ratio=4.0
  )
  config = helpers.load_config(
      'demo',
      {
          **MODEL,
          'model.patch_size': 14,
          'model.mlp_dim': 128,
          'model.layer_scale': 1e-5,
          'image_size': size,
          'init_from': str(tmp_path / 'dinov2'),
          'keep_head': True,
      },
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  images = np.random.RandomState(2).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  np.testing.assert_allclose(
      model.apply({'params': params}, images),
      torch_outputs(reference, timm_input(reference, images)).numpy(),
      atol=1e-4,
  )
  exported = timm_export_tensors.to_state_dict(params)
  assert_exported_tensors(exported, reference, folded=('patch_embed.',))


_DINOV2 = ('vit_small_patch14_dinov2', 14, {'mlp_ratio': 4.0}, {'model.layer_scale': 1e-5})
# CLIP's patch embedding has no bias: the constant is in the patches' position embeddings.
_CLIP = (
    'vit_base_patch16_clip_224',
    16,
    {'mlp_ratio': 4.0},
    {'model.pre_norm': True, 'model.layernorm_epsilon': 1e-5},
)


@pytest.mark.parametrize(
    'architecture,patch_size,image_size',
    [(_DINOV2, 7, 14), (_DINOV2, 4, 16), (_DINOV2, 28, 56), (_CLIP, 8, 16)],
    ids=['dinov2_7', 'dinov2_4', 'dinov2_28', 'clip_8'],
)
def test_a_normalised_timm_vit_at_another_patch_size_matches_timms_own_resampling(
    tmp_path, architecture, patch_size, image_size
):
  """ImageNet's (DINOv2's) and OpenAI's (CLIP's) normalisation folded in and the patch embedding
  resampled (smaller: least squares; larger: exact) gives the logits of timm's model of that patch
  size, loaded by timm's checkpoint filter (resample_patch_embed, bicubic) and fed its normalised
  pixels: the constant the normalisation adds is the resampled kernel's, as timm's model computes
  it."""
  name, saved_patch, timm_kwargs, fields = architecture
  path = str(tmp_path / name)
  saved = timm_saved(path, name, img_size=2 * saved_patch, patch_size=saved_patch, **timm_kwargs)
  reference = timm.create_model(
      name,
      pretrained=False,
      **{**TIMM_TINY, 'img_size': image_size, 'patch_size': patch_size, **timm_kwargs},
  )
  reference.load_state_dict(timm_vit.checkpoint_filter_fn(saved.state_dict(), reference))
  reference.eval()
  config = helpers.load_config(
      'demo',
      {
          **MODEL,
          **fields,
          'model.patch_size': patch_size,
          'model.mlp_dim': 128,
          'image_size': image_size,
          'init_from': path,
          'keep_head': True,
          'patch_interpolation': 'bicubic',
          'posemb_interpolation': 'bicubic',
      },
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  inputs = np.random.RandomState(3).uniform(-1, 1, (3, image_size, image_size, 3))
  inputs = inputs.astype(np.float32)
  np.testing.assert_allclose(
      model.apply({'params': params}, inputs),
      torch_outputs(reference, timm_input(saved, inputs)).numpy(),
      atol=1e-4,
  )


def test_timms_dinov2_with_registers_loads_with_equal_logits_at_its_size_and_another(tmp_path):
  """vit_small_patch14_reg4_dinov2's shape (4 registers after the class token, position embeddings
  for the patches only, layer scale; smaller here): timm's logits at its size; at a larger one the
  patches' embeddings are resized and the prefix tokens' kept."""
  size = 28
  path = str(tmp_path / 'dinov2_reg4')
  reference = timm_saved(
      path, 'vit_small_patch14_reg4_dinov2', img_size=size, patch_size=14, mlp_ratio=4.0
  )
  assert reference.num_prefix_tokens == 5 and reference.pos_embed.shape[1] == 4
  fields = {
      **MODEL,
      'model.patch_size': 14,
      'model.mlp_dim': 128,
      'model.layer_scale': 1e-5,
      'model.num_registers': 4,
      'init_from': path,
      'keep_head': True,
  }
  images = np.random.RandomState(2).uniform(-1, 1, (3, size, size, 3)).astype(np.float32)
  config = helpers.load_config('demo', {**fields, 'image_size': size})
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  np.testing.assert_allclose(
      model.apply({'params': params}, images),
      torch_outputs(reference, timm_input(reference, images)).numpy(),
      atol=1e-4,
  )
  larger = helpers.load_config('demo', {**fields, 'image_size': 42})
  model = classification.make_model(larger, helpers.model_config(larger), NUM_CLASSES)
  resized = warm_start.load_init_params(larger, model)['Transformer']['posembed_input']
  assert resized['pos_embedding'].shape == (1, 5 + 9, 32)
  np.testing.assert_array_equal(resized['pos_embedding'][:, :5], 0)  # The prefix tokens' zeros.
  without = helpers.load_config('demo', {**fields, 'image_size': size, 'model.num_registers': 0})
  model = classification.make_model(without, helpers.model_config(without), NUM_CLASSES)
  with pytest.raises(
      ValueError, match=r'^reg: checkpoint \(1, 4, 32\) vs model none: .*num_registers=4$'
  ):
    warm_start.load_init_params(without, model)


def test_timms_siglip_loads_with_equal_logits_and_exports_back(tmp_path):
  """vit_base_patch16_siglip_224's shape (no class token, timm's attention pooling attn_pool; timm
  1.0.31 builds it with the exact GELU; smaller here): timm's logits through our MAP head, and our
  export's state dict is timm's, tensor for tensor."""
  reference = timm_saved(tmp_path / 'siglip', 'vit_base_patch16_siglip_224')
  overrides = {'model.classifier': 'map'}
  np.testing.assert_allclose(
      ours(str(tmp_path / 'siglip'), NUM_CLASSES, **overrides),
      torch_outputs(reference, images()).numpy(),
      atol=1e-4,
  )
  config = helpers.load_config(
      'demo', {**MODEL, **overrides, 'init_from': str(tmp_path / 'siglip'), 'keep_head': True}
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  exported = timm_export_tensors.to_state_dict(warm_start.load_init_params(config, model))
  assert_exported_tensors(exported, reference)


@pytest.mark.parametrize(
    'name,activation',
    [('vit_base_patch16_clip_224', 'gelu'), ('vit_base_patch16_clip_quickgelu_224', 'quick_gelu')],
)
def test_timms_clip_loads_with_equal_logits_and_exports_for_timm(tmp_path, name, activation):
  """CLIP's image tower in timm (a LayerNorm before the blocks, no patch bias, LayerNorms of epsilon
  1e-5, quick GELU in the quickgelu variant; smaller here): timm's logits, the state dict exported back
  tensor for tensor, and timm builds our export with the same logits."""
  reference = timm_saved(tmp_path / 'clip', name)
  fields = {
      **MODEL,
      'model.pre_norm': True,
      'model.layernorm_epsilon': 1e-5,
      'model.mlp_activation': activation,
      'init_from': str(tmp_path / 'clip'),
      'keep_head': True,
  }
  expected = torch_outputs(reference, timm_input(reference, images())).numpy()
  config = helpers.load_config('demo', fields)
  model_config = helpers.model_config(config)
  model = classification.make_model(config, model_config, NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  np.testing.assert_allclose(model.apply({'params': params}, images()), expected, atol=1e-4)
  # CLIP's normalisation is folded into the patch kernel and, without a patch bias, the position
  # embeddings.
  assert_exported_tensors(
      timm_export_tensors.to_state_dict(params), reference, folded=('patch_embed.', 'pos_embed')
  )
  rebuilt = timm_rebuilt(
      params, model_config, IMAGE_SIZE, config.pp_eval.to_dict(), tmp_path / 'export'
  )
  np.testing.assert_allclose(torch_outputs(rebuilt, images()).numpy(), expected, atol=1e-4)


def test_a_layer_scale_mismatch_is_one_line_naming_the_field(tmp_path):
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(_timm_model(init_values=1e-5).state_dict(), path)
  with pytest.raises(
      ValueError, match=r'the checkpoint has layer scale; set --config.model.layer_scale=1e-5'
  ) as error:
    ours(path, NUM_CLASSES)
  assert '\n' not in str(error.value)
  plain = str(tmp_path / 'plain.safetensors')
  safetensors.torch.save_file(_timm_model().state_dict(), plain)
  with pytest.raises(
      ValueError, match=r'the checkpoint has no layer scale; unset --config.model.layer_scale'
  ):
    ours(plain, NUM_CLASSES, **{'model.layer_scale': 1e-5})


def test_grouped_heads_and_attention_only_layer_scale_mismatches_name_their_fields(tmp_path):
  """A bare file of timm's Eva with one key head for two query heads (grouped-query attention) and
  layer scale of the attention alone (Sapiens 2's): a model without them is a one-line error naming
  model.num_kv_heads, then model.layer_scale_mlp; with both set, timm's logits."""
  reference = randomize(
      timm.models.eva.Eva(
          **TIMM_TINY,
          attn_type='rope',
          qkv_fused=False,
          num_kv_heads=1,
          init_values=1.0,
          attn_only_layer_scale=True,
          global_pool='token',
      )
  )
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(reference.state_dict(), path)
  scaled = {'model.layer_scale': 1.0}
  with pytest.raises(
      ValueError,
      match=r'the checkpoint has 1 key and value heads here; set --config.model.num_kv_heads=1 ',
  ) as error:
    ours(path, NUM_CLASSES, **scaled)
  assert '\n' not in str(error.value)
  with pytest.raises(
      ValueError,
      match=r"/ls2: checkpoint none vs model \(32,\): the checkpoint scales the attention's branch "
      r'alone; set --config.model.layer_scale_mlp=False$',
  ):
    ours(path, NUM_CLASSES, **scaled, **{'model.num_kv_heads': 1})
  fields = {**scaled, 'model.num_kv_heads': 1, 'model.layer_scale_mlp': False}
  np.testing.assert_allclose(
      ours(path, NUM_CLASSES, **fields),
      torch_outputs(reference, images()).numpy(),
      atol=1e-4,
  )


def test_a_parallel_block_mismatch_names_model_parallel_block(tmp_path):
  """A bare file of timm's ParallelScalingBlocks (one norm for attention and MLP) read by a model of
  standard blocks: one line naming model.parallel_block; with it, timm's logits."""
  reference = _timm_model(block_fn=timm_vit.ParallelScalingBlock)
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(reference.state_dict(), path)
  with pytest.raises(
      ValueError,
      match=r'/LayerNorm_2/(scale|bias): checkpoint none vs model \(32,\): the checkpoint runs '
      r'attention and MLP side by side; set --config.model.parallel_block=True$',
  ):
    ours(path, NUM_CLASSES)
  np.testing.assert_allclose(
      ours(path, NUM_CLASSES, **{'model.parallel_block': True}),
      torch_outputs(reference, images()).numpy(),
      atol=1e-4,
  )


@pytest.mark.parametrize(
    'timm_kwargs,overrides,message',
    [
        # The tensors of a GAP ViT with fc_norm, pooled otherwise.
        (
            {'class_token': False, 'global_pool': 'max'},
            {'model.classifier': 'gap', 'model.fc_norm': True},
            r"pools with global_pool='max', which vit_jax's ViT does not compute \(model.classifier: "
            r"token pools as timm's token, gap as its avg",
        ),
        (
            {'class_token': False, 'global_pool': 'avgmax'},
            {'model.classifier': 'gap', 'model.fc_norm': True},
            r"pools with global_pool='avgmax'",
        ),
    ],
    ids=['max', 'avgmax'],
)
def test_a_timm_pooling_our_vit_does_not_compute_is_a_one_line_error(
    tmp_path, timm_kwargs, overrides, message
):
  # Pooling has no parameters: these state dicts load into our models, with other logits. timm's
  # config.json says how it pools.
  timm_saved(tmp_path / 'timm', **timm_kwargs)
  with pytest.raises(ValueError, match=message) as error:
    ours(str(tmp_path / 'timm'), NUM_CLASSES, **overrides)
  assert '\n' not in str(error.value)
  # The poolings ours computes load as before.
  reference = timm_saved(tmp_path / 'avg', class_token=False, global_pool='avg')
  np.testing.assert_allclose(
      ours(
          str(tmp_path / 'avg'), NUM_CLASSES, **{'model.classifier': 'gap', 'model.fc_norm': True}
      ),
      torch_outputs(reference, images()).numpy(),
      atol=1e-4,
  )


def test_head_dropout_rate_drops_as_timms_drop_rate(tmp_path):
  # The same weights in training mode, 2000 dropout draws per image on each side: timm's logits and
  # ours have the same mean and spread only if both drop the same features at the same rate.
  reference = _timm_model(drop_rate=0.5)
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(reference.state_dict(), path)
  config = helpers.load_config(
      'demo',
      {
          **MODEL,
          'init_from': path,
          'keep_head': True,
          'model.dropout_rate': 0.0,
          'model.head_dropout_rate': 0.5,
      },
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  repeated = np.repeat(images(2), 2000, axis=0)
  ours = np.asarray(
      model.apply({'params': params}, repeated, train=True, rngs={'dropout': jax.random.key(0)})
  ).reshape(2, 2000, NUM_CLASSES)
  theirs = torch_outputs(reference.train(), repeated).numpy().reshape(2, 2000, NUM_CLASSES)
  spread = theirs.std(axis=1)
  assert spread.min() > 0.1, spread
  np.testing.assert_allclose(ours.std(axis=1), spread, rtol=0.1)
  np.testing.assert_allclose(ours.mean(axis=1), theirs.mean(axis=1), atol=0.15 * spread.max())


@pytest.mark.parametrize(
    'timm_kwargs,overrides',
    [
        ({}, {}),
        (
            {'class_token': False, 'global_pool': 'avg', 'reg_tokens': 2},
            {'model.classifier': 'gap', 'model.fc_norm': True, 'model.num_registers': 2},
        ),
    ],
    ids=['token', 'gap_registers'],
)
def test_patch_dropout_keeps_the_patches_timms_patch_drop_rate_keeps(
    tmp_path, monkeypatch, timm_kwargs, overrides
):
  """The same weights in training mode and the same noise (timm draws torch.randn [b, patches]):
  timm's logits with patch_drop_rate=0.5 are ours with model.patch_dropout=0.5, the prefix tokens
  kept and half the patches (2 of 4) dropped, and differ from those without it."""
  import timm.layers.patch_dropout as timm_patch_dropout  # pylint: disable=g-import-not-at-top

  reference = _timm_model(patch_drop_rate=0.5, **timm_kwargs)
  path = str(tmp_path / 'model.safetensors')
  safetensors.torch.save_file(reference.state_dict(), path)
  inputs = images(6)
  noise = np.random.default_rng(0).standard_normal((len(inputs), 4)).astype(np.float32)
  monkeypatch.setattr(timm_patch_dropout.torch, 'randn', lambda *a, **k: torch.from_numpy(noise))
  theirs = torch_outputs(reference.train(), inputs).numpy()
  config = helpers.load_config(
      'demo',
      {
          **MODEL,
          'init_from': path,
          'keep_head': True,
          'model.dropout_rate': 0.0,
          'model.head_dropout_rate': 0.0,
          'model.patch_dropout': 0.5,
          **overrides,
      },
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = warm_start.load_init_params(config, model)
  apply = lambda **kw: np.asarray(model.apply({'params': params}, inputs, **kw))
  np.testing.assert_allclose(apply(train=True, patch_noise=noise), theirs, atol=1e-4)
  np.testing.assert_allclose(apply(), torch_outputs(reference.eval(), inputs).numpy(), atol=1e-4)
  assert not np.allclose(apply(), theirs, atol=1e-3)


def test_a_timm_checkpoint_in_pytorch_format_and_in_bfloat16_loads_too(tmp_path):
  reference = _timm_model()
  # A training checkpoint, as timm's train.py writes it (model_best.pth.tar): its EMA beside.
  training = {
      'epoch': 3,
      'arch': 'vit_tiny_patch16_224',
      'state_dict': reference.state_dict(),
      'state_dict_ema': {k: v + 1 for k, v in reference.state_dict().items()},
  }
  torch.save(training, tmp_path / 'checkpoint.pth')
  torch.save(training, tmp_path / 'model_best.pth.tar')
  expected = torch_outputs(reference, images()).numpy()
  for name in ('checkpoint.pth', 'model_best.pth.tar'):
    np.testing.assert_allclose(ours(str(tmp_path / name), NUM_CLASSES), expected, atol=1e-4)
  safetensors.torch.save_file(
      {k: v.bfloat16() for k, v in reference.state_dict().items()}, tmp_path / 'bf16.safetensors'
  )
  loaded, _ = torch_files.read(str(tmp_path / 'bf16.safetensors'))
  assert loaded['pos_embed'].dtype == ml_dtypes.bfloat16
  np.testing.assert_array_equal(
      loaded['pos_embed'].astype(np.float32),
      reference.state_dict()['pos_embed'].bfloat16().float().numpy(),
  )
  np.testing.assert_allclose(
      ours(str(tmp_path / 'bf16.safetensors'), NUM_CLASSES), expected, atol=0.1
  )


def _transformers_config(**kwargs) -> transformers.ViTConfig:
  return transformers.ViTConfig(
      hidden_size=32,
      num_hidden_layers=2,
      num_attention_heads=2,
      intermediate_size=64,
      image_size=IMAGE_SIZE,
      patch_size=4,
      **kwargs,
  )


def test_a_transformers_classifier_saved_by_transformers_loads_with_equal_logits(tmp_path):
  reference = randomize(
      transformers.ViTForImageClassification(_transformers_config(num_labels=NUM_CLASSES))
  )
  reference.save_pretrained(tmp_path / 'hf')  # config.json + model.safetensors, the hub's layout.
  expected = torch_outputs(reference, images()).logits.numpy()
  np.testing.assert_allclose(
      ours(str(tmp_path / 'hf'), NUM_CLASSES, **HF_EPSILON), expected, atol=1e-4
  )
  # Sharded as the hub shards big models: model.safetensors.index.json and its parts.
  reference.save_pretrained(tmp_path / 'sharded', max_shard_size='20KB')
  assert not (tmp_path / 'sharded' / 'model.safetensors').exists()
  np.testing.assert_allclose(
      ours(str(tmp_path / 'sharded'), NUM_CLASSES, **HF_EPSILON), expected, atol=1e-4
  )


def test_a_transformers_directory_of_pickled_weights_loads_as_transformers_loads_it(tmp_path):
  """Older hub repositories hold pytorch_model.bin (or its shards and pytorch_model.bin.index.json),
  which transformers still reads; vit_jax reads them without torch."""
  reference = randomize(
      transformers.ViTForImageClassification(_transformers_config(num_labels=NUM_CLASSES))
  )
  expected = torch_outputs(reference, images()).logits.numpy()
  reference.save_pretrained(tmp_path / 'hf')  # The hub's names (transformers renames its modules').
  tensors = safetensors.torch.load_file(tmp_path / 'hf' / 'model.safetensors')
  names = list(tensors)
  shards = {
      'pytorch_model-00001-of-00002.bin': names[: len(names) // 2],
      'pytorch_model-00002-of-00002.bin': names[len(names) // 2 :],
  }
  for directory, files in [('bin', {'pytorch_model.bin': names}), ('sharded', shards)]:
    reference.config.save_pretrained(tmp_path / directory)
    for file, part in files.items():
      torch.save({name: tensors[name] for name in part}, tmp_path / directory / file)
    if directory == 'sharded':
      weight_map = {name: file for file, part in files.items() for name in part}
      (tmp_path / directory / 'pytorch_model.bin.index.json').write_text(
          json.dumps({'metadata': {}, 'weight_map': weight_map})
      )
    loaded = transformers.ViTForImageClassification.from_pretrained(tmp_path / directory)
    np.testing.assert_allclose(torch_outputs(loaded, images()).logits.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(
        ours(str(tmp_path / directory), NUM_CLASSES, **HF_EPSILON), expected, atol=1e-4
    )


def test_a_state_dict_of_transformers_in_memory_names_is_one_line(tmp_path):
  """transformers 5 names its modules otherwise than the hub (save_pretrained renames them): a
  `model.state_dict()` saved by torch.save says so."""
  vit = transformers.ViTForImageClassification(_transformers_config())
  vit.config.save_pretrained(tmp_path / 'hf')
  torch.save(vit.state_dict(), tmp_path / 'hf' / 'pytorch_model.bin')
  with pytest.raises(
      ValueError, match=r"transformers 5's in-memory names .* save_pretrained\(DIR\)"
  ):
    ours(str(tmp_path / 'hf'), NUM_CLASSES)


def test_a_transformers_vit_model_brings_its_pooler_as_the_pre_logits_layer(tmp_path):
  reference = randomize(transformers.ViTModel(_transformers_config(), add_pooling_layer=True))
  reference.save_pretrained(tmp_path / 'hf')
  expected = torch_outputs(reference, images()).pooler_output.numpy()
  features = ours(
      str(tmp_path / 'hf'),
      None,
      **{'model.representation_size': 32, 'keep_pre_logits': True, **HF_EPSILON},
  )
  np.testing.assert_allclose(features, expected, atol=1e-4)
  # Its size read from the file, as every field of variant='checkpoint' is.
  unset = {f'model.{name}': None for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')}
  config = helpers.load_config(
      'demo',
      {
          **unset,
          'variant': vit_variants.FROM_CHECKPOINT,
          'init_from': str(tmp_path / 'hf'),
          'keep_pre_logits': True,
          'image_size': IMAGE_SIZE,
      },
  )
  warm_start.fill_from_checkpoint(config)
  assert config.model.representation_size == 32
  model = classification.make_model(config, helpers.model_config(config), None)
  features = model.apply({'params': warm_start.load_init_params(config, model)}, images())
  np.testing.assert_allclose(features, expected, atol=1e-4)


def test_our_export_loads_into_timm_with_equal_logits(trained_tiny_run, exported_tiny_run):
  workdir, exported = trained_tiny_run, exported_tiny_run
  timm_dir = os.path.join(exported, 'timm')
  reference = timm.create_model(f'local-dir:{timm_dir}', pretrained=True).eval()
  images = np.random.RandomState(0).uniform(-1, 1, (6, 8, 8, 3)).astype(np.float32)
  ours = helpers.model_logits(workdir, helpers.checkpoint_params(workdir, 12), images)
  np.testing.assert_allclose(torch_outputs(reference, images).numpy(), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.1  # The trained head is not (nearly) zero: a match of substance.
  assert reference.pretrained_cfg['label_names'] == list('0123456789')
  with open(os.path.join(exported, 'config.json')) as f:
    assert json.load(f)['timm'] == 'timm/model.safetensors, timm/config.json'
  # And back: the exported directory is a timm model directory that init_from reads.
  config = helpers.load_config('demo', {**helpers.TINY, 'init_from': timm_dir, 'keep_head': True})
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  np.testing.assert_allclose(
      np.asarray(model.apply({'params': warm_start.load_init_params(config, model)}, images)),
      ours,
      atol=1e-5,
  )


def test_the_safetensors_we_write_are_read_by_the_safetensors_package(tmp_path):
  tensors = {
      'a': np.arange(6, dtype=np.float32).reshape(2, 3),
      'b': np.ones((1, 5), ml_dtypes.bfloat16),
      'c': np.zeros((), np.int64),
  }
  torch_files.write_safetensors(tensors, str(tmp_path / 'x.safetensors'))
  theirs = safetensors.torch.load_file(tmp_path / 'x.safetensors')
  assert theirs['b'].dtype == torch.bfloat16 and theirs['c'].shape == ()
  np.testing.assert_array_equal(theirs['a'].numpy(), tensors['a'])
  safetensors.numpy.save_file(
      {'a': tensors['a']}, tmp_path / 'y.safetensors', metadata={'format': 'np'}
  )
  np.testing.assert_array_equal(
      torch_files.read_safetensors(epath.Path(tmp_path / 'y.safetensors'))['a'], tensors['a']
  )


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'model.representation_size': 16}, "timm's VisionTransformer has no pre-logits layer"),
        (
            {'model.posemb': 'learn2d'},
            r'as a tensor: learned 1-D ones .* not 2-D, relative or none',
        ),
    ],
)
def test_what_timm_cannot_hold_is_said_and_not_written(overrides, message):
  config = helpers.load_config('demo', {**MODEL, **overrides})
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  with pytest.raises(ValueError, match=message):
    timm_export_tensors.to_state_dict(helpers.random_params(model, IMAGE_SIZE))


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'model.posemb_where': 'shared_every_layer'}, 'position embeddings only at the input'),
        (
            {'model.classifier': 'token_gap'},
            "timm's ViTs pool as model.classifier token, gap, map do, not as 'token_gap'$",
        ),
        (
            {'model.layernorm_epsilon': 1e-12},
            "timm's VisionTransformer normalises with layernorm of epsilon 1e-06, layernorm of "
            'epsilon 1e-05, rmsnorm of epsilon 1e-06, not model.norm_layer=layernorm of '
            'model.layernorm_epsilon=1e-12$',
        ),
        (
            {'model.norm_layer': 'rmsnorm', 'model.layernorm_epsilon': 1e-5},
            'rmsnorm of epsilon 1e-06, not model.norm_layer=rmsnorm of '
            'model.layernorm_epsilon=1e-05$',
        ),
        (
            {'model.embed_norm': True, 'model.layernorm_epsilon': 1e-5},
            r'patch embeddings \(model.embed_norm\) of epsilon 1e-06 only, not '
            'model.layernorm_epsilon=1e-05$',
        ),
        (
            {'model.rope': True, 'model.norm_layer': 'rmsnorm', 'model.layernorm_epsilon': 1e-5},
            "timm's Eva .* normalises with layernorm of epsilon 1e-06, layernorm of epsilon 1e-05, "
            'rmsnorm of epsilon 1e-06, not model.norm_layer=rmsnorm of '
            'model.layernorm_epsilon=1e-05$',
        ),
        (
            {
                'model.mlp_gated': True,
                'model.mlp_activation': 'silu',
                'model.res_post_norm': True,
                'model.norm_layer': 'rmsnorm',
                'model.layernorm_epsilon': 1e-5,
            },
            'timm has no ResPostBlock ViT that is a SwiGLU ViT too',
        ),
    ],
)
def test_what_timm_cannot_compute_and_the_tensors_do_not_show_is_said(overrides, message):
  config = helpers.load_config('demo', {**MODEL, **overrides})
  model_config = helpers.model_config(config)
  model = classification.make_model(config, model_config, NUM_CLASSES)
  with pytest.raises(ValueError, match=message):
    timm_export.export(
        helpers.random_params(model, IMAGE_SIZE),
        model_config,
        IMAGE_SIZE,
        NUM_CLASSES,
        pp_eval=config.pp_eval.to_dict(),
    )


def test_a_checkpoint_of_another_model_is_a_one_line_error(tmp_path):
  resnet = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
  safetensors.torch.save_file(resnet.state_dict(), tmp_path / 'resnet.safetensors')
  with pytest.raises(
      ValueError,
      match=r'resnet.safetensors: a state dict of another model \(\d+ tensors, '
      r"e.g. '0.bias'.*timm's, Hugging Face transformers', OpenCLIP's, Meta's Sapiens 2 or DINOv3 "
      "or Apple's AIMv2 naming",
  ) as error:
    ours(str(tmp_path / 'resnet.safetensors'), NUM_CLASSES)
  assert '\n' not in str(error.value)
  # A ViT with parts ours has not (register tokens) names the first of them.
  safetensors.torch.save_file(_timm_model(reg_tokens=1).state_dict(), tmp_path / 'reg.safetensors')
  with pytest.raises(
      ValueError,
      match=r'^reg: checkpoint \(1, 1, 32\) vs model none: the checkpoint has 1 register token; '
      r'set --config.model.num_registers=1$',
  ):
    ours(str(tmp_path / 'reg.safetensors'), NUM_CLASSES)
  (tmp_path / 'broken.safetensors').write_bytes(b'\x10\x00\x00\x00\x00\x00\x00\x00{"a": [')
  with pytest.raises(
      ValueError, match=r'broken.safetensors is not a readable safetensors file.*init_from'
  ):
    ours(str(tmp_path / 'broken.safetensors'), NUM_CLASSES)


def test_a_checkpoint_of_another_width_or_head_count_names_the_fix(tmp_path):
  reference = transformers.ViTForImageClassification(_transformers_config(num_labels=NUM_CLASSES))
  reference.save_pretrained(tmp_path / 'hf')
  with pytest.raises(
      ValueError,
      match=r"checkpoint's number of attention heads is 2, the model's 4: set "
      r'--config.model.num_heads=2' + OR_VARIANT,
  ):
    ours(str(tmp_path / 'hf'), NUM_CLASSES, **{'model.num_heads': 4})
  safetensors.torch.save_file(_timm_model().state_dict(), tmp_path / 'model.safetensors')
  with pytest.raises(
      ValueError,
      match=r'^cls: checkpoint \(1, 1, 32\) vs model \(1, 1, 64\): the checkpoint is '
      r'another architecture',
  ):
    ours(
        str(tmp_path / 'model.safetensors'),
        NUM_CLASSES,
        **{'model.hidden_size': 64, 'model.mlp_dim': 128, 'keep_head': False},
    )


def test_a_checkpoint_of_another_gelu_or_layernorm_epsilon_is_a_one_line_error(tmp_path):
  # Neither has tensors: the weights would load and compute another function.
  transformers.ViTModel(_transformers_config()).save_pretrained(tmp_path / 'hf')
  path = str(tmp_path / 'hf')
  with pytest.raises(
      ValueError,
      match=r"the checkpoint's MLP activation is 'gelu', the model's 'gelu_tanh': set "
      r'--config.model.mlp_activation=gelu' + OR_VARIANT,
  ):
    run_dir.load_params(path, {'num_heads': 2, 'mlp_activation': 'gelu_tanh'})
  with pytest.raises(
      ValueError,
      match=r"the checkpoint's LayerNorm epsilon is 1e-12, the model's 1e-06: set "
      r'--config.model.layernorm_epsilon=1e-12' + OR_VARIANT,
  ):
    ours(path, None)
  run_dir.load_params(path, {'num_heads': 2, 'mlp_activation': 'gelu', 'layernorm_epsilon': 1e-12})


def test_a_transformers_vit_of_the_small_epsilon_loads_with_its_logits_where_it_matters(tmp_path):
  # Tokens of small variance (LayerNorm scale ~1e-3 of the inputs): an epsilon of 1e-6 instead of the
  # checkpoint's 1e-12 changes the logits by far more than float32 rounding.
  reference = randomize(
      transformers.ViTForImageClassification(_transformers_config(num_labels=NUM_CLASSES))
  )
  with torch.no_grad():
    reference.vit.embeddings.patch_embeddings.projection.weight.mul_(1e-3)
    reference.vit.embeddings.patch_embeddings.projection.bias.mul_(1e-3)
    reference.vit.embeddings.position_embeddings.mul_(1e-3)
    reference.vit.embeddings.cls_token.mul_(1e-3)
  reference.save_pretrained(tmp_path / 'hf')
  expected = torch_outputs(reference, images()).logits.numpy()
  logits = ours(str(tmp_path / 'hf'), NUM_CLASSES, **HF_EPSILON)
  np.testing.assert_allclose(logits, expected, atol=1e-4 * np.abs(expected).max())
  (tmp_path / 'hf' / 'config.json').unlink()  # Unchecked: the wrong epsilon loads, and differs.
  wrong = ours(str(tmp_path / 'hf'), NUM_CLASSES)
  assert np.abs(wrong - expected).max() > 1e-2 * np.abs(expected).max()


def test_an_mlp_activation_our_vit_has_not_is_a_one_line_error(tmp_path):
  # An activation has no parameters: the weights would load and compute another function.
  transformers.ViTModel(_transformers_config(hidden_act='relu')).save_pretrained(tmp_path / 'relu')
  with pytest.raises(
      ValueError,
      match=r"the checkpoint's MLP uses the activation 'relu', which "
      r"vit_jax's ViT has not \(model.mlp_activation: gelu, gelu_tanh, quick_gelu, silu\)",
  ):
    run_dir.load_params(str(tmp_path / 'relu'), {'num_heads': 2, 'mlp_activation': 'gelu'})
  # transformers' names of GELU's tanh form are ours.
  reference = randomize(
      transformers.ViTForImageClassification(
          _transformers_config(num_labels=NUM_CLASSES, hidden_act='gelu_pytorch_tanh')
      )
  )
  reference.save_pretrained(tmp_path / 'tanh')
  with pytest.raises(ValueError, match=r'set --config.model.mlp_activation=gelu_tanh' + OR_VARIANT):
    run_dir.load_params(str(tmp_path / 'tanh'), {'num_heads': 2, 'mlp_activation': 'gelu'})
  np.testing.assert_allclose(
      ours(
          str(tmp_path / 'tanh'),
          NUM_CLASSES,
          **{'model.mlp_activation': 'gelu_tanh', **HF_EPSILON},
      ),
      torch_outputs(reference, images()).logits.numpy(),
      atol=1e-4,
  )


@pytest.mark.parametrize(
    'hidden_size,mlp_dim,overrides',
    [
        (32, 64, {}),
        (56, 488, {}),  # 56 * (488 / 56) = 487.99...
        (32, 64, {'model.layer_scale': 1e-5, 'model.num_registers': 2}),
        (32, 64, {'model.classifier': 'map'}),
        # Fixed position embeddings, written as the tensor they are at the export's resolution.
        (32, 64, {'model.posemb': 'sincos2d'}),
        (32, 64, {'model.posemb': 'sincos2d_mae', 'model.num_registers': 2}),
    ],
)
def test_timms_config_we_write_builds_an_mlp_of_our_width(
    tmp_path, hidden_size, mlp_dim, overrides
):
  config = helpers.load_config(
      'demo', {**MODEL, 'model.hidden_size': hidden_size, 'model.mlp_dim': mlp_dim, **overrides}
  )
  model = classification.make_model(config, helpers.model_config(config), NUM_CLASSES)
  params = helpers.random_params(model, IMAGE_SIZE)
  tensors, timm_config = timm_export.export(
      params,
      variants.get_model_config(config.variant, config.model.to_dict()),
      IMAGE_SIZE,
      NUM_CLASSES,
      pp_eval=config.pp_eval.to_dict(),
  )
  torch_files.write_safetensors(tensors, str(tmp_path / torch_files.SAFETENSORS))
  (tmp_path / 'config.json').write_text(json.dumps(timm_config))
  reference = timm.create_model(f'local-dir:{tmp_path}', pretrained=True).eval()
  np.testing.assert_allclose(
      torch_outputs(reference, images()).numpy(),
      np.asarray(model.apply({'params': params}, images())),
      atol=1e-4,
  )


def _timm_input(pretrained_cfg: dict, image: np.ndarray) -> np.ndarray:
  """timm's eval transform for `pretrained_cfg` (resolve_data_config + create_transform, as timm's
  users prepare images) applied to uint8 [h, w, 3]: float32 [h, w, 3]."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  transform = timm.data.create_transform(
      **timm.data.resolve_data_config(pretrained_cfg=pretrained_cfg)
  )
  return transform(Image.fromarray(image)).permute(1, 2, 0).numpy()


@pytest.mark.parametrize(
    'crop,crop_fraction,image_size',
    [
        ('resize', 0.875, 16),
        ('central', 0.875, 16),
        ('central', 0.9, 16),  # 16 / 0.9 = 17.8: 17, as timm floors it.
        ('central', 0.9, 224),  # 248.9: 248.
    ],
)
@pytest.mark.parametrize('shape', [(40, 120), (70, 50)])
def test_timms_transform_from_the_exported_config_prepares_images_as_our_evaluation(
    crop, crop_fraction, image_size, shape
):
  from vit_jax.tools import classifiers  # pylint: disable=g-import-not-at-top

  pp_eval = {
      'crop': crop,
      'crop_fraction': crop_fraction,
      'antialias': True,
  }  # PIL always antialiases.
  config = timm_export.eval_crop(pp_eval, image_size)
  image = np.random.RandomState(0).randint(0, 256, (*shape, 3)).astype(np.uint8)
  ours = classifiers.model_input(image, image_size, pp_eval)
  # PIL resizes uint8 in two passes, rounding after each: up to a grey level on noise (1 / 127.5 here).
  pretrained_cfg = {
      'input_size': [3, image_size, image_size],
      'mean': [0.5] * 3,
      'std': [0.5] * 3,
      'interpolation': 'bilinear',
      **config,
  }
  np.testing.assert_allclose(_timm_input(pretrained_cfg, image), ours, atol=1.01 / 127.5)


def test_timm_and_our_export_agree_on_a_wide_image_where_the_crops_disagree(
    trained_tiny_run, tmp_path
):
  """The audit's case: a wide image whose centre is another class than the whole. Its export once
  gave timm no crop fields, so timm took its default 87.5% central crop, and a top-1 that vit_jax's
  squashing resize (pp_eval.crop='resize') did not give."""
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax.tools import classifiers, export, predict  # pylint: disable=g-import-not-at-top
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top
  # The tiny run's parameters, evaluated with PIL's antialiased resize as timm's transforms resize:
  # TensorFlow's default bilinear reads 2x2 pixels and, shrinking 120 to 8, sees other pixels.
  workdir = shutil.copytree(trained_tiny_run, tmp_path / 'run')
  config = json.loads((workdir / 'config.json').read_text())
  config['pp_eval']['antialias'] = True
  (workdir / 'config.json').write_text(json.dumps(config))
  export.export(str(workdir), str(tmp_path / 'export'))
  images, labels = digits.split_arrays()['test']
  eight, three = (
      np.asarray(Image.fromarray(images[list(labels).index(d)]).resize((40, 40))) for d in (8, 3)
  )
  wide = np.concatenate([eight, three, eight], axis=1)  # 40 x 120: a 3 between two 8s.
  Image.fromarray(wide).save(tmp_path / 'wide.png')
  ours = dict(
      predict.predict(
          [str(tmp_path / 'wide.png')],
          classifiers.load_export(str(tmp_path / 'export')),
          top_k=NUM_CLASSES,
      )[0][1]
  )
  ours = np.array([ours[name] for name in '0123456789'])
  reference = timm.create_model(f'local-dir:{tmp_path / "export" / "timm"}', pretrained=True).eval()
  with torch.no_grad():
    theirs = reference(
        torch.from_numpy(_timm_input(reference.pretrained_cfg, wide)).permute(2, 0, 1)[None]
    )
  theirs = theirs.softmax(-1)[0].numpy()
  assert theirs.argmax() == ours.argmax(), (theirs.round(3), ours.round(3))
  np.testing.assert_allclose(
      theirs, ours, atol=2e-3
  )  # Inputs within a grey level (the test above).
  assert (
      reference.pretrained_cfg['crop_mode'] == 'squash'
      and reference.pretrained_cfg['crop_pct'] == 1.0
  )


def test_timms_hybrid_vit_is_one_line_naming_the_npz_that_loads(tmp_path):
  timm.models.save_for_hf(
      timm.create_model('vit_tiny_r_s16_p8_224', pretrained=False, depth=1, img_size=32),
      tmp_path / 'hybrid',
      safe_serialization=True,
  )
  with pytest.raises(ValueError, match=r"timm's hybrid ViT .*--config.variant=R50\+ViT-B_16$") as e:
    state_dicts.architecture(str(tmp_path / 'hybrid'))
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('img_size', [(16, 24), (16, 20)])
def test_a_timm_vit_of_a_grid_that_is_not_square_is_one_line(tmp_path, img_size):
  # 1 + 4 x 6 position embeddings are as many as a 5 x 5 grid without a class token's would be.
  timm_saved(tmp_path / 'wide', img_size=img_size)
  with pytest.raises(ValueError, match=rf'made for {img_size[0]}x{img_size[1]} px images') as e:
    ours(str(tmp_path / 'wide'), NUM_CLASSES)
  assert '\n' not in str(e.value)
