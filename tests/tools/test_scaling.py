"""The scaling study: configs/sweeps/scaling_fig5.py and scaling_fig8.py expand to the paper's grids,
the compute is the paper's (Table 6), and python -m vit_jax.tools.scaling on a root of tiny runs on the
digits (a ViT and a hybrid)."""

import importlib.util
import os
import shutil
import subprocess
import sys

import matplotlib
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.checkpoints import run_dir
from vit_jax.planning import chips
from vit_jax.tools import scaling
from vit_jax.models import variants, vit_variants
from vit_jax.train import loop, setup as train_setup
import sweep

STEPS = 4
# name: model overrides of the tiny run (helpers.TINY's ViT otherwise).
RUNS = {
    'vit': {},
    'hybrid': {
        'variant': 'R50+ViT-testing_4',
        'model.resnet_layers': (1,),
        'model.resnet_width_factor': 0.5,
    },  # 32 channels: GroupNorm's 32 groups.
}


# The slow tests of these runs share one xdist worker, which trains them once (not once a worker).
SCALING_ROOT_GROUP = pytest.mark.xdist_group('scaling_root')


@pytest.fixture(scope='module')
def scaling_root(data_dir, tmp_path_factory):
  root = tmp_path_factory.mktemp('scaling_root')
  for name, overrides in RUNS.items():
    config = helpers.load_config(
        'demo',
        {
            **helpers.TINY,
            'data_dir': data_dir,
            'total_steps': STEPS,
            'eval_every_steps': STEPS,
            'checkpoint_every_steps': STEPS,
            **overrides,
        },
    )
    loop.train_and_evaluate(train_setup.prepare(config, str(root / name)))
  return str(root)


def _grid(sweep_file: str) -> list[tuple[str, int, int, int, int, float]]:
  """(family, layers, width, MLP, input stride, epochs) of each run of a sweep file, as the runs'
  configs build their models."""
  spec = importlib.util.spec_from_file_location('grid', os.path.join(helpers.REPO, sweep_file))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  grid = []
  for overrides in sweep.expand(module.get_sweep()):
    config_file, _, arg = overrides.pop('config', module.CONFIG).partition(':')
    name = config_file.removeprefix('configs/').removesuffix('.py')
    config = helpers.load_config(f'{name}:{arg}' if arg else name, overrides)
    model = variants.get_model_config(config.variant, config.model.to_dict())
    if variants.family(config.variant) == 'BiT':
      grid.append(
          (
              'BiT',
              model['resnet_layers'],
              model['resnet_width_factor'],
              config.lr.base,
              config.num_epochs,
          )
      )
      continue
    assert model['representation_size'] == model['hidden_size']  # The paper's pre-logits.
    grid.append(
        (
            'R50+ViT' if model['resnet_layers'] else 'ViT',
            model['num_layers'],
            model['hidden_size'],
            model['mlp_dim'],
            vit_variants.input_stride(model),
            config.num_epochs,
        )
    )
  return grid


def test_fig8_sweep_scales_one_dimension_at_a_time_from_the_base():
  grid = _grid('configs/sweeps/scaling_fig8.py')
  base = ('ViT', 8, 1024, 2048, 32, 7.0)
  assert len(set(grid)) == len(grid) == 16 and base in grid
  assert sorted(g[1] for g in grid if g[2:] == base[2:]) == [1, 2, 4, 8, 16, 32, 64]
  assert sorted(g[2] for g in grid if g[1] == 8 and g[3:] == base[3:]) == [256, 512, 1024, 2048]
  assert sorted(g[3] for g in grid if g[1:3] == base[1:3] and g[4] == 32) == [
      512,
      1024,
      2048,
      4096,
      8192,
  ]
  assert sorted(g[4] for g in grid if g[1:4] == base[1:4]) == [8, 16, 32]


def test_fig5_sweep_is_every_variant_at_both_lengths():
  grid = _grid('configs/sweeps/scaling_fig5.py')
  with pytest.raises(
      ValueError, match=r'^configs/bit_i21k.py:BiT-R18x1: use a BiT-R\{50,101,152\}x'
  ):
    helpers.load_config('bit_i21k:BiT-R18x1')
  resnets = sorted(g for g in grid if g[0] == 'BiT')
  grid = [g for g in grid if g[0] != 'BiT']
  # The ResNets of Figure 5 with Table 3's learning rate by depth.
  units = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
  assert resnets == sorted(
      ('BiT', units[depth], float(width), lr, epochs)
      for depth, width, lr in [
          (50, 1, 1e-3),
          (50, 2, 1e-3),
          (101, 1, 8e-4),
          (152, 1, 6e-4),
          (152, 2, 6e-4),
      ]
      for epochs in (7.0, 14.0)
  )
  shapes = {
      ('ViT', 12, 768, 3072): 'B',
      ('ViT', 24, 1024, 4096): 'L',
      ('ViT', 32, 1280, 5120): 'H',
      ('R50+ViT', 12, 768, 3072): 'R50+B',
      ('R50+ViT', 24, 1024, 4096): 'R50+L',
  }
  assert sorted((shapes[g[:4]], g[4], g[5]) for g in grid) == sorted(
      (name, stride, epochs)
      for name, stride in [
          ('B', 32),
          ('B', 16),
          ('L', 32),
          ('L', 16),
          ('H', 14),
          ('R50+B', 32),
          ('R50+B', 16),
          ('R50+L', 32),
          ('R50+L', 16),
      ]
      for epochs in (7.0, 14.0)
  )


@pytest.mark.parametrize(
    'variant, epochs, paper',
    [
        ('ViT-B_32', 7, 55),
        ('ViT-B_16', 7, 224),
        ('ViT-L_32', 7, 196),
        ('ViT-L_16', 7, 783),
        ('ViT-L_16', 14, 1567),
        ('ViT-H_14', 14, 4262),
    ],
)
def test_compute_is_the_papers_table_6(variant, epochs, paper):
  """JFT-300M (303M images, 18291 classes) at 224 px, pre-logits of the model's width."""
  model = variants.get_model_config(
      variant, {'representation_size': vit_variants.SIZES[variant[4]][1]}
  )
  assert scaling.pretraining_exaflops(
      variant, model, 224, 18291, 303_000_000 * epochs
  ) == pytest.approx(paper, rel=0.03)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@SCALING_ROOT_GROUP
def test_points_are_the_runs_compute_and_logged_accuracy(scaling_root):
  found = {p.run: p for p in scaling.points([scaling_root], 'eval_top1')}
  assert sorted(found) == sorted(RUNS)
  for name, p in found.items():
    config, info = run_dir.load_run_info(os.path.join(scaling_root, name))
    model = variants.get_model_config(config.variant, config.model.to_dict())
    flops = 3 * chips.vit_flops(model, config.image_size, info.num_classes)
    assert (p.step, p.images) == (STEPS, STEPS * config.batch_size)
    assert p.exaflops == pytest.approx(flops * STEPS * config.batch_size / 1e18, rel=1e-12)
    assert p.accuracy == helpers.read_scalars(os.path.join(scaling_root, name))['eval_top1'][STEPS]
    assert p.family == ('R50+ViT' if name == 'hybrid' else 'ViT')


def test_a_metric_no_run_logged_is_a_one_line_error_naming_those_logged(trained_tiny_run, tmp_path):
  with pytest.raises(ValueError) as error:
    scaling.scaling([trained_tiny_run], str(tmp_path / 'out'), 'fewshot_5shot')
  assert str(error.value) == (
      "no run logged 'fewshot_5shot': use --metric= one of eval_loss, " 'eval_top1, eval_top5'
  )
  assert not (tmp_path / 'out').exists()


def test_a_run_without_its_config_is_a_one_line_error(trained_tiny_run, tmp_path):
  run = tmp_path / 'root' / 'run'
  run.mkdir(parents=True)
  for name in os.listdir(trained_tiny_run):
    if name.startswith('events.out') or name == 'dataset_info.json':
      shutil.copy(os.path.join(trained_tiny_run, name), run)
  with pytest.raises(ValueError) as error:
    scaling.scaling([str(tmp_path / 'root')], str(tmp_path / 'out'), 'eval_top1')
  assert str(error.value) == (
      f'{run} has no config.json (its model and batch): is it a vit_jax run?'
  )


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@SCALING_ROOT_GROUP
def test_command_line_writes_the_picture_and_the_table(scaling_root, tmp_path):
  out = tmp_path / 'out'
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.scaling', scaling_root, f'--out={out}'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  table = (out / 'scaling.md').read_text()
  assert run.stdout == f'{table}\n{out}/scaling.png\n{out}/scaling.md\n'
  assert len(table.splitlines()) == 2 + len(RUNS)
  image = np.asarray(Image.open(out / 'scaling.png').convert('RGB'))
  assert image.shape == (
      round(scaling.FIGURE_INCHES[1] * scaling.DPI),
      round(scaling.FIGURE_INCHES[0] * scaling.DPI),
      3,
  )
  colors = [
      np.round(np.array(c) * 255).astype(np.uint8) for c in matplotlib.colormaps['tab10'].colors
  ]
  present = [np.all(image == color, axis=-1).any() for color in colors[:3]]
  assert present == [True, True, False]  # A colour a family: ViT and the hybrid.
