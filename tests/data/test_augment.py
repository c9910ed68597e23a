"""Tests of the train augmentations of vit_jax.data.preprocess and the eval crop of
vit_jax.data.crops, against PIL, torchvision and timm."""

import numpy as np
from PIL import Image, ImageOps
import pytest

import helpers
from vit_jax import data
from vit_jax import defaults
from vit_jax.data import augment
from vit_jax.data import crops
from vit_jax.data import images
from vit_jax.data import preprocess
from vit_jax.data import train_ops


def random_image(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def over_seeds(fn, n: int) -> np.ndarray:
  """fn(rng) for the generators of seeds [i, 7], i < n, stacked."""
  return np.stack([fn(np.random.default_rng([i, 7])) for i in range(n)])


def pp_config(**overrides):
  pp = defaults.get_config().pp
  pp.update(overrides)
  return pp


def assert_float32_like(got: np.ndarray, image: np.ndarray) -> None:
  assert got.dtype == np.float32 and got.shape == image.shape and got.flags.c_contiguous


# The chain: op i draws from its own generator, and the defaults are crop, flip and normalize.


@pytest.mark.parametrize('crop', list(train_ops.CROPS))
def test_default_train_preprocess_is_crop_flip_normalize(crop):
  pp = pp_config(crop=crop, pad=3)
  image = random_image((20, 26, 3))
  flips = set()
  for i in range(12):
    seed = (i, 3)
    cropped = train_ops.CROPS[crop].apply(image, np.random.default_rng([*seed, 0]), pp, 16)
    got = preprocess.model_input(preprocess.train_preprocess(image, seed, pp=pp, image_size=16))
    flipped = not np.array_equal(got, images.normalize(cropped))
    if flipped:
      np.testing.assert_array_equal(got, images.normalize(cropped[:, ::-1]))
    flips.add(flipped)
  assert flips == {False, True}


def test_an_op_that_is_off_makes_no_generator(monkeypatch):
  image = random_image((20, 26, 3))
  made = []
  seeded = np.random.default_rng

  def default_rng(seed):
    made.append(seed[-1])  # The op's position.
    return seeded(seed)

  monkeypatch.setattr(np.random, 'default_rng', default_rng)
  preprocess.train_preprocess(image, (0, 5), pp=pp_config(flip=False), image_size=16)
  assert made == [0]  # The crop's.
  made.clear()
  preprocess.train_preprocess(
      image, (0, 5), pp=pp_config(flip=True, color_jitter=0.4), image_size=16
  )
  assert made == [0, 1, 4, 5]  # Crop, flip, colour jitter, normalize: each op's own stream.


def test_train_preprocess_applies_op_i_with_generator_seed_i():
  pp = pp_config(randaug_layers=2, three_augment=True, color_jitter=0.4, erase_prob=0.5)
  image = random_image((20, 26, 3))
  for seed in [(0, 5), (7, 1)]:
    want = image
    for i, op in enumerate((train_ops.CROPS[pp.crop], *train_ops.AUGMENTS)):
      if op.on(pp):
        want = op.apply(want, np.random.default_rng([*seed, i]), pp, 16)
    got = preprocess.train_preprocess(image, seed, pp=pp, image_size=16)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(
        preprocess.train_preprocess(image, seed, pp=pp, image_size=16), got
    )
    assert_float32_like(got, np.zeros((16, 16, 3)))
  distinct = {
      preprocess.train_preprocess(image, (i, 7), pp=pp, image_size=16).tobytes() for i in range(24)
  }
  assert len(distinct) == 24


# 3-Augment.


def test_solarize_matches_pil():
  image = random_image((12, 14, 3))
  got = augment.solarize(image.astype(np.float32))
  assert_float32_like(got, image)
  np.testing.assert_array_equal(got, np.asarray(ImageOps.solarize(Image.fromarray(image))))


def test_solarize_of_float_pixels_inverts_from_128_exactly():
  image = np.random.default_rng(0).uniform(0, 255, (9, 11, 3)).astype(np.float32)
  image[0, :6, 0] = [127.5, 127.99, 128, 128.01, 0, 255]
  got = augment.solarize(image[:, ::-1])  # A view with negative strides, as a flip leaves.
  assert_float32_like(got, image)
  np.testing.assert_array_equal(got, np.where(image < 128, image, 255 - image)[:, ::-1])


# Colour jitter.


# Random erasing.


def boxes_of(erased: np.ndarray) -> list[tuple[int, int]]:
  """(height, width) of each erased image's box; asserts the erased pixels form one rectangle."""
  boxes = []
  for mask in erased:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if rows.size:
      assert mask[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1].all()
      assert mask.sum() == rows.size * cols.size
      boxes.append((rows.size, cols.size))
  return boxes


def test_random_erasing_fills_normal_noise_and_keeps_the_rest():
  image = random_image((24, 20, 3)).astype(np.float32) / 127.5 - 1
  outputs = over_seeds(
      lambda rng: augment.random_erase(image, rng, 1.0, (0.1, 0.3), (0.5, 2.0)), 200
  )
  erased = outputs != image
  assert len(boxes_of(erased.any(-1))) == 200
  np.testing.assert_array_equal(outputs[~erased], np.broadcast_to(image, outputs.shape)[~erased])
  # timm's N(0, 1) of ImageNet-normalised pixels, in [0, 1] pixels.
  noise = (outputs[erased.all(-1)] + 1) / 2
  np.testing.assert_allclose(noise.mean(0), [0.485, 0.456, 0.406], atol=0.005)
  np.testing.assert_allclose(noise.std(0), [0.229, 0.224, 0.225], atol=0.005)
  # Every box fits here, so the log aspect ratios are uniform (up to whole-pixel sides).
  h, w = np.array(boxes_of(erased.any(-1))).T
  histogram = np.histogram(np.log(h / w), bins=4, range=np.log([0.5, 2.0]))[0] / 200
  np.testing.assert_allclose(histogram, 0.25, atol=0.1)
  for x in outputs:
    assert_float32_like(x, image)
  assert (image == random_image((24, 20, 3)).astype(np.float32) / 127.5 - 1).all()  # Not written.


def test_train_preprocess_erases_after_normalize():
  image = random_image((20, 26, 3))
  pp = pp_config(crop='resize', flip=False, erase_prob=1.0)
  got = np.stack(
      [preprocess.train_preprocess(image, (i, 7), pp=pp, image_size=16) for i in range(20)]
  )
  clean = preprocess.train_preprocess(
      image, (0, 7), pp=pp_config(crop='resize', flip=False), image_size=16
  )
  erased = got != clean
  assert erased.any(axis=(1, 2, 3)).all()
  # Noise, not a normalised pixel: below -1 or above 1 somewhere.
  assert np.abs(got[erased]).max() > 1


# Eval crop.


@pytest.mark.parametrize(
    'shape,rows,cols', [((256, 320), (16, 240), (48, 272)), ((320, 256), (48, 272), (16, 240))]
)
@pytest.mark.parametrize('antialias', [False, True])
def test_central_crop_of_the_shorter_side_256_is_its_central_224(shape, rows, cols, antialias):
  image = random_image((*shape, 3))
  pp_eval = defaults.get_config().pp_eval
  pp_eval.update(dict(crop='central', antialias=antialias))
  got = preprocess.model_input(preprocess.eval_preprocess(image, pp_eval=pp_eval, image_size=224))
  expected = image[rows[0] : rows[1], cols[0] : cols[1]].astype(np.float32) / np.float32(127.5) - 1
  np.testing.assert_array_equal(got, expected)


def pil_resize(
    image: np.ndarray, height: int, width: int, resample=Image.Resampling.BILINEAR
) -> np.ndarray:
  """PIL's resize of float [h, w, 3], each channel in mode 'F'."""
  return np.stack(
      [
          np.asarray(Image.fromarray(np.float32(image[..., c])).resize((width, height), resample))
          for c in range(image.shape[-1])
      ],
      -1,
  )


def pil_central_crop(image: np.ndarray, size: int, crop_fraction: float) -> np.ndarray:
  """PIL's bilinear resize of the shorter side to size / crop_fraction, then the central square."""
  target = int(size / crop_fraction)
  h, w = image.shape[:2]
  new_h, new_w = round(h * target / min(h, w)), round(w * target / min(h, w))
  resized = pil_resize(image, new_h, new_w)
  top, left = (new_h - size) // 2, (new_w - size) // 2
  return resized[top : top + size, left : left + size]


def smooth_image(shape) -> np.ndarray:
  """A random image without detail at the pixel scale, where filters without antialiasing agree."""
  coarse = np.random.default_rng(0).uniform(0, 255, (shape[0] // 8, shape[1] // 8, 3))
  return pil_resize(coarse, *shape, resample=Image.Resampling.BICUBIC).clip(0, 255)


@pytest.mark.parametrize(
    'shape,size,crop_fraction,antialias,mean_diff,max_diff',
    [
        ((20, 30), 16, 0.5, False, 1e-4, 1e-3),  # Upscaling: both are plain bilinear interpolation.
        ((120, 96), 56, 0.875, False, 1.0, 4.0),  # Downscaling by 1.5: PIL also antialiases.
        ((20, 30), 16, 0.5, True, 1e-4, 1e-3),
        ((120, 96), 56, 0.875, True, 1e-4, 1e-3),  # PIL's filter.
    ],
)
def test_central_crop_matches_pil(shape, size, crop_fraction, antialias, mean_diff, max_diff):
  image = smooth_image(shape)
  got = crops.central_crop(image, size, crop_fraction, antialias)
  assert got.shape == (size, size, 3)
  diff = np.abs(got - pil_central_crop(image, size, crop_fraction))
  assert diff.mean() < mean_diff and diff.max() < max_diff


def test_eval_iterator_uses_the_eval_crop(data_dir):
  def first_batch(crop):
    config = helpers.data_config(data_dir)
    config.pp_eval.update(dict(crop=crop, crop_fraction=0.5))
    return next(data.eval_iterator(config, 'test', local_batch_size=16))['image']

  native = helpers.as_uint8(first_batch('resize'))  # The 8x8 digits at their size: the pixels.
  pp_eval = defaults.get_config().pp_eval
  pp_eval.update(dict(crop='central', crop_fraction=0.5))
  expected = [preprocess.eval_preprocess(x, pp_eval=pp_eval, image_size=8) for x in native]
  np.testing.assert_allclose(first_batch('central'), np.stack(expected), atol=1e-6)
