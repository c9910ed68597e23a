"""model.weight_init: 'original' keeps the modules' own draws; 'timm' draws as timm's VisionTransformer.

The reference for 'timm' is timm itself: a model of the same shape built by timm (its own init), mapped
into our layout by state_dicts.from_timm, compared parameter by parameter in distribution (standard
deviation, bounds, zeros), since two random draws are never equal.
"""
import jax
import numpy as np
import pytest
import timm.models.vision_transformer as timm_vit
import torch
from flax import traverse_util

import helpers
from vit_jax.train import optim
from vit_jax.checkpoints import state_dicts
from vit_jax.models import variants
from vit_jax.tasks import classification
from vit_jax.train import state as train_state

# The demo model's shape, wide enough (and with enough blocks) for the statistics to settle.
SHAPE = {'variant': 'ViT-Ti_4', 'model.hidden_size': 64, 'model.num_layers': 4, 'model.num_heads': 4,
         'model.mlp_dim': 128, 'image_size': 16}


def _fresh_params(**overrides) -> dict:
  """The parameters a new run starts from (train_state.init_state, as the loop builds it)."""
  config = helpers.load_config('demo', {**SHAPE, **overrides})
  model = classification.make_model(config, 10)
  state = train_state.init_state(jax.random.key(0), model=model, tx=optim.make_optimizer(config, 10)[0],
                                 image_size=config.image_size, polyak=False)
  return traverse_util.flatten_dict(jax.device_get(state.params), sep='/')


def _timm_params() -> dict:
  torch.manual_seed(0)
  reference = timm_vit.VisionTransformer(img_size=16, patch_size=4, embed_dim=64, depth=4, num_heads=4,
                                         mlp_ratio=2.0, num_classes=10)
  tree = state_dicts.from_timm({k: v.numpy() for k, v in reference.state_dict().items()}, num_heads=4)
  return traverse_util.flatten_dict(tree, sep='/')


def test_timm_scheme_draws_each_parameter_as_timm_does():
  ours, theirs = _fresh_params(**{'model.weight_init': 'timm'}), _timm_params()
  assert ours.keys() == theirs.keys()
  for path, value in ours.items():
    reference = theirs[path]
    assert value.shape == reference.shape, path
    if not reference.any():  # Biases and LayerNorm offsets.
      assert not value.any(), path
      continue
    # Same spread (two sample stds of n values differ by ~1/sqrt(n) relative: 4 of those), same bounds.
    assert np.std(value) == pytest.approx(np.std(reference), rel=4 / np.sqrt(value.size)), path
    assert np.abs(value).max() <= np.abs(reference).max() * 1.3 + 1e-12, path
  assert np.std(ours['head/kernel']) == pytest.approx(0.02, rel=0.15)  # Not zero: random as timm's.
  bound = 1 / np.sqrt(4 * 4 * 3)  # PyTorch's Conv2d default: U(+-1/sqrt(fan_in)), bias too.
  for name in ('embedding/kernel', 'embedding/bias'):
    assert np.abs(ours[name]).max() <= bound and np.abs(ours[name]).max() > 0.8 * bound, name


def test_original_scheme_is_what_the_modules_draw():
  ours, timm_like = _fresh_params(), _fresh_params(**{'model.weight_init': 'timm'})
  model = classification.make_model(helpers.load_config('demo', SHAPE), 10)
  drawn = traverse_util.flatten_dict(jax.device_get(model.init(
      {'params': jax.random.key(0), 'mpp': jax.random.key(0)}, np.zeros((1, 16, 16, 3)))['params']), sep='/')
  for path, value in drawn.items():
    np.testing.assert_array_equal(ours[path], value, err_msg=path)
  assert not ours['head/kernel'].any() and not ours['cls'].any()  # The paper's zero head.
  d = 64  # Xavier-uniform on [64, 4, 16]: std sqrt(2 / (64 + 64)).
  assert np.std(ours['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel']) == \
      pytest.approx(np.sqrt(2 / (d + d)), rel=0.1)
  assert np.std(timm_like['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel']) == \
      pytest.approx(0.02, rel=0.1)


def test_position_embeddings_and_norms_are_left_as_drawn():
  ours, timm_like = _fresh_params(), _fresh_params(**{'model.weight_init': 'timm'})
  for path in ('Transformer/posembed_input/pos_embedding', 'Transformer/encoder_norm/scale',
               'Transformer/encoderblock_3/LayerNorm_2/bias'):
    np.testing.assert_array_equal(ours[path], timm_like[path], err_msg=path)


@pytest.mark.parametrize('overrides,message', [
    ({'model.weight_init': 'xavier'}, "Unknown model.weight_init 'xavier': use one of original, timm"),
    ({'variant': 'R50+ViT-Ti_16', 'model.weight_init': 'timm'},
     "hybrid's ResNet stem has no such scheme: set --config.model.weight_init=original"),
])
def test_bad_weight_init_is_one_line(overrides, message):
  config = helpers.load_config('demo', {**SHAPE, **overrides})
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config(config.variant, config.model.to_dict())
  assert '\n' not in str(error.value)

