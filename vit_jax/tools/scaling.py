"""Accuracy against pre-training compute, a point a run: the paper's scaling study (Figures 5 and 8).

  python -m vit_jax.tools.scaling SWEEP_ROOT [SWEEP_ROOT ...] --out=DIR [--metric=eval_top1]

A run's pre-training compute is 3 forward passes (the backward pass costs two) of
vit_jax.planning.chips.vit_flops (a BiT's: bit_flops; with patch dropout, of the patches kept) per image, times the images it has trained on when it last
logged the metric (batch_size x that step), in exaFLOPs (1e18 FLOPs): the paper's count (Table 6:
ViT-B/32 for 7 epochs of JFT-300M's 303M images is 55 exaFLOPs). Writes DIR/scaling.png (log-scale
compute, a colour a model family: ViT, the R50+ViT hybrid, BiT) and DIR/scaling.md (a row a run:
family, shape, resolution, step, images, exaFLOPs, the metric), and prints the table. Runs that have
not logged the metric are left out.
"""

if __name__ == '__main__':  # Before anything loads TensorFlow (epath does, for a gs:// path).
  from vit_jax.runtime import quiet  # pylint: disable=g-import-not-at-top

  quiet.quiet_tensorflow()

import dataclasses
import json
from typing import Any, Sequence

import matplotlib
from absl import flags
from etils import epath

matplotlib.use('Agg')  # Files only: no display needed.
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.planning import chips  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.runtime import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools import figures  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools.runs import Run, eval_metrics, find_runs, load_run  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.models import variants, vit_variants  # pylint: disable=g-import-not-at-top,wrong-import-position

_USAGE = 'SWEEP_ROOT [SWEEP_ROOT ...] --out=DIR [--metric=eval_top1]'
EXA = 1e18
FIGURE_INCHES, DPI = (8.0, 5.5), 100


@dataclasses.dataclass(frozen=True)
class Point:
  run: str
  family: str  # One of FAMILY_ORDER: 'ViT' | 'R50+ViT' | 'BiT'.
  shape: str  # e.g. '8 layers, D 1024, MLP 2048, /32' (the input pixels a token sees), 'R50x1'.
  image_size: int
  step: int  # Where the metric was last logged.
  images: int  # Trained on by then: batch_size x step.
  exaflops: float
  accuracy: float


def model_config(config: dict[str, Any]) -> dict[str, Any]:
  """The model a run's flat config.json describes, as the training loop builds it."""
  overrides = {
      key.removeprefix('model.'): value for key, value in config.items() if key.startswith('model.')
  }
  return variants.get_model_config(config['variant'], overrides)


def pretraining_exaflops(
    variant: str, model: dict[str, Any], image_size: int, num_classes: int, images: int
) -> float:
  family = variants.family(variant)
  if family == 'ViT':  # Its blocks see the patches that model.patch_dropout keeps.
    per_image = chips.train_flops(model, image_size, num_classes, remat=None)
  else:
    per_image = 3 * chips.FLOPS[family](model, image_size, num_classes)
  return per_image * images / EXA


def _vit_shape(model: dict[str, Any]) -> tuple[str, str]:
  return (
      'R50+ViT' if model['resnet_layers'] else 'ViT',
      f"{model['num_layers']} layers, D {model['hidden_size']}, MLP {model['mlp_dim']}, "
      f'/{vit_variants.input_stride(model)}',
  )


def _bit_shape(model: dict[str, Any]) -> tuple[str, str]:
  # Three convolutions a unit, plus the root and the head: R50 for (3, 4, 6, 3).
  return 'BiT', f"R{3 * sum(model['resnet_layers']) + 2}x{model['resnet_width_factor']:g}"


# A model config -> (the family in the plot, the shape), by variants.FAMILIES key.
FAMILY_SHAPES = {'ViT': _vit_shape, 'BiT': _bit_shape}
FAMILY_ORDER = ('ViT', 'R50+ViT', 'BiT')  # Of the plot's colours.


def point(run: Run, path: epath.Path, metric: str) -> Point:
  info = path / 'dataset_info.json'
  if not info.exists():
    raise ValueError(f'{path} has no dataset_info.json (its head size): is it a vit_jax run?')
  if not run.config:
    raise ValueError(f'{path} has no config.json (its model and batch): is it a vit_jax run?')
  model, variant = model_config(run.config), run.config['variant']
  step = max(run.scalars[metric])
  images = run.config['batch_size'] * step
  return Point(
      run.name,
      *FAMILY_SHAPES[variants.family(variant)](model),
      run.config['image_size'],
      step,
      images,
      pretraining_exaflops(
          variant,
          model,
          run.config['image_size'],
          json.loads(info.read_text())['num_classes'],
          images,
      ),
      run.scalars[metric][step],
  )


def points(roots: Sequence[str], metric: str) -> list[Point]:
  """A point for each run under `roots` that has logged `metric`; a one-line ValueError if none has."""
  runs = [(load_run(name, path), path) for name, path in find_runs(roots)]
  found = [point(run, path, metric) for run, path in runs if run.scalars.get(metric)]
  if not found:
    logged = eval_metrics([run for run, _ in runs])
    raise ValueError(
        f'no run logged {metric!r}: use --metric= one of {", ".join(logged) or "(none yet)"}'
    )
  return found


def to_markdown(found: Sequence[Point], metric: str) -> str:
  lines = [
      f'| run | family | model | image size | step | images | exaFLOPs | {metric} |',
      '|---|---|---|---|---|---|---|---|',
  ]
  lines += [
      f'| {p.run} | {p.family} | {p.shape} | {p.image_size} | {p.step} | {p.images} | '
      f'{p.exaflops:.4g} | {p.accuracy:.4g} |'
      for p in found
  ]
  return '\n'.join(lines) + '\n'


def plot(found: Sequence[Point], metric: str) -> bytes:
  """The PNG: the metric against log-scale compute, a colour a family, each point named by its shape."""
  fig, ax = plt.subplots(figsize=FIGURE_INCHES, dpi=DPI, layout='constrained')
  colors = plt.get_cmap('tab10').colors
  for i, family in enumerate(sorted({p.family for p in found}, key=FAMILY_ORDER.index)):
    members = [p for p in found if p.family == family]
    ax.scatter(
        [p.exaflops for p in members],
        [p.accuracy for p in members],
        color=colors[i],
        label=family,
        zorder=2,
    )
    for p in members:
      ax.annotate(
          p.shape, (p.exaflops, p.accuracy), fontsize=6, xytext=(3, 3), textcoords='offset points'
      )
  ax.set(xscale='log', xlabel='pre-training compute (exaFLOPs)', ylabel=metric)
  ax.margins(x=0.15)  # Room for the rightmost point's name.
  ax.grid(alpha=0.3, which='both')
  ax.legend(frameon=False)
  return figures.png(fig, DPI)


def scaling(roots: Sequence[str], out: str, metric: str) -> tuple[str, list[str]]:
  """Writes scaling.png and scaling.md to `out`; returns the table and their paths. Bad input is a
  one-line ValueError, raised before anything is written."""
  found = sorted(points(roots, metric), key=lambda p: (p.family, p.exaflops))
  markdown = to_markdown(found, metric)
  png = plot(found, metric)
  cli.make_out_dir(out)
  written = [epath.Path(out) / 'scaling.png', epath.Path(out) / 'scaling.md']
  written[0].write_bytes(png)
  written[1].write_text(markdown)
  return markdown, [str(path) for path in written]


def main(argv: list[str]) -> None:
  out = flags.FLAGS.out
  if len(argv) < 2 or not out:
    cli.fail(f'no {"SWEEP_ROOT" if len(argv) < 2 else "--out"} given: use {_USAGE}')
  try:
    markdown, written = scaling(argv[1:], out, flags.FLAGS.metric)
  except ValueError as e:
    cli.fail(str(e))
  print(markdown + ''.join(f'\n{path}' for path in written))


if __name__ == '__main__':
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('out', None, 'Directory to write scaling.png and scaling.md.')
  flags.DEFINE_string(
      'metric',
      'eval_top1',
      'The accuracy to plot: an eval metric the runs log, ' 'e.g. fewshot_5shot.',
  )
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
