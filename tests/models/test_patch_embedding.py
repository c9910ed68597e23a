"""The patch embedding (models/patch_embedding.py) and its resampling to another patch size (FlexiViT's
pseudo-inverse resize, checkpoints/patch_resizing.py): nn.Conv's parameters and numbers, the resize's
defining property on resized images, and a model resampling its stored kernel as it runs equal to
the model of host-resampled parameters. timm's resample_patch_embed: test_interop_vs_torch.py."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import adapting, patch_resizing
from vit_jax.models import VisionTransformer, patch_embedding, posemb, variants


def _images(n: int, size: int, seed: int = 0) -> np.ndarray:
  return np.random.RandomState(seed).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('use_bias', [True, False])
def test_the_patch_embedding_is_flaxs_strided_convolution(dtype, use_bias):
  """The same parameters drawn from the same key, and the same numbers, bit for bit."""
  images = _images(2, 16)
  conv = nn.Conv(8, (4, 4), strides=(4, 4), padding='VALID', use_bias=use_bias, dtype=dtype)
  ours = patch_embedding.PatchEmbedding(4, 8, use_bias=use_bias, dtype=dtype)
  params = conv.init(jax.random.key(0), images)
  jax.tree.map(np.testing.assert_array_equal, ours.init(jax.random.key(0), images), params)
  if use_bias:
    params = {'params': {**params['params'], 'bias': jnp.linspace(-1, 1, 8)}}
  expected = conv.apply(params, images)
  got = ours.apply(params, images)
  assert got.dtype == expected.dtype
  np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))


# Growing, the antialiased resizes are the others: jax.image.resize computes them all.
@pytest.mark.parametrize(
    'method,resize',
    [('bilinear', 'linear'), ('bicubic', 'cubic'), ('bilinear_antialiased', 'linear')],
)
@pytest.mark.parametrize('old,new', [(4, 8), (3, 7), (4, 12)])
def test_a_kernel_resampled_up_embeds_the_resized_image_as_the_old_kernel_the_image(
    method, resize, old, new
):
  """FlexiViT's <R x, w'> = <x, w>: each patch of the images resized (by jax.image.resize, the
  resize the method names) from `old` to `new` pixels a side gives the resampled kernel's token the
  old kernel gives the patch, exactly (R has full column rank when growing). Each patch alone: a
  whole image's resize would read pixels across the patches' edges."""
  kernel = np.random.RandomState(1).randn(old, old, 3, 6).astype(np.float32)
  images = _images(2, 2 * old)
  resampled = patch_resizing.resample_kernel(kernel, (new, new), method)

  def tokens(x, k, p):
    return jax.lax.conv_general_dilated(
        x, k.astype(np.float32), (p, p), 'VALID', dimension_numbers=('NHWC', 'HWIO', 'NHWC')
    )

  patches = (
      images.reshape(2, 2, old, 2, old, 3).transpose(0, 1, 3, 2, 4, 5).reshape(-1, old, old, 3)
  )
  patches = jax.image.resize(patches, (len(patches), new, new, 3), resize)
  np.testing.assert_allclose(
      tokens(patches, resampled, new).reshape(2, 2, 2, 6),
      tokens(images, kernel, old),
      atol=1e-4,
  )


def test_a_kernel_resampled_down_is_the_least_squares_one():
  """Shrinking (8 -> 4 taps), no kernel gives every resized patch its token: the resampled one
  minimises the error over all patches, so it is no worse than the plainly resized kernel."""
  kernel = np.random.RandomState(2).randn(8, 8, 3, 1)
  resampled = patch_resizing.resample_kernel(kernel, (4, 4), 'bilinear_antialiased')
  patches = np.random.RandomState(3).randn(4000, 8, 8, 3)
  small = np.asarray(jax.image.resize(patches.astype(np.float32), (4000, 4, 4, 3), 'linear'))
  target = np.einsum('nhwc,hwc->n', patches, kernel[..., 0])

  def error(k):
    return np.mean((np.einsum('nhwc,hwc->n', small, k[..., 0]) - target) ** 2)

  plain = np.asarray(jax.image.resize(kernel, (4, 4, 3, 1), 'linear')) * 4  # Sum-preserving.
  assert error(resampled) < error(plain)
  # The least-squares solution over random patches, up to sampling: close to pinv's.
  fitted = np.linalg.lstsq(small.reshape(4000, -1), target, rcond=None)[0].reshape(4, 4, 3, 1)
  assert error(resampled) < 1.05 * error(fitted)


def _model(**overrides) -> VisionTransformer:
  return VisionTransformer(num_classes=5, **variants.get_model_config('ViT-testing_4', overrides))


@pytest.mark.parametrize('method', patch_resizing.PATCH_METHODS)
@pytest.mark.parametrize('patch_size,image_size', [(2, 8), (8, 16), (3, 12)])
def test_resampled_as_it_runs_the_model_computes_what_resampled_parameters_compute(
    method, patch_size, image_size
):
  """Parameters of patch 4 at 8 px; the model of `patch_size` on `image_size` px images resamples
  the kernel (and fits the position embeddings to its grid) as it runs, as adapt_params does once.
  """
  loaded = helpers.random_params(_model(), 8)
  model = _model(patch_size=patch_size)
  images = _images(3, image_size)
  with posemb.fitted_to_grid('bilinear'), patch_embedding.resampled_patches(method):
    fitted = jax.jit(lambda p, x: model.apply({'params': p}, x))(loaded, images)
  resampled, notes = adapting.adapt_params(
      loaded,
      adapting.param_shapes(model, image_size),
      keep_head=True,
      keep_pre_logits=False,
      patch_method=method,
  )
  assert f'resampled the patch embedding 4x4 -> {patch_size}x{patch_size} pixels' in notes[-1]
  np.testing.assert_allclose(fitted, model.apply({'params': resampled}, images), atol=2e-5)
  assert np.abs(fitted).max() > 0.1
  with pytest.raises(
      ValueError, match=r'the patch embedding \(4, 4, 3, 32\) is for patches of 4x4'
  ):
    with posemb.fitted_to_grid('bilinear'):
      model.apply({'params': loaded}, images)  # Outside resampled_patches.


def test_an_unknown_patch_interpolation_is_a_one_line_error():
  with pytest.raises(ValueError, match=r"^Unknown config.patch_interpolation 'area'.*=bilinear$"):
    with patch_embedding.resampled_patches('area'):
      pass
  loaded = helpers.random_params(_model(), 8)
  with pytest.raises(ValueError, match="Unknown config.patch_interpolation 'nearest'"):
    adapting.adapt_params(
        loaded,
        adapting.param_shapes(_model(), 8),
        keep_head=True,
        keep_pre_logits=False,
        patch_method='nearest',
    )
