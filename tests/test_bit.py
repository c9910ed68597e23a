"""BiT ResNet-v2 baselines: timm's logits through the published .npz layout both ways, the variants and
their parameter counts, the analytic FLOPs against XLA's, training on any mesh, resume, the tools.

The reference is timm's `resnetv2_*_bit` (PyTorch); the .npz layout is written here from its state dict
by inverting timm's `_load_weights`, independently of vit_jax's converter.
"""
import functools
import os
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import timm
import torch
from flax import traverse_util
from timm.layers import StdConv2d
from timm.models.resnetv2 import ResNetV2

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.planning import chips, footprint
from vit_jax.tools import export, fewshot, pictures, predict, scaling
from vit_jax.checkpoints import loading
from vit_jax.models import bit, variants
from vit_jax.train import loop, setup as train_setup


def _timm_bit(num_classes: int, seed: int = 0) -> torch.nn.Module:
  """timm's BiT-R50x1 with every parameter random: GroupNorm affines around (1, 0), the head small, the
  kernels at BiT's scale (std 0.01, where weight standardisation's epsilon shows)."""
  torch.manual_seed(seed)
  model = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=num_classes).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if p.ndim == 1:
        p.copy_((1.0 if name.endswith('weight') and 'head' not in name else 0.0) + 0.2 * torch.randn_like(p))
      else:
        p.copy_(torch.randn_like(p) * (0.05 if name.startswith('head') else 0.01))
  return model


def timm_to_bit_npz(model: torch.nn.Module) -> dict[str, np.ndarray]:
  """timm's ResNetV2 state dict in the published BiT .npz layout: the inverse of timm's
  `_load_weights` (kernels OIHW -> HWIO; stage i block j -> block{i+1}/unit{j+1:02d}; norm/conv 1, 2,
  3 -> a, b, c; the shortcut -> a/proj)."""
  sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  hwio = lambda w: w.transpose(2, 3, 1, 0)
  flat = {'resnet/root_block/standardized_conv2d/kernel': hwio(sd.pop('stem.conv.weight')),
          'resnet/group_norm/gamma': sd.pop('norm.weight'), 'resnet/group_norm/beta': sd.pop('norm.bias'),
          'resnet/head/conv2d/kernel': hwio(sd.pop('head.fc.weight')),
          'resnet/head/conv2d/bias': sd.pop('head.fc.bias')}
  for name, value in sd.items():
    stage, block, rest = re.fullmatch(r'stages\.(\d+)\.blocks\.(\d+)\.(.+)', name).groups()
    unit = f'resnet/block{int(stage) + 1}/unit{int(block) + 1:02d}/'
    if rest == 'downsample.conv.weight':
      flat[unit + 'a/proj/standardized_conv2d/kernel'] = hwio(value)
      continue
    kind, n, param = re.fullmatch(r'(conv|norm)([123])\.(weight|bias)', rest).groups()
    layer = 'abc'[int(n) - 1]
    if kind == 'conv':
      flat[f'{unit}{layer}/standardized_conv2d/kernel'] = hwio(value)
    else:
      flat[f'{unit}{layer}/group_norm/{"gamma" if param == "weight" else "beta"}'] = value
  return flat


def _timm_logits(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.from_numpy(images.transpose(0, 3, 1, 2))).numpy()  # timm takes NCHW.


def _images(n: int, size: int, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


R50 = bit.BiT(num_classes=10, resnet_layers=(3, 4, 6, 3))
# The demo config's ViT fields, unset for a BiT.
_NO_VIT = {f'model.{name}': None for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim',
                                               'head_dropout_rate')}


@pytest.fixture(scope='module')
def timm_r50():
  return _timm_bit(10)


@pytest.mark.parametrize('size', [64, 97])  # 97: odd sizes through every stride.
def test_the_published_npz_gives_timms_logits_through_init_from(tmp_path, timm_r50, size):
  np.savez(tmp_path / 'BiT-M-R50x1.npz', **timm_to_bit_npz(timm_r50))
  config = helpers.load_config('demo', {'variant': 'BiT-R50x1', 'image_size': size, 'keep_head': True,
                                        'init_from': str(tmp_path / 'BiT-M-R50x1.npz'), **_NO_VIT})
  # Nothing is resized at any resolution: a ResNet has no position embeddings.
  params = run_dir.load_init_params(config, R50)
  images = _images(2, size)
  expected = _timm_logits(timm_r50, images)
  np.testing.assert_allclose(np.asarray(jax.jit(R50.apply)({'params': params}, images)), expected,
                             atol=1e-4)
  assert np.abs(expected).max() > 0.5  # Logits of substance, not a vacuous match.


def test_our_npz_loads_into_timm_with_the_same_logits(tmp_path, timm_r50):
  rng = np.random.RandomState(1)
  params = jax.tree.map(lambda x: (0.01 if x.ndim > 1 else 0.2) * rng.randn(*x.shape).astype(np.float32),
                        loading.param_shapes(R50, 64))
  loading.save_npz(bit.to_bit_npz(params), str(tmp_path / 'ours.npz'))
  with np.load(tmp_path / 'ours.npz') as npz:
    assert set(npz.files) == set(timm_to_bit_npz(timm_r50))
  reference = timm.create_model('resnetv2_50x1_bit', pretrained=False, num_classes=10).eval()
  reference.load_pretrained(str(tmp_path / 'ours.npz'))
  images = _images(2, 64, seed=1)
  ours = np.asarray(jax.jit(R50.apply)({'params': params}, images))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.5
  # And back: the layout round-trips exactly.
  flat = traverse_util.flatten_dict(loading.load_npz(str(tmp_path / 'ours.npz')), sep='/')
  assert all(np.array_equal(flat[k], v) for k, v in traverse_util.flatten_dict(params, sep='/').items())


def test_a_new_class_count_gets_a_zero_head_and_nothing_else_changes(tmp_path, timm_r50):
  np.savez(tmp_path / 'BiT-M-R50x1.npz', **timm_to_bit_npz(timm_r50))
  loaded = loading.load_npz(str(tmp_path / 'BiT-M-R50x1.npz'))
  target = loading.param_shapes(bit.BiT(num_classes=3, resnet_layers=(3, 4, 6, 3)), 128)
  params, notes = loading.adapt_params(loaded, target, keep_head=False, keep_pre_logits=False)
  assert notes == ['replaced head (2048, 10) with zeros (2048, 3)']
  assert not np.any(params['head']['kernel']) and not np.any(params['head']['bias'])
  del params['head'], loaded['head']
  chex.assert_trees_all_equal(params, loaded)


# The variants.

@pytest.mark.parametrize('variant,timm_name', [('BiT-R50x1', 'resnetv2_50x1_bit'),
                                               ('BiT-R101x3', 'resnetv2_101x3_bit'),
                                               ('BiT-R152x4', 'resnetv2_152x4_bit')])
def test_parameter_counts_are_timms(variant, timm_name):
  reference = timm.create_model(timm_name, pretrained=False, device='meta')  # Shapes only.
  model = variants.make_model(variant, num_classes=1000, dtype=jnp.float32)
  ours = sum(x.size for x in jax.tree.leaves(loading.param_shapes(model, 224)))
  assert ours == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize('variant,overrides,message', [
    ('BiT-R34x1', {}, r"^Unknown BiT variant 'BiT-R34x1': use BiT-R<depth>x<width> with depth in 50, "
                      r'101, 152 and width in 1..4 \(e.g. BiT-R50x1'),
    ('BiT-R50x5', {}, r"^Unknown BiT variant 'BiT-R50x5'"),
    ('ResNet-50', {}, r"^Unknown model variant 'ResNet-50': use one of ViT, BiT, e.g. .*BiT-R50x1"),
    ('BiT-R50x1', {'num_heads': 4}, r'^model.num_heads does not apply to BiT-R50x1, a ResNet \(it takes '
                                    r'model.resnet_layers and model.resnet_width_factor\): unset'),
    ('BiT-R50x1', {'resnet_width_factor': 0.25},
     r"^model.resnet_width_factor=0.25 gives 16 root channels, not a positive multiple of GroupNorm's 32"),
    ('BiT-R50x1', {'resnet_layers': (3, 0)}, r'^model.resnet_layers=\(3, 0\) must be positive numbers'),
])
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
    cost = jax.jit(model.apply).lower(
        params, jax.ShapeDtypeStruct((batch, size, size, 3), jnp.float32)).compile().cost_analysis()
    return (cost[0] if isinstance(cost, (list, tuple)) else cost)['flops']

  analytic = chips.bit_flops(config, size, num_classes=10)
  assert analytic <= xla_flops(2) - xla_flops(1) <= 1.03 * analytic
  # The ViT paper's R50 at 224 px: 4.1 GMACs with whole windows; ours leaves the padding's out.
  assert chips.bit_flops(variants.get_model_config('BiT-R50x1'), 224) == pytest.approx(7.89e9, rel=1e-3)


# Training and the tools, on a tiny BiT.

TINY_BIT = {**helpers.TINY, **_NO_VIT, 'variant': 'BiT-R50x1', 'model.resnet_layers': (1, 1, 1, 1),
            'model.resnet_width_factor': 0.5, 'image_size': 16}


def _tiny_config(data_dir, **overrides):
  return helpers.load_config('demo', {**TINY_BIT, 'data_dir': data_dir, **overrides})


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory, data_dir):
  """A tiny BiT trained 12 steps on the digits under fsdp x tensor, with few-shot evaluation: its
  workdir, config and final metrics."""
  workdir = str(tmp_path_factory.mktemp('bit_runs') / 'tiny_bit')
  config = _tiny_config(data_dir, mesh=(('fsdp', 4), ('tensor', 2)), **{
      'fewshot.every_steps': 12, 'fewshot.shots': (1, 5), 'fewshot.seeds': 1})
  return workdir, config, loop.train_and_evaluate(train_setup.prepare(config, workdir))


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


def test_resume_is_bit_exact(tiny_run, tmp_path):
  full, config, _ = tiny_run
  helpers.assert_resume_is_bit_exact(config, full, str(tmp_path / 'resumed'))


def test_export_predict_and_timm_agree(tiny_run, tmp_path):
  workdir, _, _ = tiny_run
  description = export.export(workdir, str(tmp_path / 'export'))
  assert description['timm'] == ("not written: timm's VisionTransformer needs a ViT variant: BiT-R50x1 "
                                 'is a BiT ResNet')
  images = _images(4, 16, seed=2)
  ours = np.asarray(predict.load_run(workdir).logits_fn(images))
  np.testing.assert_allclose(np.asarray(predict.load_export(str(tmp_path / 'export')).logits_fn(images)),
                             ours, atol=1e-5)  # The jax.export artefact.
  reference = ResNetV2(layers=[1, 1, 1, 1], width_factor=0.5, num_classes=10, stem_type='fixed',
                       conv_layer=functools.partial(StdConv2d, eps=1e-8)).eval()  # timm's BiT builder.
  reference.load_pretrained(str(tmp_path / 'export' / 'model.npz'))
  np.testing.assert_allclose(_timm_logits(reference, images), ours, atol=1e-4)
  assert np.abs(ours).max() > 0.01  # The trained head is no longer zero.


def test_scaling_plots_a_bit_run_with_its_flops(tiny_run):
  workdir, _, _ = tiny_run
  point, = scaling.points([os.path.dirname(workdir)], 'eval_top1')
  model = variants.get_model_config('BiT-R50x1', {'resnet_layers': (1, 1, 1, 1), 'resnet_width_factor': 0.5})
  assert (point.family, point.shape) == ('BiT', 'R14x0.5')
  assert point.exaflops == pytest.approx(3 * chips.bit_flops(model, 16, 10) * 12 * 16 / 1e18, rel=1e-12)


def test_fsdp_x_tensor_training_has_the_losses_of_one_device(tmp_path, data_dir):
  # SGD: Adam's first steps are about lr * sign(grad), which would turn float noise in near-zero
  # gradients into differences of 2 * lr.
  config = _tiny_config(data_dir, mesh=(('fsdp', 4), ('tensor', 2)),
                        **{'optim.name': 'sgd', 'optim.weight_decay': 0.0, 'lr.base': 0.1})
  setup = train_setup.prepare(config, str(tmp_path / 'fsdp'))
  losses, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'))
  # Megatron's pattern in each unit: conv1's output channels and conv2's input channels over tensor.
  unit = state.params['block3']['unit1']
  assert unit['conv1']['kernel'].sharding.spec[3] == 'tensor'
  assert unit['conv2']['kernel'].sharding.spec[2] == 'tensor'
  assert 'fsdp' in unit['conv2']['kernel'].sharding.spec
  assert losses[-1] != losses[0]


@pytest.mark.parametrize('overrides,message', [
    ({'model.scan': True}, r'^model.scan does not apply to BiT-R50x1, a ResNet'),
    ({'model.remat': 'nothing_saveable'}, r'^model.remat does not apply to BiT-R50x1'),
    ({'model.posemb': 'learn2d'}, r'^model.posemb does not apply to BiT-R50x1'),
    ({'optim.layer_decay': 0.75}, r'^config.optim.layer_decay \(a learning rate per ViT block\) needs a '
                                  r'ViT variant: BiT-R50x1 is a BiT ResNet$'),
    ({'task': 'mpp'}, r"^config.task='mpp' \(masked patches of a ViT's tokens\) needs a ViT variant"),
])
def test_what_only_a_vit_has_is_a_one_line_error(tmp_path, data_dir, overrides, message):
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(_tiny_config(data_dir, **overrides), str(tmp_path / 'run'))
  assert '\n' not in str(error.value)


def test_the_vit_tools_refuse_a_bit(tiny_run, tmp_path, data_dir):
  workdir, _, _ = tiny_run
  with pytest.raises(ValueError, match=r"^vit_jax.tools.pictures \(a ViT's attention and embeddings\) needs "
                     r'a ViT variant: BiT-R50x1 is a BiT ResNet$'):
    pictures.draw_run(workdir, 'unused.png', str(tmp_path / 'pictures'))
  with pytest.raises(ValueError, match=r"^vit_jax.tools.plan \(it models the memory of a ViT's blocks\) "
                     'needs a ViT variant'):
    footprint.check(_tiny_config(data_dir), 8)
  assert not (tmp_path / 'pictures').exists()
