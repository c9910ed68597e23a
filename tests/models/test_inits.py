"""model.weight_init: 'original' keeps the modules' own draws; 'timm' draws as timm's VisionTransformer.

The reference for 'timm' is timm itself: a model of the same shape built by timm (its own init), mapped
into our layout by timm_layout.from_state_dict, compared parameter by parameter in distribution (standard
deviation, bounds, zeros), since two random draws are never equal.
"""

import jax
import numpy as np
import optax
import pytest
from flax import traverse_util

import helpers
from vit_jax.train import optim
from vit_jax.models import variants
from vit_jax.tasks import classification
from vit_jax.train import state as train_state

# The demo model's shape, wide enough (and with enough blocks) for the statistics to settle.
SHAPE = {
    'variant': 'ViT-Ti_4',
    'model.hidden_size': 64,
    'model.num_layers': 4,
    'model.num_heads': 4,
    'model.mlp_dim': 128,
    'image_size': 16,
}


def _fresh_params(**overrides) -> dict:
  """The parameters a new run starts from (train_state.init_state, as the loop builds it)."""
  config = helpers.load_config('demo', {**SHAPE, **overrides})
  model = classification.make_model(config, helpers.model_config(config), 10)
  state = train_state.init_state(
      jax.random.key(0),
      model=model,
      tx=optim.make_optimizer(config, 10, helpers.model_config(config))[0],
      image_size=config.image_size,
      polyak=False,
  )
  return traverse_util.flatten_dict(jax.device_get(state.params), sep='/')


def test_original_scheme_is_what_the_modules_draw():
  ours, timm_like = _fresh_params(), _fresh_params(**{'model.weight_init': 'timm'})
  config = helpers.load_config('demo', SHAPE)
  model = classification.make_model(config, helpers.model_config(config), 10)
  drawn = traverse_util.flatten_dict(
      jax.device_get(
          model.init(
              {'params': jax.random.key(0), 'mpp': jax.random.key(0)}, np.zeros((1, 16, 16, 3))
          )['params']
      ),
      sep='/',
  )
  for path, value in drawn.items():
    np.testing.assert_array_equal(ours[path], value, err_msg=path)
  assert not ours['head/kernel'].any() and not ours['cls'].any()  # The paper's zero head.
  d = 64  # Xavier-uniform on [64, 4, 16]: std sqrt(2 / (64 + 64)).
  assert np.std(
      ours['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel']
  ) == pytest.approx(np.sqrt(2 / (d + d)), rel=0.1)
  assert np.std(
      timm_like['Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel']
  ) == pytest.approx(0.02, rel=0.1)


def test_position_embeddings_and_norms_are_left_as_drawn():
  ours, timm_like = _fresh_params(), _fresh_params(**{'model.weight_init': 'timm'})
  for path in (
      'Transformer/posembed_input/pos_embedding',
      'Transformer/encoder_norm/scale',
      'Transformer/encoderblock_3/LayerNorm_2/bias',
  ):
    np.testing.assert_array_equal(ours[path], timm_like[path], err_msg=path)


@pytest.mark.parametrize('weight_init', ['original', 'timm'])
def test_head_bias_init_starts_a_sigmoid_loss_near_the_rarity_of_each_class(weight_init):
  params = _fresh_params(**{'model.weight_init': weight_init, 'model.head_bias_init': -10.0})
  np.testing.assert_array_equal(params['head/bias'], np.full(10, -10.0, np.float32))
  if weight_init == 'timm':  # Its head's kernel is random: the logits are not the bias alone.
    return
  config = helpers.load_config(
      'demo', {**SHAPE, 'model.head_bias_init': -10.0, 'loss': 'sigmoid_xent'}
  )
  model = classification.make_model(config, helpers.model_config(config), 10)
  logits = model.apply(
      {'params': traverse_util.unflatten_dict(params, sep='/')}, np.ones((2, 16, 16, 3))
  )
  targets = np.eye(10, dtype=np.float32)[[3, 7]]
  # Ten classes: -log(sigmoid(-10)) for the one positive, -log(1 - sigmoid(-10)) for nine negatives.
  per_class = targets * np.logaddexp(0, 10) + (1 - targets) * np.logaddexp(0, -10)
  np.testing.assert_allclose(
      optax.sigmoid_binary_cross_entropy(logits, targets).sum(-1), per_class.sum(-1), rtol=1e-5
  )


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'model.head_bias_init': float('nan')},
            r'^model.head_bias_init=nan must be a finite number, e.g. -10.0$',
        ),
        (
            {'model.weight_init': 'xavier'},
            "Unknown model.weight_init 'xavier': use one of original, timm",
        ),
        (
            {'variant': 'R50+ViT-Ti_16', 'model.weight_init': 'timm'},
            "hybrid's ResNet stem has no such scheme: set --config.model.weight_init=original",
        ),
    ],
)
def test_bad_weight_init_is_one_line(overrides, message):
  config = helpers.load_config('demo', {**SHAPE, **overrides})
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config(config.variant, config.model.to_dict())
  assert '\n' not in str(error.value)
