"""The R50+ViT hybrid: the original checkpoint layout (timm's logits through it), the stride of the
ResNet stem, training."""

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.train import loop, setup as train_setup
from vit_jax.checkpoints import adapting, npz_files
from vit_jax.models import VisionTransformer, variants


def _original_hybrid_layout(num_classes):
  """Names and shapes of the published R50+ViT-B_16.npz, written out independently of our model."""
  layout = {'conv_root/kernel': (7, 7, 3, 64), 'gn_root/scale': (64,), 'gn_root/bias': (64,)}
  cin = 64
  for block, (units, width) in enumerate(zip((3, 4, 9), (64, 128, 256)), 1):
    for unit in range(1, units + 1):
      p = f'block{block}/unit{unit}/'
      layout.update(
          {
              p + 'conv1/kernel': (1, 1, cin, width),
              p + 'conv2/kernel': (3, 3, width, width),
              p + 'conv3/kernel': (1, 1, width, 4 * width),
          }
      )
      for gn, size in (('gn1', width), ('gn2', width), ('gn3', 4 * width)):
        layout.update({p + f'{gn}/scale': (size,), p + f'{gn}/bias': (size,)})
      if unit == 1:
        layout.update(
            {
                p + 'conv_proj/kernel': (1, 1, cin, 4 * width),
                p + 'gn_proj/scale': (4 * width,),
                p + 'gn_proj/bias': (4 * width,),
            }
        )
      cin = 4 * width
  layout.update(
      {
          'embedding/kernel': (1, 1, 1024, 768),
          'embedding/bias': (768,),
          'cls': (1, 1, 768),
          'Transformer/posembed_input/pos_embedding': (1, 197, 768),
          'Transformer/encoder_norm/scale': (768,),
          'Transformer/encoder_norm/bias': (768,),
          'head/kernel': (768, num_classes),
          'head/bias': (num_classes,),
      }
  )
  return layout


@pytest.mark.slow  # A real-size R50+ViT-B/16 compiled and run at 224 px: make test-all's.
def test_hybrid_loads_a_checkpoint_in_the_original_layout(tmp_path):
  model = VisionTransformer(num_classes=5, **variants.get_model_config('R50+ViT-B_16'))
  shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 224, 224, 3)))['params']
  rng = np.random.default_rng(0)
  flat = {}
  for key, value in traverse_util.flatten_dict(shapes, sep='/').items():
    if not key.startswith('Transformer/encoderblock_'):
      assert _original_hybrid_layout(5)[key] == value.shape, key
    flat[key] = rng.normal(0, 0.02, value.shape).astype(np.float32)
  assert set(_original_hybrid_layout(5)) <= set(flat)
  np.savez(tmp_path / 'R50+ViT-B_16.npz', **flat)
  params, notes = adapting.adapt_params(
      npz_files.load_npz(str(tmp_path / 'R50+ViT-B_16.npz')),
      shapes,
      keep_head=True,
      keep_pre_logits=False,
  )
  assert not notes
  logits = jax.jit(lambda p, x: model.apply({'params': p}, x))(params, jnp.ones((1, 224, 224, 3)))
  assert logits.shape == (1, 5) and np.all(np.isfinite(logits))


def test_hybrid_parameter_count_is_printed_beside_the_paper_variants():
  out = subprocess.run(
      [sys.executable, 'benchmarks/param_counts.py'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      check=True,
      timeout=300,
  ).stdout
  assert '| ViT-B_16 | 86.6M |' in out
  assert '| R50+ViT-B_16 | ' in out


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_tiny_hybrid_trains_on_the_digits(tmp_path):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': str(tmp_path / 'tfds'),
          'variant': 'R50+ViT-testing_8',
          'model.resnet_layers': (1, 1),
          'model.resnet_width_factor': 0.5,
          'image_size': 16,
          'total_steps': 3,
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_loss'])
  params, _ = run_dir.load_params(str(tmp_path / 'run'))
  assert params['conv_root']['kernel'].shape == (7, 7, 3, 32)
  assert params['block2']['unit1']['conv_proj']['kernel'].shape == (1, 1, 128, 256)
  assert params['embedding']['kernel'].shape == (1, 1, 256, 32)  # The 8x stem leaves patch size 1.


def test_hybrid_image_size_must_fit_the_stem_stride(tmp_path):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': str(tmp_path / 'tfds'),
          'variant': 'R50+ViT-testing_16',
          'image_size': 24,
      },
  )
  with pytest.raises(ValueError, match=r'image_size=24 is not divisible by .* 16'):
    train_setup.prepare(config, str(tmp_path / 'run'))


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_fsdp_x_tensor_splits_the_stem_units_and_trains_as_one_device(tmp_path, data_dir):
  """resnet.TENSOR_RULES split the stem's units (conv1 out, conv2 in) beside the blocks' heads."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'variant': 'R50+ViT-testing_8',
          'model.resnet_layers': (1, 1),
          'model.resnet_width_factor': 0.5,
          'image_size': 16,
          'optim.name': 'sgd',
          'optim.weight_decay': 0.0,
          'lr.base': 0.1,
          'mesh': (('fsdp', 4), ('tensor', 2)),
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'mesh'))
  _, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'))
  unit = state.params['block2']['unit1']
  assert (unit['conv1']['kernel'].sharding.spec[3], unit['conv2']['kernel'].sharding.spec[2]) == (
      'tensor',
      'tensor',
  )
