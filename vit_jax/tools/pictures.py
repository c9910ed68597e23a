"""Pictures of what a trained ViT attends to and what it has learned (the paper's Figures 6 and 7).

  python -m vit_jax.tools.pictures --workdir=W [--step=N] --image=X --out=DIR

writes, for checkpoint N of W (default: the latest) and the image file X, to DIR:
  attention_rollout.png         the image and the attention rollout through all layers;
  attention_rollout_layers.png  the rollout up to each layer;
  position_embeddings.png       cosine similarity of each position's embedding to every position's;
  embedding_filters.png         the top principal components of the patch-embedding filters;
  attention_distance.png        the mean attention distance of each head, by layer.

Attention rollout (Abnar & Zuidema, 2020): each layer's attention averaged over heads, plus the identity
for the residual connection, rows renormalised; the product over layers 1..l says how much each token
after layer l draws on each input token. The map weighs those rows as the model pools its tokens into
its representation: the class token's row (classifier 'token'), the mean of all rows (GAP), the MAP
head's probe attention averaged over heads (MAP). The attention weights are those the model's
attention modules sow into its 'intermediates' collection. The pictures show the part of the image the
model sees: the central square of `pp_eval.crop='central'`, the whole image (squeezed to a square)
of 'resize'.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import io
import math
from typing import Any, Mapping, Optional

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
from vit_jax.tools import predict  # pylint: disable=g-import-not-at-top,wrong-import-position
from vit_jax.models import pooling, variants  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_COMPONENTS = 28  # As the paper's Figure 7 (left).

_USAGE = '--workdir=W [--step=N] --image=X --out=DIR'


def _sow_probe_weights(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
  """A flax method interceptor: the MAP head's attention sows its weights as the blocks' do (MAPHead
  calls it without `sow_weights`, which the tool needs only here)."""
  if (
      context.method_name == '__call__'
      and isinstance(context.module, nn.MultiHeadDotProductAttention)
      and isinstance(context.module.parent, pooling.MAPHead)
  ):
    kwargs = {**kwargs, 'sow_weights': True}
  return next_fun(*args, **kwargs)


def _intermediates(model: nn.Module, params: Any, images: jax.Array) -> tuple[nn.Module, Any]:
  """The float32 clone of `model` the weights are measured on, and what its attention sows."""
  # Measurements in float32, whatever the run computed in; the fused attention kernel sows no weights,
  # and blocks under one nn.scan hide their intermediates.
  model = model.clone(dtype=jnp.float32, attention='xla', scan=False)
  with nn.intercept_methods(_sow_probe_weights):
    _, state = model.apply({'params': params}, images, train=False, mutable=['intermediates'])
  return model, state['intermediates']


def attention_weights(model: nn.Module, params: Any, images: jax.Array) -> np.ndarray:
  """Every block's attention weights for `images` [b, h, w, 3]: [layers, b, heads, tokens, tokens]."""
  model, intermediates = _intermediates(model, params, images)
  blocks = intermediates['Transformer']
  # encoderblock_10 sorts before encoderblock_2 as a string.
  names = sorted(blocks, key=lambda name: int(name.rsplit('_', 1)[1]))
  weights = np.stack(
      [blocks[name]['MultiHeadDotProductAttention_1']['attention_weights'][0] for name in names]
  )
  chex.assert_shape(weights, (model.num_layers, len(images), model.num_heads, None, None))
  return weights


def probe_weights(model: nn.Module, params: Any, images: jax.Array) -> np.ndarray:
  """[b, tokens]: a MAP model's (classifier 'map') pooling, the probe's attention over the encoded
  tokens, averaged over its heads as the rollout averages each layer's."""
  _, intermediates = _intermediates(model, params, images)
  probe = intermediates['MAPHead_0']['MultiHeadDotProductAttention_0']['attention_weights'][0]
  return np.asarray(probe)[:, :, 0].mean(axis=1)  # [b, heads, 1 probe, tokens].


def attention_rollout(attention: np.ndarray) -> np.ndarray:
  """The rollout up to each layer [layers, tokens, tokens] of attention [layers, heads, tokens, tokens]."""
  tokens = attention.shape[-1]
  mixed = attention.mean(axis=1) + np.eye(
      tokens
  )  # The identity stands for the residual connection.
  mixed /= mixed.sum(axis=-1, keepdims=True)
  joint, rollout = np.eye(tokens), []
  for layer in mixed:
    joint = layer @ joint
    rollout.append(joint)
  return np.stack(rollout)


def rollout_maps(
    rollout: np.ndarray,
    num_prefix_tokens: int,
    class_token: bool,
    pooled: Optional[np.ndarray] = None,
) -> np.ndarray:
  """[layers, gh, gw]: how much the image's representation draws on each patch, up to each layer.

  `pooled` [tokens]: each token's weight in the representation (a MAP model's `probe_weights`); by
  default the class token's row of the rollout (`class_token`), or without one (GAP: the
  representation is the mean of the patch tokens) the mean of the patches' rows.
  """
  if pooled is None:
    rows = rollout[:, 0] if class_token else rollout[:, num_prefix_tokens:].mean(axis=1)
  else:
    rows = pooled @ rollout
  return rows[:, num_prefix_tokens:].reshape(len(rows), *_grid(rows.shape[-1] - num_prefix_tokens))


def _grid(num_patches: int) -> tuple[int, int]:
  side = math.isqrt(num_patches)
  if side * side != num_patches:
    raise ValueError(
        f'{num_patches} patches are not a square grid: only square images are supported'
    )
  return side, side


def patch_distances(grid: tuple[int, int], patch_pixels: float) -> np.ndarray:
  """[patches, patches] distances in pixels between the patch centres of a grid (row-major order)."""
  rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])
  return patch_pixels * np.hypot(rows[:, None] - rows[None], cols[:, None] - cols[None])


def mean_attention_distance(
    attention: np.ndarray, patch_pixels: float, num_prefix_tokens: int
) -> np.ndarray:
  """[..., heads]: for attention [..., heads, tokens, tokens], the attention-weighted mean distance in
  pixels from each query patch to the patches it attends to, averaged over the query patches."""
  patches = attention[..., num_prefix_tokens:, num_prefix_tokens:]
  # A class token has no position: the weights are renormalised over the patches.
  patches = patches / patches.sum(axis=-1, keepdims=True)
  distances = patch_distances(_grid(patches.shape[-1]), patch_pixels)
  return (patches * distances).sum(axis=-1).mean(axis=-1)


def position_similarity(pos_embedding: np.ndarray, num_prefix_tokens: int) -> np.ndarray:
  """[gh, gw, gh, gw]: cosine similarity of each patch position's embedding to every position's."""
  grid = pos_embedding.reshape(-1, pos_embedding.shape[-1])[num_prefix_tokens:]
  grid = grid / np.linalg.norm(grid, axis=-1, keepdims=True)
  gh, gw = _grid(len(grid))
  return (grid @ grid.T).reshape(gh, gw, gh, gw)


def embedding_components(kernel: np.ndarray, count: int = NUM_COMPONENTS) -> np.ndarray:
  """[count, P, P, 3]: the top principal components of the patch-embedding filters, kernel [P, P, 3, D]
  (each of the D filters is one sample of P*P*3 values)."""
  p, _, channels, features = kernel.shape
  filters = kernel.reshape(p * p * channels, features).T
  _, _, components = np.linalg.svd(filters - filters.mean(axis=0), full_matrices=False)
  return components[:count].reshape(-1, p, p, channels)


def _mosaic(tiles: np.ndarray, columns: int, gap: float) -> np.ndarray:
  """Tiles [n, h, w, ...] laid out in rows of `columns`, `gap` (e.g. NaN or white) between them."""
  n, h, w = tiles.shape[:3]
  rows = -(-n // columns)
  out = np.full((rows * (h + 1) - 1, columns * (w + 1) - 1, *tiles.shape[3:]), gap, np.float64)
  for i, tile in enumerate(tiles):
    r, c = divmod(i, columns)
    out[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = tile
  return out


def _show(ax: Any, picture: np.ndarray, title: str, **kwargs: Any) -> None:
  ax.imshow(picture, **kwargs)
  ax.set_title(title, fontsize=9)
  ax.axis('off')


def attended(image: np.ndarray, heat: np.ndarray) -> np.ndarray:
  """The image (uint8 [h, w, 3]) times the map [gh, gw] resized to it and scaled to a maximum of 1:
  what the model looks at stays, the rest fades to black (as the paper's Figure 6)."""
  mask = jax.image.resize(jnp.asarray(heat / heat.max(), jnp.float32), image.shape[:2], 'bilinear')
  return np.clip(image / 255 * np.asarray(mask)[..., None], 0, 1)


def _save(fig: Any, path: str) -> str:
  """Writes `fig` as a PNG to `path`, local or on cloud storage (matplotlib writes only local files)."""
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100, bbox_inches='tight')
  plt.close(fig)
  epath.Path(path).write_bytes(png.getvalue())
  return path


def plot_rollout(image: np.ndarray, maps: np.ndarray, query: str, path: str) -> str:
  fig, (left, middle, right) = plt.subplots(1, 3, figsize=(8, 3.2))
  _show(left, image, 'input')
  _show(
      middle,
      maps[-1] / maps[-1].max(),
      f'rollout through all {len(maps)} layers',
      cmap='inferno',
      vmin=0,
      vmax=1,
  )
  _show(right, attended(image, maps[-1]), 'input x rollout')
  fig.suptitle(f'Attention rollout: {query}', fontsize=10)
  return _save(fig, path)


def plot_rollout_layers(image: np.ndarray, maps: np.ndarray, query: str, path: str) -> str:
  fig, axes = plt.subplots(1, len(maps), figsize=(2.2 * len(maps), 2.6), squeeze=False)
  for i, (ax, heat) in enumerate(zip(axes[0], maps)):
    title = 'layer 1' if i == 0 else f'layers 1-{i + 1}'
    _show(ax, attended(image, heat), title + (' (joint)' if i == len(maps) - 1 else ''))
  fig.suptitle(f'Attention rollout up to each layer: {query}', fontsize=10)
  return _save(fig, path)


def plot_position_similarity(similarity: np.ndarray, path: str) -> str:
  gh, gw = similarity.shape[:2]
  fig, ax = plt.subplots(figsize=(6, 5.4))
  image = ax.imshow(
      _mosaic(similarity.reshape(gh * gw, gh, gw), gw, np.nan), cmap='viridis', vmin=-1, vmax=1
  )
  ax.set_xticks([(gw + 1) * c + (gw - 1) / 2 for c in range(gw)], range(1, gw + 1))
  ax.set_yticks([(gh + 1) * r + (gh - 1) / 2 for r in range(gh)], range(1, gh + 1))
  ax.set_xlabel('input patch column')
  ax.set_ylabel('input patch row')
  fig.colorbar(image, ax=ax, label='cosine similarity')
  ax.set_title('Position embedding similarity', fontsize=10)
  return _save(fig, path)


def plot_embedding_components(components: np.ndarray, path: str) -> str:
  low = components.min(axis=(1, 2, 3), keepdims=True)
  high = components.max(axis=(1, 2, 3), keepdims=True)
  tiles = (components - low) / np.maximum(high - low, 1e-12)  # Each component's own range, as RGB.
  fig, ax = plt.subplots(figsize=(6, 3.8))
  ax.imshow(_mosaic(tiles, 7, 1.0))
  ax.axis('off')
  ax.set_title(f'RGB embedding filters (first {len(components)} principal components)', fontsize=10)
  return _save(fig, path)


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
  return _save(fig, path)


def _join(directory: str, name: str) -> str:
  return str(epath.Path(directory) / name)


def seen_part(
    image: np.ndarray, image_size: int, pp_eval: Mapping[str, Any] = predict.DEFAULT_PP_EVAL
) -> np.ndarray:
  """The part of `image` (uint8 [h, w, 3]) that the eval crop `pp_eval` makes the model input: the
  central square of 'central' (to the pixel: preprocess.central_crop's arithmetic, in the image's own
  pixels), all of it for 'resize' (which squeezes it to the square the maps cover)."""
  pp_eval = {**predict.DEFAULT_PP_EVAL, **pp_eval}
  if pp_eval['crop'] != 'central':
    return image
  shape = np.array(image.shape[:2], np.float64)
  # The shorter side resized to `target` (the longer one's proportion rounded down), then the central
  # image_size square of that, its offset rounded half to even (torchvision's geometry).
  target = round(image_size / pp_eval['crop_fraction'])
  h, w = image.shape[:2]
  longer = int(target * max(h, w) / min(h, w))
  scaled = np.array((longer, target) if h > w else (target, longer), np.float64)
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
    pp_eval: Mapping[str, Any] = predict.DEFAULT_PP_EVAL,
) -> list[str]:
  """Writes the pictures for `image` (uint8 [h, w, 3]), prepared by the eval crop `pp_eval`, to `out`
  (five; four for fixed position embeddings); returns their paths."""
  cli.make_out_dir(out)
  prefix = model.num_prefix_tokens  # The class token and registers, if any.
  query = {
      'token': 'from the class token',
      'gap': 'mean over tokens (GAP model: no class token)',
      'map': "weighted by the MAP head's attention (no class token)",
  }[model.classifier]
  inputs = predict.model_input(image, image_size, pp_eval)[None]
  attention = attention_weights(model, params, inputs)[:, 0]
  tokens = (
      prefix + (image_size // model.input_stride) ** 2
  )  # The model takes only sizes it divides.
  chex.assert_shape(attention, (model.num_layers, model.num_heads, tokens, tokens))
  # MAP pools with its probe's attention: the rollout's rows weighted by it, not their mean.
  pooled = probe_weights(model, params, inputs)[0] if model.classifier == 'map' else None
  maps = rollout_maps(attention_rollout(attention), prefix, model.classifier == 'token', pooled)
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
            position_similarity(
                np.asarray(params['Transformer']['posembed_input']['pos_embedding']), prefix
            ),
            _join(out, 'position_embeddings.png'),
        )
    )
  if kernel.shape[2] == 3:  # A hybrid's patch embedding reads ResNet features, not pixels.
    pictures.append(
        plot_embedding_components(embedding_components(kernel), _join(out, 'embedding_filters.png'))
    )
  distances = mean_attention_distance(attention, model.input_stride, prefix)
  pictures.append(
      plot_attention_distance(distances, image_size, _join(out, 'attention_distance.png'))
  )
  return pictures


def draw_run(workdir: str, image_path: str, out: str, step: Optional[int] = None) -> list[str]:
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
  image = predict.read_image(image_path)
  return write_pictures(
      run.model, run.params, image, run.config.image_size, out, run.config.pp_eval.to_dict()
  )


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run to draw.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
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
