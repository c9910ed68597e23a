"""Axial-ViT (models/axial.py): against a NumPy transcription of row then column attention, in the loop,
on a mesh, resumed; and the options it refuses."""

import math
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax.tools import export, pictures
from vit_jax.models import VisionTransformer, axial, variants
from vit_jax.train import loop, setup as train_setup


def _layer_norm(x, p):
  mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-6) * p['scale'] + p['bias']


def _block(x, p):
  """The ViT's pre-LN block on sequences x [n, tokens, D], in NumPy."""
  attention = p['MultiHeadDotProductAttention_1']
  y = _layer_norm(x, p['LayerNorm_0'])
  q, k, v = (
      np.einsum('ntd,dhk->nthk', y, attention[name]['kernel']) + attention[name]['bias']
      for name in ('query', 'key', 'value')
  )
  logits = np.einsum('nqhk,nthk->nhqt', q, k) / math.sqrt(q.shape[-1])
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  heads = np.einsum('nhqt,nthk->nqhk', weights, v)
  x = x + np.einsum('nqhk,hkd->nqd', heads, attention['out']['kernel']) + attention['out']['bias']
  mlp = p['MlpBlock_3']
  y = _layer_norm(x, p['LayerNorm_2']) @ mlp['Dense_0']['kernel'] + mlp['Dense_0']['bias']
  y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))  # GELU, tanh form.
  return x + y @ mlp['Dense_1']['kernel'] + mlp['Dense_1']['bias']


def test_an_axial_block_is_row_attention_then_column_attention():
  h, w, d = 3, 5, 32  # Not square: rows and columns cannot be mistaken for each other.
  block = axial.AxialBlock(mlp_dim=48, num_heads=4, grid=(h, w))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, h * w, d)).astype(np.float32)
  shapes = jax.eval_shape(lambda: block.init(jax.random.key(0), x, True))['params']
  params = jax.tree.map(lambda s: 0.3 * rng.normal(size=s.shape).astype(np.float32), shapes)
  got = np.asarray(block.apply({'params': params}, x, True))

  grid = x.reshape(2, h, w, d)
  rows = _block(grid.reshape(2 * h, w, d), params['row']).reshape(2, h, w, d)
  columns = _block(rows.transpose(0, 2, 1, 3).reshape(2 * w, h, d), params['column'])
  expected = columns.reshape(2, w, h, d).transpose(0, 2, 1, 3).reshape(2, h * w, d)
  np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
  # And not the same as attending over all patches at once.
  assert not np.allclose(got, _block(_block(x, params['row']), params['column']), atol=1e-2)


def test_variants_and_what_they_refuse():
  model = variants.get_model_config('Axial-ViT-B_16')
  assert (model['block'], model['classifier'], model['num_layers'], model['hidden_size']) == (
      'axial',
      'gap',
      12,
      768,
  )
  params = jax.eval_shape(
      VisionTransformer(num_classes=10, **variants.get_model_config('Axial-ViT-testing_4')).init,
      jax.random.key(0),
      jnp.zeros((1, 12, 12, 3)),
  )['params']
  assert set(params['Transformer']['encoderblock_0']) == {'row', 'column'} and 'cls' not in params
  for field, value, fix in [
      ('classifier', 'token', 'gap'),
      ('scan', True, 'False'),
      ('drop_path_rate', 0.1, '0'),
      ('posemb', 'relative', 'learn'),
      ('posemb_where', 'every_layer', 'input'),
  ]:
    with pytest.raises(
        ValueError,
        match=rf'^Axial-ViT does not take model.{field}=.*: set ' rf'--config.model.{field}={fix}',
    ):
      variants.get_model_config('Axial-ViT-B_16', {field: value})
  with pytest.raises(ValueError, match=r'Axial-ViT-<size>_<patch>'):
    variants.get_model_config('Axial-R50+ViT-B_16')


_TRAIN = {
    **helpers.TINY,
    'variant': 'Axial-ViT-testing_4',
    'image_size': 12,
    'optim.name': 'sgd',
    'optim.weight_decay': 0.0,
    'lr.base': 0.1,
}


@pytest.mark.slow  # Trainings on a mesh and one device, and a resume: make test-all's.
@pytest.mark.devices(8)
def test_fsdp_x_tensor_training_has_the_losses_of_one_device(tmp_path, data_dir):
  overrides = {**_TRAIN, 'data_dir': data_dir, 'mesh': (('fsdp', 4), ('tensor', 2))}
  setup = train_setup.prepare(helpers.load_config('demo', overrides), str(tmp_path / 'mesh'))
  _, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'))
  query = state.params['Transformer']['encoderblock_0']['column']['MultiHeadDotProductAttention_1']
  assert 'tensor' in query['query']['kernel'].sharding.spec  # Heads split as in a standard block.


@pytest.mark.slow
@pytest.mark.devices(8)
def test_a_tiny_axial_vit_learns_the_digits_and_resumes_bit_exactly(tmp_path, data_dir):
  overrides = {
      **_TRAIN,
      'data_dir': data_dir,
      'total_steps': 150,
      'batch_size': 64,
      'log_every_steps': 50,
      'eval_every_steps': 150,
      'checkpoint_every_steps': 100,
      'lr.base': 3e-3,
      'optim.name': 'adamw',
      'lr.warmup_steps': 10,
      'mesh': (('fsdp', 4), ('tensor', 2)),
  }
  full = str(tmp_path / 'full')
  loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), full))
  scalars = helpers.read_scalars(full)
  assert scalars['eval_top1'][150] > 0.6, scalars  # 10 classes: chance is 0.1.
  # Export writes the .npz and the jax.export program (and says why timm gets nothing); the
  # attention pictures, drawn over all patches, are refused in one line.
  description = export.export(full, str(tmp_path / 'exported'))
  assert (
      description['timm'] == "not written: timm's VisionTransformer has no axial blocks (Axial-ViT)"
  )
  assert sorted(os.listdir(tmp_path / 'exported')) == [
      'config.json',
      'model.jaxexport',
      'model.npz',
  ]
  image = np.zeros((12, 12, 3), np.uint8)
  Image.fromarray(image).save(tmp_path / 'image.png')
  with pytest.raises(
      ValueError,
      match=r'^the pictures show attention over all patches; an '
      r'Axial-ViT-testing_4 attends along rows and columns only$',
  ):
    pictures.draw_run(full, str(tmp_path / 'image.png'), str(tmp_path / 'pictures'))
  helpers.assert_resume_is_bit_exact(
      helpers.load_config('demo', overrides), full, str(tmp_path / 'resumed')
  )


@pytest.mark.slow  # Gradients of two axial models: make test-all's.
def test_remat_recomputes_the_same_axial_blocks():
  images = np.random.default_rng(0).uniform(-1, 1, (2, 12, 12, 3)).astype(np.float32)
  labels = jnp.arange(2)

  def loss_and_grads(remat):
    model = VisionTransformer(
        num_classes=10, **variants.get_model_config('Axial-ViT-testing_4', {'remat': remat})
    )
    params = helpers.random_params(model, 12)
    loss = lambda p: -jnp.mean(
        jax.nn.log_softmax(model.apply({'params': p}, images))[jnp.arange(2), labels]
    )
    program = str(jax.make_jaxpr(jax.grad(loss))(params))
    return jax.value_and_grad(loss)(params), program.count('dot_general[')

  (plain, matmuls), (rematerialised, recomputed) = loss_and_grads(None), loss_and_grads(
      'nothing_saveable'
  )
  chex.assert_trees_all_close(plain, rematerialised, rtol=1e-5, atol=1e-6)
  # The backward pass recomputes both halves' forward matmuls of every block.
  assert recomputed > matmuls, (recomputed, matmuls)
