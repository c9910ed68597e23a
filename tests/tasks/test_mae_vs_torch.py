"""config.task='mae' against Hugging Face transformers' ViTMAEForPreTraining (MAE's reference port,
the hub's facebook/vit-mae-*): the same random parameters and masking noise give the same hidden
patches, predicted pixels, loss and gradients; and an MAE run's export against timm."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import safetensors.numpy
import timm
import torch
import transformers
from transformers.models.vit_mae import modeling_vit_mae

import helpers
from torch_references import randomize
from vit_jax.checkpoints import run_dir, transformers_layout, transformers_mae
from vit_jax.models.mae import MaskedAutoencoder
from vit_jax.tasks import mae
from vit_jax.tools import classifiers, export
from vit_jax.train import loop, setup as train_setup

IMAGE, PATCH, HEADS, DECODER_HEADS = 16, 4, 4, 2


def _reference(norm_pix_loss: bool, mask_ratio: float) -> transformers.ViTMAEForPreTraining:
  return randomize(
      transformers.ViTMAEForPreTraining(
          transformers.ViTMAEConfig(
              image_size=IMAGE,
              patch_size=PATCH,
              hidden_size=32,
              num_hidden_layers=2,
              num_attention_heads=HEADS,
              intermediate_size=64,
              decoder_hidden_size=16,
              decoder_num_hidden_layers=2,
              decoder_num_attention_heads=DECODER_HEADS,
              decoder_intermediate_size=24,
              mask_ratio=mask_ratio,
              norm_pix_loss=norm_pix_loss,
              attn_implementation='eager',
          )
      )
  )


def _ours(
    reference: transformers.ViTMAEForPreTraining, directory
) -> tuple[MaskedAutoencoder, dict]:
  """Our model and the reference's parameters in our tree, read by vit_jax's transformers readers
  (the encoder's and the MAE decoder's) from the file `save_pretrained` writes."""
  reference.save_pretrained(directory)
  state = safetensors.numpy.load_file(directory / 'model.safetensors')
  params = transformers_layout.from_state_dict(state, HEADS)
  width = state['decoder.decoder_embed.weight'].shape[0]
  config = reference.config
  model = MaskedAutoencoder(
      patch_size=PATCH,
      hidden_size=config.hidden_size,
      num_layers=config.num_hidden_layers,
      mlp_dim=config.intermediate_size,
      num_heads=HEADS,
      mlp_activation='gelu',  # transformers' 'gelu' is the exact one.
      layernorm_epsilon=config.layer_norm_eps,
      mask_ratio=config.mask_ratio,
      decoder_hidden_size=width,
      decoder_num_layers=config.decoder_num_hidden_layers,
      decoder_num_heads=DECODER_HEADS,
      decoder_mlp_dim=config.decoder_intermediate_size,
      decoder_posemb='learn',  # The reference's fixed sin-cos values, as parameters here.
  )
  fields = {field.name: getattr(model, field.name) for field in dataclasses.fields(model)}
  params['decoder'] = transformers_mae.decoder(
      state, json.loads((directory / 'config.json').read_text()), fields, str(directory)
  )
  return model, params


def _inputs(n: int = 3) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  images = rng.uniform(-1, 1, (n, IMAGE, IMAGE, 3)).astype(np.float32)
  return images, rng.uniform(size=(n, (IMAGE // PATCH) ** 2)).astype(np.float32)


def _loss(model, params, images, noise, norm_pix_loss):
  pixels, hidden = model.apply({'params': params}, images, noise=noise)
  errors = mae.patch_errors(model, pixels, images, norm_pix_loss)
  return jnp.sum(errors * hidden) / jnp.sum(hidden), (pixels, hidden)


@pytest.mark.parametrize('norm_pix_loss', [True, False])
@pytest.mark.parametrize('mask_ratio', [0.75, 0.4])
def test_mae_matches_transformers_vitmae_for_pretraining(norm_pix_loss, mask_ratio, tmp_path):
  reference = _reference(norm_pix_loss, mask_ratio)
  model, params = _ours(reference, tmp_path)
  images, noise = _inputs()
  pixel_values = torch.tensor(images.transpose(0, 3, 1, 2), requires_grad=False)
  out = reference(pixel_values=pixel_values, noise=torch.tensor(noise))
  out.loss.backward()

  (loss, (pixels, hidden)), grads = jax.value_and_grad(_loss, argnums=1, has_aux=True)(
      model, params, images, noise, norm_pix_loss
  )
  np.testing.assert_array_equal(hidden, out.mask.numpy())
  assert int(hidden.sum()) == 3 * (16 - mae.visible_patches(16, mask_ratio))
  np.testing.assert_allclose(pixels, out.logits.detach().numpy(), rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(loss, out.loss.item(), rtol=1e-5)
  # Through both halves: the decoder's last layer, and the patch embedding under the encoder.
  named = dict(reference.named_parameters())
  np.testing.assert_allclose(
      grads['decoder']['pred']['bias'], named['decoder.decoder_pred.bias'].grad.numpy(), atol=1e-6
  )
  np.testing.assert_allclose(
      grads['embedding']['bias'],
      named['vit.embeddings.patch_embeddings.projection.bias'].grad.numpy(),
      rtol=2e-4,
      atol=1e-6,
  )


def _maes_table(config: transformers.ViTMAEConfig, width: int) -> torch.Tensor:
  """The fixed sin-cos table transformers' ViTMAE gives an embedding of `width` (MAE's own)."""
  embeddings = modeling_vit_mae.ViTMAEEmbeddings(
      transformers.ViTMAEConfig(**{**config.to_dict(), 'hidden_size': width})
  )
  embeddings.patch_embeddings.projection._is_hf_initialized = False
  embeddings.initialize_weights()
  return embeddings.position_embeddings.detach()


def test_sincos2d_mae_is_vitmaes_fixed_position_embeddings(tmp_path):
  """The reference with MAE's fixed sin-cos tables in its encoder and decoder; our model of
  posemb='sincos2d_mae' and decoder_posemb='sincos2d_mae', without those tensors, gives its loss."""
  reference = _reference(True, 0.75)
  with torch.no_grad():
    reference.vit.embeddings.position_embeddings.copy_(_maes_table(reference.config, 32))
    reference.decoder.decoder_pos_embed.copy_(_maes_table(reference.config, 16))
  model, params = _ours(reference, tmp_path)
  model = model.clone(posemb='sincos2d_mae', decoder_posemb='sincos2d_mae')
  for part in (params, params['decoder']):
    del part['Transformer']['posembed_input']
  images, noise = _inputs()
  loss, _ = _loss(model, params, images, noise, True)
  expected = reference(
      pixel_values=torch.tensor(images.transpose(0, 3, 1, 2)), noise=torch.tensor(noise)
  ).loss.item()
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  big_vision = model.clone(posemb='sincos2d', decoder_posemb='sincos2d')
  assert abs(_loss(big_vision, params, images, noise, True)[0] - expected) > 1e-3


def test_the_task_loss_is_the_reference_loss_of_its_drawn_noise(tmp_path):
  """make_loss draws the noise from the step's key (after dropout's split) and otherwise is the loss
  the reference computes for that noise."""
  reference = _reference(True, 0.75)
  model, params = _ours(reference, tmp_path)
  images, _ = _inputs()
  config = ml_collections.ConfigDict(
      {'mae': {'norm_pix_loss': True, 'target_mean': None, 'target_std': None}}
  )
  key = jax.random.key(3)
  loss = mae.make_loss(config, model)(params, images, None, key)
  noise = jax.random.uniform(jax.random.split(key)[1], (3, 16))
  expected = reference(
      pixel_values=torch.tensor(images.transpose(0, 3, 1, 2)), noise=torch.tensor(np.asarray(noise))
  ).loss.item()
  np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_the_export_of_an_mae_run_is_its_encoder_as_timm_reads_it(tmp_path, data_dir):
  """Exported, a masked autoencoder is its encoder (as the hub's MAE weights are): the jax.export and
  timm's model built from timm/ (num_classes 0) both give the backbone's pooled features."""
  config = helpers.load_config(
      'mae_demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 2, 'mae.mask_ratio': 0.5}
  )
  workdir = str(tmp_path / 'mae')
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  out = tmp_path / 'export'
  description = export.export(workdir, str(out))
  assert (description['task'], description['num_classes'], description['class_names']) == (
      'mae',
      0,
      [],
  )
  assert description['output'].startswith('float32 features [batch, 32]')
  trained = run_dir.load_trained(workdir, features=True)
  images = np.random.default_rng(1).uniform(-1, 1, (3, 8, 8, 3)).astype(np.float32)
  expected = trained.model.apply({'params': trained.params}, images)
  _, infer = run_dir.load_export(str(out))
  np.testing.assert_allclose(infer(images), expected, rtol=1e-5, atol=1e-5)
  reference = timm.create_model(f'local-dir:{out / "timm"}', pretrained=True).eval()
  with torch.no_grad():  # timm's mean = std = 0.5: our [-1, 1] images are its normalised input.
    theirs = reference(torch.tensor(images.transpose(0, 3, 1, 2))).numpy()
  np.testing.assert_allclose(theirs, expected, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="is the export of a 'mae' run's encoder, which has no"):
    classifiers.load_export(str(out))


def _mae_continue(data_dir: str, init_from, decoder_layers: int, **overrides):
  """configs/mae_continue.py from `init_from` on the digits, one step, with a tiny decoder."""
  return helpers.load_config(
      'mae_continue',
      {
          **{k: v for k, v in helpers.TINY.items() if not k.startswith(('model.', 'variant'))},
          'data_dir': data_dir,
          'dataset': 'digits',
          'train_split': 'train',
          'eval_split': 'test',
          'init_from': str(init_from),
          'image_size': IMAGE,
          'num_epochs': None,
          'total_steps': 1,
          'lr.warmup_steps': 0,
          'dtype': 'float32',
          'mae.decoder_hidden_size': 16,
          'mae.decoder_num_layers': decoder_layers,
          'mae.decoder_num_heads': DECODER_HEADS,
          'mae.decoder_mlp_dim': 24,
          **overrides,
      },
  )


def test_configs_mae_continue_resumes_the_pretraining_of_a_transformers_mae(tmp_path, data_dir):
  """configs/mae_continue.py from a saved ViTMAEForPreTraining (the hub's layout): the encoder, the
  pixel decoder and the configured fields read from the files give the reference's loss for the same
  noise; a step keeps the position embeddings (MAE's fixed ones) as they were."""
  reference = _reference(True, 0.75)
  reference.save_pretrained(tmp_path / 'hub')
  config = _mae_continue(data_dir, tmp_path / 'hub', decoder_layers=2)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  images, noise = _inputs()
  loss, _ = _loss(setup.model, setup.init_params, images, noise, True)
  expected = reference(
      pixel_values=torch.tensor(images.transpose(0, 3, 1, 2)), noise=torch.tensor(noise)
  ).loss.item()
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  loop.train_and_evaluate(setup)
  trained, _ = run_dir.load_params(str(tmp_path / 'run'))
  for part in (trained, trained['decoder']):
    np.testing.assert_array_equal(
        part['Transformer']['posembed_input']['pos_embedding'],
        (setup.init_params if part is trained else setup.init_params['decoder'])['Transformer'][
            'posembed_input'
        ]['pos_embedding'],
    )
  assert not np.array_equal(
      trained['decoder']['pred']['kernel'], setup.init_params['decoder']['pred']['kernel']
  )


@pytest.mark.parametrize('norm_pix_loss', [False, True])  # facebook/vit-mae-*'s config.json: False.
def test_mae_continue_predicts_the_pixels_a_hub_maes_decoder_was_trained_on(
    tmp_path, data_dir, norm_pix_loss, caplog
):
  """A hub snapshot with ImageNet's mean and std (its preprocessor_config.json): the encoder reads
  vit_jax's images (folded), and the targets are the pixels normalised as transformers normalises
  them, which its decoder predicts: the reference's loss on the same pixels and noise. A run's
  norm_pix_loss other than the checkpoint's is one line."""
  mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
  reference = _reference(norm_pix_loss, 0.75)
  reference.save_pretrained(tmp_path / 'hub')
  (tmp_path / 'hub' / 'preprocessor_config.json').write_text(
      json.dumps({'image_mean': mean.tolist(), 'image_std': std.tolist()})
  )
  other = _mae_continue(data_dir, tmp_path / 'hub', 2, **{'mae.norm_pix_loss': not norm_pix_loss})
  with pytest.raises(ValueError, match=f'set --config.mae.norm_pix_loss={norm_pix_loss} to ') as e:
    train_setup.prepare(other, str(tmp_path / 'other'))
  assert '\n' not in str(e.value)
  config = _mae_continue(data_dir, tmp_path / 'hub', 2, **{'mae.norm_pix_loss': norm_pix_loss})
  with caplog.at_level('INFO'):
    setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert 'MAE targets: the pixels normalised as' in caplog.text
  images, noise = _inputs()
  pixels, hidden = setup.model.apply({'params': setup.init_params}, images, noise=noise)
  errors = mae.patch_errors(
      setup.model, pixels, images, norm_pix_loss, mae.normalization(setup.config)
  )
  normalised = ((images + 1) / 2 - mean) / std
  expected = reference(
      pixel_values=torch.tensor(normalised.transpose(0, 3, 1, 2), dtype=torch.float32),
      noise=torch.tensor(noise),
  )
  np.testing.assert_allclose(
      jnp.sum(errors * hidden) / jnp.sum(hidden), expected.loss.item(), rtol=1e-5
  )
  np.testing.assert_allclose(pixels, expected.logits.detach().numpy(), atol=1e-4)
  # The reconstruction is of vit_jax's images: a patch the decoder did not hide is the image's own.
  drawn, hidden = mae.reconstruction(
      setup.model, setup.init_params, images, norm_pix_loss, mae.normalization(setup.config)
  )
  visible = np.repeat(np.repeat(np.asarray(hidden).reshape(3, 4, 4) == 0, PATCH, 1), PATCH, 2)
  np.testing.assert_allclose(np.asarray(drawn)[visible], images[visible], atol=1e-5)


def test_configs_mae_continue_from_timms_encoder_alone_draws_the_decoder(
    tmp_path, data_dir, caplog
):
  """timm's MAE weights (vit_*_patch16_224.mae) are the encoder alone: configs/mae_continue.py reads
  it (variant='checkpoint') and starts the decoder as a run from scratch draws it, its position
  embeddings fixed sin-cos ones; the encoder's, a tensor of the file, stays as it was."""
  tiny = dict(img_size=IMAGE, patch_size=PATCH, embed_dim=32, depth=2, num_heads=HEADS)
  reference = timm.create_model('vit_base_patch16_224.mae', num_classes=0, **tiny).eval()
  timm.models.save_for_hf(reference, tmp_path / 'timm', safe_serialization=True)
  timm_config = json.loads((tmp_path / 'timm' / 'config.json').read_text())
  timm_config['model_args'] = {'num_heads': HEADS}  # What the tensors cannot show, as the hub's.
  (tmp_path / 'timm' / 'config.json').write_text(json.dumps(timm_config))
  config = _mae_continue(
      data_dir, tmp_path / 'timm', decoder_layers=1, **{'mae.decoder_posemb': 'sincos2d_mae'}
  )
  with caplog.at_level('INFO'):
    setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert 'drew decoder as a run from scratch draws them: the checkpoint has none' in caplog.text
  np.testing.assert_array_equal(
      setup.init_params['Transformer']['encoderblock_1']['MlpBlock_3']['Dense_0']['kernel'],
      reference.blocks[1].mlp.fc1.weight.detach().numpy().T,
  )
  assert 'posembed_input' not in setup.init_params['decoder']['Transformer']  # Fixed sin-cos.
  loop.train_and_evaluate(setup)
  trained, _ = run_dir.load_params(str(tmp_path / 'run'))
  posemb = lambda params: params['Transformer']['posembed_input']['pos_embedding']
  np.testing.assert_array_equal(posemb(trained), posemb(setup.init_params))
  assert not np.array_equal(
      trained['decoder']['pred']['kernel'], setup.init_params['decoder']['pred']['kernel']
  )


@pytest.mark.parametrize(
    'field,value', [('decoder_num_layers', 3), ('decoder_num_heads', 4), ('decoder_mlp_dim', 32)]
)
def test_a_decoder_of_another_shape_than_the_checkpoints_is_a_one_line_error(
    field, value, tmp_path, data_dir
):
  _reference(True, 0.75).save_pretrained(tmp_path / 'hub')
  config = helpers.load_config(
      'mae_continue',
      {
          'data_dir': data_dir,
          'dataset': 'digits',
          'eval_split': 'test',
          'init_from': str(tmp_path / 'hub'),
          'image_size': IMAGE,
          'batch_size': 8,
          'eval_batch_size': 8,
          'mae.decoder_hidden_size': 16,
          'mae.decoder_num_layers': 2,
          'mae.decoder_num_heads': DECODER_HEADS,
          'mae.decoder_mlp_dim': 24,
          f'mae.{field}': value,
      },
  )
  with pytest.raises(ValueError, match=rf'MAE decoder has {field}=.*: set --config\.mae\.{field}='):
    train_setup.prepare(config, str(tmp_path / 'run'))
