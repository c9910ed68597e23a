"""BiT ResNet-v2 baselines: timm's logits through the published .npz layout both ways, the variants and
their parameter counts, the analytic FLOPs against XLA's, training on any mesh, resume, the tools.

The reference is timm's `resnetv2_*_bit` (PyTorch); the .npz layout is written here from its state dict
by inverting timm's `_load_weights`, independently of vit_jax's converter.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.planning import chips, meshes
from vit_jax.tools import fewshot, pictures, scaling
from vit_jax.models import bit, variants
from vit_jax.train import loop, setup as train_setup

# The demo config's ViT fields, unset for a BiT.
_NO_VIT = {
    f'model.{name}': None
    for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim', 'head_dropout_rate')
}


# The variants.


@pytest.mark.parametrize(
    'variant,overrides,message',
    [
        (
            'BiT-R34x1',
            {},
            r"^Unknown BiT variant 'BiT-R34x1': use BiT-R<depth>x<width> with depth in 50, "
            r'101, 152 and width in 1..4 \(e.g. BiT-R50x1',
        ),
        ('BiT-R50x5', {}, r"^Unknown BiT variant 'BiT-R50x5'"),
        (
            'ResNet-50',
            {},
            r"^Unknown model variant 'ResNet-50': use one of ViT, BiT, e.g. .*BiT-R50x1",
        ),
        (
            'BiT-R50x1',
            {'num_heads': 4},
            r'^model.num_heads does not apply to BiT-R50x1, a ResNet \(it takes '
            r'model.resnet_layers and model.resnet_width_factor\): unset',
        ),
        (
            'BiT-R50x1',
            {'resnet_width_factor': 0.25},
            r"^model.resnet_width_factor=0.25 gives 16 root channels, not a positive multiple of GroupNorm's 32",
        ),
        (
            'BiT-R50x1',
            {'resnet_layers': (3, 0)},
            r'^model.resnet_layers=\(3, 0\) must be positive numbers',
        ),
    ],
)
def test_bad_variants_are_one_line_errors(variant, overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    variants.get_model_config(variant, overrides)
  assert '\n' not in str(error.value)


def test_analytic_flops_are_xlas_count_of_the_convolutions():
  """XLA's FLOPs per image (batch 2 less batch 1: the weight standardisation, per parameter, cancels)
  are the analytic ones plus GroupNorm, ReLU and pooling, which those leave out."""
  config = {'resnet_layers': (2, 1, 1, 1), 'resnet_width_factor': 0.5}
  model = bit.BiT(num_classes=10, **config)
  size = 40  # 20, 10, 5, 3, 2 px: odd sizes, and the padding's taps, which neither counts.
  params = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))

  def xla_flops(batch):
    cost = (
        jax.jit(model.apply)
        .lower(params, jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32))
        .compile()
        .cost_analysis()
    )
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)['flops']

  analytic = chips.bit_flops(config, size, num_classes=10)
  assert analytic <= xla_flops(2) - xla_flops(1) <= 1.03 * analytic
  # The ViT paper's R50 at 224 px: 4.1 GMACs with whole windows; ours leaves the padding's out.
  assert chips.bit_flops(variants.get_model_config('BiT-R50x1'), 224) == pytest.approx(
      7.89e9, rel=1e-3
  )


# Training and the tools, on a tiny BiT.

TINY_BIT = {
    **helpers.TINY,
    **_NO_VIT,
    'variant': 'BiT-R50x1',
    'model.resnet_layers': (1, 1, 1, 1),
    'model.resnet_width_factor': 0.5,
    'image_size': 16,
}


def _tiny_config(data_dir, **overrides):
  return helpers.load_config('demo', {**TINY_BIT, 'data_dir': data_dir, **overrides})


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory, data_dir):
  """A tiny BiT trained 12 steps on the digits under fsdp x tensor, with few-shot evaluation: its
  workdir, config and final metrics."""
  workdir = str(tmp_path_factory.mktemp('bit_runs') / 'tiny_bit')
  config = _tiny_config(
      data_dir,
      mesh=(('fsdp', 4), ('tensor', 2)),
      **{'fewshot.every_steps': 12, 'fewshot.shots': (1, 5), 'fewshot.seeds': 1},
  )
  return workdir, config, loop.train_and_evaluate(train_setup.prepare(config, workdir))


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_a_tiny_bit_trains_and_evaluates_in_the_loop(tiny_run):
  workdir, _, metrics = tiny_run
  assert np.isfinite(metrics['eval_loss'])
  assert 0 <= metrics['fewshot_5shot'] <= 1  # The features model: the pooled pre-head features.
  params, _ = run_dir.load_params(workdir)
  assert params['conv_root']['kernel'].shape == (7, 7, 3, 32)
  assert params['block4']['unit1']['conv_proj']['kernel'].shape == (1, 1, 512, 1024)
  assert params['head']['kernel'].shape == (1024, 10)
  accuracies, used = fewshot.evaluate_checkpoint(workdir, shots=(1,), seeds=1)
  assert used['step'] == 12 and 0 <= accuracies[1] <= 1


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_resume_is_bit_exact(tiny_run, tmp_path):
  full, config, _ = tiny_run
  helpers.assert_resume_is_bit_exact(config, full, str(tmp_path / 'resumed'))


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_scaling_plots_a_bit_run_with_its_flops(tiny_run):
  workdir, _, _ = tiny_run
  (point,) = scaling.points([os.path.dirname(workdir)], 'eval_top1')
  model = variants.get_model_config(
      'BiT-R50x1', {'resnet_layers': (1, 1, 1, 1), 'resnet_width_factor': 0.5}
  )
  assert (point.family, point.shape) == ('BiT', 'R14x0.5')
  assert point.exaflops == pytest.approx(
      3 * chips.bit_flops(model, 16, 10) * 12 * 16 / 1e18, rel=1e-12
  )


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_fsdp_x_tensor_training_has_the_losses_of_one_device(tmp_path, data_dir):
  # SGD: Adam's first steps are about lr * sign(grad), which would turn float noise in near-zero
  # gradients into differences of 2 * lr.
  config = _tiny_config(
      data_dir,
      mesh=(('fsdp', 4), ('tensor', 2)),
      **{'optim.name': 'sgd', 'optim.weight_decay': 0.0, 'lr.base': 0.1},
  )
  setup = train_setup.prepare(config, str(tmp_path / 'fsdp'))
  losses, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'))
  # Megatron's pattern in each unit: conv1's output channels and conv2's input channels over tensor.
  unit = state.params['block3']['unit1']
  assert unit['conv1']['kernel'].sharding.spec[3] == 'tensor'
  assert unit['conv2']['kernel'].sharding.spec[2] == 'tensor'
  assert 'fsdp' in unit['conv2']['kernel'].sharding.spec
  assert losses[-1] != losses[0]


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'model.scan': True}, r'^model.scan does not apply to BiT-R50x1, a ResNet'),
        ({'model.remat': 'nothing_saveable'}, r'^model.remat does not apply to BiT-R50x1'),
        ({'model.posemb': 'learn2d'}, r'^model.posemb does not apply to BiT-R50x1'),
        (
            {'optim.layer_decay': 0.75},
            r'^config.optim.layer_decay \(a learning rate per ViT block\) needs a '
            r'ViT variant: BiT-R50x1 is a BiT ResNet$',
        ),
        (
            {'task': 'mpp'},
            r"^config.task='mpp' \(masked patches of a ViT's tokens\) needs a ViT variant",
        ),
        (
            {'flexi.patch_sizes': (2, 4)},
            r'^config.flexi.patch_sizes trains a ViT classifier at several patch sizes, and this '
            r'run is BiT-R50x1: unset --config.flexi.patch_sizes$',
        ),
    ],
)
def test_what_only_a_vit_has_is_a_one_line_error(tmp_path, data_dir, overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(_tiny_config(data_dir, **overrides), str(tmp_path / 'run'))
  assert '\n' not in str(error.value)


def test_an_evaluator_at_another_patch_size_refuses_a_bit(tmp_path, data_dir):
  config = _tiny_config(data_dir)
  config.evals.hi = dict(type='classification', split='test', every_steps=4, patch_size=8)
  with pytest.raises(ValueError, match=r"^Evaluator 'hi': patch_size is for a ViT, and BiT-R50x1 "):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_the_vit_tools_refuse_a_bit(tiny_run, tmp_path, data_dir):
  workdir, _, _ = tiny_run
  with pytest.raises(
      ValueError,
      match=r"^vit_jax.tools.pictures \(a ViT's attention and embeddings\) needs "
      r'a ViT variant: BiT-R50x1 is a BiT ResNet$',
  ):
    pictures.draw_run(workdir, 'unused.png', str(tmp_path / 'pictures'))
  with pytest.raises(
      ValueError,
      match=r"^vit_jax.tools.plan \(it models the memory of a ViT's blocks\) "
      'needs a ViT variant',
  ):
    config = _tiny_config(data_dir)
    meshes.check(config, helpers.model_config(config), 8)
  assert not (tmp_path / 'pictures').exists()
