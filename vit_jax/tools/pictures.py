"""Pictures of what a trained ViT attends to and what it has learned (the paper's Figures 6 and 7).

  python -m vit_jax.tools.pictures --workdir=W [--step=N|best] --image=X --out=DIR

writes, for checkpoint N of W (default: the latest) and the image file X, to DIR:
  attention_rollout.png         the image and the attention rollout through all layers;
  attention_rollout_layers.png  the rollout up to each layer;
  position_embeddings.png       cosine similarity of each position's embedding to every position's;
  embedding_filters.png         the top principal components of the patch-embedding filters;
  attention_distance.png        the mean attention distance of each head, by layer.

The numbers come from vit_jax.tools.introspection; this module draws them with matplotlib and is the
command. The pictures show the part of the image the model sees: the central square of
`pp_eval.crop='central'`, the whole image (squeezed to a square) of 'resize'.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import math
from typing import Any, Mapping

import chex
from etils import epath
import flax.linen as nn
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np
from absl import flags, logging

matplotlib.use('Agg')  # Files only: no display needed.
from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.runtime import cli  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools import figures, introspection  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.tools import classifiers  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.models import variants  # pylint: disable=g-import-not-at-top,wrong-import-position

_USAGE = '--workdir=W [--step=N|best] --image=X --out=DIR'


def attended(image: np.ndarray, heat: np.ndarray) -> np.ndarray:
  """The image (uint8 [h, w, 3]) times the map [gh, gw] resized to it and scaled to a maximum of 1:
  what the model looks at stays, the rest fades to black (as the paper's Figure 6)."""
  mask = jax.image.resize(jnp.asarray(heat / heat.max(), jnp.float32), image.shape[:2], 'bilinear')
  return np.clip(image / 255 * np.asarray(mask)[..., None], 0, 1)


def plot_rollout(image: np.ndarray, maps: np.ndarray, query: str, path: str) -> str:
  fig, (left, middle, right) = plt.subplots(1, 3, figsize=(8, 3.2))
  figures.show(left, image, 'input')
  figures.show(
      middle,
      maps[-1] / maps[-1].max(),
      f'rollout through all {len(maps)} layers',
      cmap='inferno',
      vmin=0,
      vmax=1,
  )
  figures.show(right, attended(image, maps[-1]), 'input x rollout')
  fig.suptitle(f'Attention rollout: {query}', fontsize=10)
  return figures.save_png(fig, path)


def plot_rollout_layers(image: np.ndarray, maps: np.ndarray, query: str, path: str) -> str:
  fig, axes = plt.subplots(1, len(maps), figsize=(2.2 * len(maps), 2.6), squeeze=False)
  for i, (ax, heat) in enumerate(zip(axes[0], maps)):
    title = 'layer 1' if i == 0 else f'layers 1-{i + 1}'
    figures.show(ax, attended(image, heat), title + (' (joint)' if i == len(maps) - 1 else ''))
  fig.suptitle(f'Attention rollout up to each layer: {query}', fontsize=10)
  return figures.save_png(fig, path)


def plot_reconstruction(
    image: np.ndarray, hidden: np.ndarray, drawn: np.ndarray, stride: int, path: str
) -> str:
  """A masked autoencoder's figure: the model's input (pixels in [-1, 1]), its hidden patches
  (`hidden` [h * w]) greyed out, and the decoder's pixels in their place."""
  grid = image.shape[0] // stride, image.shape[1] // stride
  masked = np.kron(hidden.reshape(grid), np.ones((stride, stride)))[..., None] > 0
  shown = [np.clip((x + 1) / 2, 0, 1) for x in (image, np.where(masked, 0.0, image), drawn)]
  fig, axes = plt.subplots(1, 3, figsize=(8, 3.2))
  titles = ('input', f'{int(hidden.sum())} of {hidden.size} patches hidden', 'reconstruction')
  for ax, picture, title in zip(axes, shown, titles):
    figures.show(ax, picture, title)
  fig.suptitle('Masked autoencoder: the hidden patches drawn by the decoder', fontsize=10)
  return figures.save_png(fig, path)


def plot_position_similarity(similarity: np.ndarray, path: str) -> str:
  gh, gw = similarity.shape[:2]
  fig, ax = plt.subplots(figsize=(6, 5.4))
  image = ax.imshow(
      figures.mosaic(similarity.reshape(gh * gw, gh, gw), gw, np.nan),
      cmap='viridis',
      vmin=-1,
      vmax=1,
  )
  ax.set_xticks([(gw + 1) * c + (gw - 1) / 2 for c in range(gw)], range(1, gw + 1))
  ax.set_yticks([(gh + 1) * r + (gh - 1) / 2 for r in range(gh)], range(1, gh + 1))
  ax.set_xlabel('input patch column')
  ax.set_ylabel('input patch row')
  fig.colorbar(image, ax=ax, label='cosine similarity')
  ax.set_title('Position embedding similarity', fontsize=10)
  return figures.save_png(fig, path)


def plot_embedding_components(components: np.ndarray, path: str) -> str:
  low = components.min(axis=(1, 2, 3), keepdims=True)
  high = components.max(axis=(1, 2, 3), keepdims=True)
  tiles = (components - low) / np.maximum(high - low, 1e-12)  # Each component's own range, as RGB.
  fig, ax = plt.subplots(figsize=(6, 3.8))
  ax.imshow(figures.mosaic(tiles, 7, 1.0))
  ax.axis('off')
  ax.set_title(f'RGB embedding filters (first {len(components)} principal components)', fontsize=10)
  return figures.save_png(fig, path)


def plot_attention_distance(distances: np.ndarray, image_size: int, path: str) -> str:
  layers, heads = distances.shape
  fig, ax = plt.subplots(figsize=(5, 4))
  for head in range(heads):
    ax.scatter(np.arange(1, layers + 1), distances[:, head], s=18, label=f'head {head + 1}')
  ax.set_xlim(0.5, layers + 0.5)
  ax.set_xticks(range(1, layers + 1))
  ax.set_ylim(0, image_size * math.sqrt(2))  # The diagonal: no distance can be larger.
  ax.set_xlabel('network depth (layer)')
  ax.set_ylabel(f'mean attention distance (pixels of the {image_size}x{image_size} input)')
  if heads <= 16:
    ax.legend(fontsize=7, ncol=2)
  ax.set_title('Size of attended area by head and depth', fontsize=10)
  return figures.save_png(fig, path)


def _join(directory: str, name: str) -> str:
  return str(epath.Path(directory) / name)


def seen_part(
    image: np.ndarray, image_size: int, pp_eval: Mapping[str, Any] = classifiers.DEFAULT_PP_EVAL
) -> np.ndarray:
  """The part of `image` (uint8 [h, w, 3]) that the eval crop `pp_eval` makes the model input: the
  central square of 'central' (to the pixel: crops.central_crop's arithmetic, in the image's own
  pixels), all of it for 'resize' (which squeezes it to the square the maps cover)."""
  from vit_jax.data import crops  # pylint: disable=g-import-not-at-top

  pp_eval = {**classifiers.DEFAULT_PP_EVAL, **pp_eval}
  if pp_eval['crop'] != 'central':
    return image
  shape = np.array(image.shape[:2], np.float64)
  # The central image_size square of the resized image, its offset rounded half to even
  # (torchvision's geometry), in the image's own pixels.
  scaled = np.array(
      crops.central_scaled_size(*image.shape[:2], image_size, pp_eval['crop_fraction']), np.float64
  )
  offset = np.round((scaled - image_size) / 2)
  top, left = np.round(offset * shape / scaled).astype(int)
  bottom, right = np.round((offset + image_size) * shape / scaled).astype(int)
  return image[top:bottom, left:right]


def write_pictures(
    model: nn.Module,
    params: Any,
    image: np.ndarray,
    image_size: int,
    out: str,
    pp_eval: Mapping[str, Any] = classifiers.DEFAULT_PP_EVAL,
) -> list[str]:
  """Writes the pictures for `image` (uint8 [h, w, 3]), prepared by the eval crop `pp_eval`, to `out`
  (five; four for fixed position embeddings); returns their paths."""
  cli.make_out_dir(out)
  prefix = model.num_prefix_tokens  # The class token and registers, if any.
  query = {
      'token': 'from the class token',
      'gap': 'mean over tokens (GAP model: no class token)',
      'map': "weighted by the MAP head's attention (no class token)",
      'token_gap': 'from the class token and the mean over patches, half each',
  }[model.classifier]
  inputs = classifiers.model_input(image, image_size, pp_eval)[None]
  attention = introspection.attention_weights(model, params, inputs)[:, 0]
  tokens = (
      prefix + (image_size // model.input_stride) ** 2
  )  # The model takes only sizes it divides.
  chex.assert_shape(attention, (model.num_layers, model.num_heads, tokens, tokens))
  # MAP pools with its probe's attention: the rollout's rows weighted by it, not their mean;
  # token_gap's representation is the class token's and the patches' mean: half of it each.
  pooled = None
  if model.classifier == 'map':  # Its probe attends to the patches alone, or to every token.
    weights = introspection.probe_weights(model, params, inputs)[0]
    pooled = np.zeros(tokens)
    pooled[tokens - len(weights) :] = weights
  elif model.classifier == 'token_gap':
    pooled = np.zeros(tokens)
    pooled[0], pooled[prefix:] = 0.5, 0.5 / (tokens - prefix)
  maps = introspection.rollout_maps(
      introspection.attention_rollout(attention), prefix, model.classifier == 'token', pooled
  )
  # The maps cover what the model sees, so the pictures show that part of the image.
  image = seen_part(image, image_size, pp_eval)
  kernel = np.asarray(params['embedding']['kernel'])
  pictures = [
      plot_rollout(image, maps, query, _join(out, 'attention_rollout.png')),
      plot_rollout_layers(image, maps, query, _join(out, 'attention_rollout_layers.png')),
  ]
  # A learned 1-D `pos_embedding` (input or shared): the other kinds (posemb.py) have no picture.
  if 'pos_embedding' in params['Transformer'].get('posembed_input', {}):
    pictures.append(
        plot_position_similarity(
            introspection.position_similarity(
                np.asarray(params['Transformer']['posembed_input']['pos_embedding']), prefix
            ),
            _join(out, 'position_embeddings.png'),
        )
    )
  if kernel.shape[2] == 3:  # A hybrid's patch embedding reads ResNet features, not pixels.
    pictures.append(
        plot_embedding_components(
            introspection.embedding_components(kernel), _join(out, 'embedding_filters.png')
        )
    )
  distances = introspection.mean_attention_distance(attention, model.input_stride, prefix)
  pictures.append(
      plot_attention_distance(distances, image_size, _join(out, 'attention_distance.png'))
  )
  return pictures


def draw_run(workdir: str, image_path: str, out: str, step: int | str | None = None) -> list[str]:
  """The pictures of checkpoint `step` (default: the latest) of a run for one image file."""
  # Imported here: it loads TensorFlow, which `__main__` first tells to keep its start-up lines quiet.
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top

  run = run_dir.load_trained(workdir, step, features=True)  # The ViT backbone, also of an MPP run.
  variants.require_vit(
      run.config.variant, "vit_jax.tools.pictures (a ViT's attention and embeddings)"
  )
  if run.model.block != 'standard':
    raise ValueError(
        f'the pictures show attention over all patches; an {run.config.variant} attends '
        'along rows and columns only'
    )
  image = classifiers.read_image(image_path, classifiers.exif_upright(run.config))
  pp_eval = run.config.pp_eval.to_dict()
  written = write_pictures(run.model, run.params, image, run.config.image_size, out, pp_eval)
  if run.config.task == 'mae':
    written.append(_draw_reconstruction(run, image, out))
  return written


def _draw_reconstruction(run: Any, image: np.ndarray, out: str) -> str:
  """A masked autoencoder run's (`run`: run_dir.load_trained's, its parameters the whole model's)
  reconstruction of `image`, its patches hidden as in evaluation."""
  from vit_jax.tasks import mae  # pylint: disable=g-import-not-at-top

  model = mae.make_model(run.config, run.model_config, None)
  inputs = classifiers.model_input(image, run.config.image_size, run.config.pp_eval.to_dict())[None]
  drawn, hidden = mae.reconstruction(
      model,
      run.params,
      jnp.asarray(inputs),
      run.config.mae.norm_pix_loss,
      mae.normalization(run.config),
  )
  return plot_reconstruction(
      inputs[0],
      np.asarray(hidden[0]),
      np.asarray(drawn[0]),
      model.input_stride,
      _join(out, 'mae_reconstruction.png'),
  )


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run to draw.')
  cli.define_step_flag()
  flags.DEFINE_string('image', None, 'Image file (jpg/png) to show the attention on.')
  flags.DEFINE_string('out', None, 'Directory to write the PNG pictures to.')
  flags.mark_flags_as_required(['workdir', 'image', 'out'])


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  try:
    paths = draw_run(args.workdir, args.image, args.out, args.step)
  except ValueError as e:
    cli.fail(str(e))
  print('\n'.join(paths))


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
