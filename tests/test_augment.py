"""Tests of the train augmentations and the eval crop of vit_jax.data.preprocess, against PIL,
torchvision and timm."""
import itertools
import random

import numpy as np
from PIL import Image, ImageOps
import pytest
from scipy import optimize, stats
import tensorflow as tf
import timm.data.random_erasing
import torch
import torchvision.transforms.functional as TF

import helpers
from vit_jax import data
from vit_jax import defaults
from vit_jax.data import augment
from vit_jax.data import preprocess

torch.set_num_threads(1)  # Beside TensorFlow's threads, more make small ops 100x slower.


def random_image(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def seeds_dataset(fn, n: int) -> tf.data.Dataset:
  """One batch of fn(seed) for seeds [i, 7], i < n, mapped in parallel as in the input pipeline."""
  ds = tf.data.Dataset.range(n).map(lambda i: fn(tf.stack([i, tf.constant(7, tf.int64)])),
                                    num_parallel_calls=tf.data.AUTOTUNE)
  return ds.batch(n)


def over_seeds(fn, n: int) -> np.ndarray:
  return next(iter(seeds_dataset(fn, n))).numpy()


def torch_chw(image: np.ndarray) -> torch.Tensor:
  return torch.from_numpy(np.ascontiguousarray(image, np.float32).transpose(2, 0, 1))


def numpy_hwc(image: torch.Tensor) -> np.ndarray:
  return image.numpy().transpose(1, 2, 0)


def pp_config(**overrides):
  pp = defaults.get_config().pp
  pp.update(overrides)
  return pp


# Seeds: the defaults are today's crop, flip and normalize.

@pytest.mark.parametrize('crop', list(preprocess.CROPS))
def test_default_train_preprocess_is_bit_identical_to_crop_flip_normalize(crop):
  pp = pp_config(crop=crop, pad=3)
  image = tf.constant(random_image((20, 26, 3)))
  for i in range(6):
    seed = tf.constant([i, 3], tf.int64)
    # The code before the augmentations: two split seeds, the crop's and the flip's.
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    expected = preprocess.CROPS[crop].apply(image, crop_seed, pp, 16)
    expected = tf.image.stateless_random_flip_left_right(expected, flip_seed) / 127.5 - 1
    got = preprocess.train_preprocess(image, seed, pp=pp, image_size=16)
    np.testing.assert_array_equal(got.numpy(), expected.numpy())


def test_all_ops_are_stateless_in_tf_data():
  pp = pp_config(randaug_layers=2, three_augment=True, color_jitter=0.4, erase_prob=0.5)
  image = tf.constant(random_image((20, 26, 3)))
  ds = seeds_dataset(lambda s: preprocess.train_preprocess(image, s, pp=pp, image_size=16), 24)
  first, second = (next(iter(ds)).numpy() for _ in range(2))
  np.testing.assert_array_equal(first, second)
  np.testing.assert_allclose(
      first[5], preprocess.train_preprocess(image, tf.constant([5, 7], tf.int64), pp=pp,
                                            image_size=16).numpy(), atol=1e-4)
  assert len({x.tobytes() for x in first}) == 24


# 3-Augment.

def test_grayscale_matches_torchvision_and_pil():
  image = random_image((12, 14, 3))
  got = augment.grayscale(tf.constant(image, tf.float32)).numpy()
  np.testing.assert_allclose(got, numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3)), atol=1e-3)
  pil = np.asarray(Image.fromarray(image).convert('L'), np.float32)
  np.testing.assert_allclose(got, np.repeat(pil[..., None], 3, -1), atol=0.55)  # PIL rounds.


def test_solarize_matches_pil():
  image = random_image((12, 14, 3))
  got = augment.solarize(tf.constant(image, tf.float32)).numpy()
  np.testing.assert_array_equal(got, np.asarray(ImageOps.solarize(Image.fromarray(image))))


def torchvision_blur(image: np.ndarray, sigma: float) -> np.ndarray:
  """torchvision's blur with timm's kernel size for 3-Augment-style blurs."""
  return numpy_hwc(TF.gaussian_blur(torch_chw(image), [23, 23], [sigma, sigma]))


@pytest.mark.parametrize('sigma', [0.1, 0.7, 2.0])
def test_gaussian_blur_matches_torchvision(sigma):
  image = random_image((24, 26, 3)).astype(np.float32)
  got = augment.gaussian_blur(tf.constant(image), sigma, 23).numpy()
  np.testing.assert_allclose(got, torchvision_blur(image, sigma), atol=1e-3)


def test_three_augment_picks_each_branch_a_third_and_blurs_with_sigma_in_range():
  image = random_image((24, 24, 3)).astype(np.float32)
  outputs = over_seeds(lambda s: augment.three_augment(tf.constant(image), s), 300)
  grey = numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3))
  solarized = np.asarray(ImageOps.solarize(Image.fromarray(image.astype(np.uint8))), np.float32)
  is_grey = [np.allclose(x, grey, atol=1e-3) for x in outputs]
  is_solarized = [np.array_equal(x, solarized) for x in outputs]
  blurred = [x for x, g, s in zip(outputs, is_grey, is_solarized) if not (g or s)]
  for count in (sum(is_grey), sum(is_solarized), len(blurred)):
    assert 70 <= count <= 130  # 100 expected; 3.6 standard deviations.
  sigmas = []
  for x in blurred[:40]:
    fit = optimize.minimize_scalar(lambda s: np.abs(torchvision_blur(image, s) - x).max(),
                                   bounds=(0.01, 3.0), method='bounded',
                                   options=dict(xatol=1e-5))
    assert fit.fun < 0.01
    sigmas.append(fit.x)
  assert 0.1 - 1e-3 <= min(sigmas) < 0.4 and 1.7 < max(sigmas) <= 2.0 + 1e-3


# Colour jitter.

ADJUSTMENTS = [(augment.adjust_brightness, TF.adjust_brightness),
               (augment.adjust_contrast, TF.adjust_contrast),
               (augment.adjust_saturation, TF.adjust_saturation)]


def torchvision_jitter(image: np.ndarray, factors, order) -> np.ndarray:
  """torchvision's adjustments of float images in [0, 1], on [0, 255]."""
  x = torch_chw(image) / 255
  for i in order:
    x = ADJUSTMENTS[i][1](x, float(factors[i]))
  return numpy_hwc(x) * 255


@pytest.mark.parametrize('index', range(3))
@pytest.mark.parametrize('factor', [0.0, 0.6, 1.0, 1.7])
def test_color_adjustment_matches_torchvision(index, factor):
  image = random_image((10, 12, 3))
  got = ADJUSTMENTS[index][0](tf.constant(image, tf.float32), factor).numpy()
  np.testing.assert_allclose(got, torchvision_jitter(image, {index: factor}, [index]), atol=1e-3)


def test_jitter_colors_applies_in_the_given_order():
  image = random_image((10, 12, 3))
  factors = np.float32([1.6, 0.4, 1.9])  # Strong enough to clip, so the order matters.
  outputs = set()
  for order in itertools.permutations(range(3)):
    got = augment.jitter_colors(tf.constant(image, tf.float32), tf.constant(factors),
                                   tf.constant(order)).numpy()
    np.testing.assert_allclose(got, torchvision_jitter(image, factors, order), atol=1e-3)
    outputs.add(np.round(got, 2).tobytes())
  assert len(outputs) > 1


def test_color_jitter_factors_are_uniform_in_range():
  # Mid-range colours do not clip: the three adjustments are then linear in the image, the pixel's
  # luma and the mean luma, and the three factors can be read back from the output.
  image = np.random.default_rng(0).uniform(70, 120, (8, 8, 3)).astype(np.float32)
  outputs = over_seeds(lambda s: augment.color_jitter(tf.constant(image), s, 0.4), 300)
  luma = numpy_hwc(TF.rgb_to_grayscale(torch_chw(image), 3))
  design = np.stack([image.ravel(), luma.ravel(), np.ones(image.size)], axis=1)
  factors = []
  for x in outputs:
    (a, b, k), *_ = np.linalg.lstsq(design, x.ravel(), rcond=None)
    brightness = a + b + k / luma.mean()
    factors.append((brightness, (a + b) / brightness, a / (a + b)))
  factors = np.array(factors)
  assert factors.min() > 0.6 - 1e-3 and factors.max() < 1.4 + 1e-3
  np.testing.assert_allclose(factors.mean(0), 1.0, atol=0.04)
  np.testing.assert_allclose(factors.std(0), 0.8 / np.sqrt(12), rtol=0.15)


# Random erasing.

def boxes_of(erased: np.ndarray) -> list[tuple[int, int]]:
  """(height, width) of each erased image's box; asserts the erased pixels form one rectangle."""
  boxes = []
  for mask in erased:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if rows.size:
      assert mask[rows[0]:rows[-1] + 1, cols[0]:cols[-1] + 1].all()
      assert mask.sum() == rows.size * cols.size
      boxes.append((rows.size, cols.size))
  return boxes


def test_random_erasing_matches_timm():
  size, prob, area, aspect, n = 40, 0.6, (0.02, 1 / 3), (0.3, 1 / 0.3), 2000
  ours = over_seeds(lambda s: augment.random_erase(tf.zeros([size, size, 3]), s, prob, area,
                                                      aspect), n) != 0
  erase = timm.data.random_erasing.RandomErasing(prob, area[0], area[1], aspect[0], aspect[1],
                                                 mode='pixel', device='cpu')
  random.seed(0)
  torch.manual_seed(0)
  theirs = np.stack([numpy_hwc(erase(torch.zeros(3, size, size))) for _ in range(n)]) != 0
  assert (ours.all(-1) == ours.any(-1)).all()  # Every channel of an erased pixel.
  stats = []
  for erased in (ours[..., 0], theirs[..., 0]):
    boxes = np.array(boxes_of(erased), np.float64)
    h, w = boxes.T
    # Rounding each side to whole pixels moves the box by half a pixel at most.
    assert ((h + 0.5) * (w + 0.5) >= area[0] * size**2).all()
    assert ((h - 0.5) * (w - 0.5) <= area[1] * size**2).all()
    assert ((h + 0.5) / (w - 0.5) >= aspect[0]).all() and ((h - 0.5) / (w + 0.5) <= aspect[1]).all()
    log_aspect = np.log(h / w)
    stats.append([len(boxes) / n, (h * w).mean() / size**2, log_aspect.mean(), log_aspect.std(),
                  *np.histogram(log_aspect, bins=4, range=np.log(aspect))[0] / len(boxes)])
  ours_stats, timm_stats = stats
  assert abs(ours_stats[0] - prob) < 0.04
  # Erased share, mean area fraction, log-aspect mean and std, log-aspect histogram: each about
  # 3 standard errors of the difference.
  tolerance = [0.05, 0.02, 0.1, 0.05] + [0.06] * 4
  assert (np.abs(np.subtract(ours_stats, timm_stats)) <= tolerance).all(), (ours_stats, timm_stats)


def box_corners(erased: np.ndarray) -> np.ndarray:
  """(top, left, height, width) of each erased image's box, of the erased images only."""
  corners = []
  for mask in erased:
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    if rows.size:
      corners.append((rows[0], cols[0], rows.size, cols.size))
  return np.array(corners)


@pytest.mark.parametrize('height,width,area,aspect', [
    (13, 31, (0.02, 1 / 3), (0.3, 1 / 0.3)),  # timm's defaults on a wide image.
    # Large boxes, mostly tall (a range not symmetric in log: height and width swapped would show),
    # many of which do not fit.
    (31, 13, (0.3, 0.9), (0.5, 4.0)),
])
def test_random_erasing_boxes_and_positions_match_timm_on_non_square_images(height, width, area,
                                                                            aspect):
  prob, n = 0.7, 1500
  ours = over_seeds(lambda s: augment.random_erase(tf.zeros([height, width, 1]), s, prob, area,
                                                      aspect), n)[..., 0] != 0
  erase = timm.data.random_erasing.RandomErasing(prob, area[0], area[1], aspect[0], aspect[1],
                                                 mode='pixel', device='cpu')
  random.seed(0)
  torch.manual_seed(0)
  theirs = np.stack([erase(torch.zeros(1, height, width))[0].numpy() for _ in range(n)]) != 0
  ours, theirs = box_corners(ours), box_corners(theirs)
  assert abs(len(ours) - len(theirs)) / n < 0.05  # About 3 standard errors of the difference.
  for column in range(4):  # Top, left, height, width: each distributed as timm's.
    assert stats.ks_2samp(ours[:, column], theirs[:, column]).pvalue > 1e-3, column


def test_random_erasing_fills_normal_noise_and_keeps_the_rest():
  image = random_image((24, 20, 3)).astype(np.float32) / 127.5 - 1
  outputs = over_seeds(lambda s: augment.random_erase(tf.constant(image), s, 1.0, (0.1, 0.3),
                                                         (0.5, 2.0)), 200)
  erased = outputs != image
  assert len(boxes_of(erased.any(-1))) == 200
  np.testing.assert_array_equal(outputs[~erased], np.broadcast_to(image, outputs.shape)[~erased])
  noise = outputs[erased]
  assert abs(noise.mean()) < 0.02 and abs(noise.std() - 1) < 0.02
  # Every box fits here, so the log aspect ratios are uniform (up to whole-pixel sides).
  h, w = np.array(boxes_of(erased.any(-1))).T
  histogram = np.histogram(np.log(h / w), bins=4, range=np.log([0.5, 2.0]))[0] / 200
  np.testing.assert_allclose(histogram, 0.25, atol=0.1)


def test_train_preprocess_erases_after_normalize():
  image = tf.constant(random_image((20, 26, 3)))
  pp = pp_config(crop='resize', flip=False, erase_prob=1.0)
  got = over_seeds(lambda s: preprocess.train_preprocess(image, s, pp=pp, image_size=16), 20)
  clean = preprocess.normalize(preprocess.resize(image, 16)).numpy()
  erased = got != clean
  assert erased.any(axis=(1, 2, 3)).all()
  assert np.abs(got[erased]).max() > 2  # N(0, 1) noise in the normalised space.


# Eval crop.

@pytest.mark.parametrize('shape,rows,cols', [((256, 320), (16, 240), (48, 272)),
                                             ((320, 256), (48, 272), (16, 240))])
def test_central_crop_of_the_shorter_side_256_is_its_central_224(shape, rows, cols):
  image = random_image((*shape, 3))
  pp_eval = defaults.get_config().pp_eval
  pp_eval.crop = 'central'
  got = preprocess.eval_preprocess(tf.constant(image), pp_eval=pp_eval, image_size=224).numpy()
  expected = image[rows[0]:rows[1], cols[0]:cols[1]].astype(np.float32) / np.float32(127.5) - 1
  np.testing.assert_array_equal(got, expected)


def pil_central_crop(image: np.ndarray, size: int, crop_fraction: float) -> np.ndarray:
  """PIL's bilinear resize of the shorter side to size / crop_fraction, then the central square."""
  target = round(size / crop_fraction)
  h, w = image.shape[:2]
  new_h, new_w = round(h * target / min(h, w)), round(w * target / min(h, w))
  resized = np.stack([np.asarray(Image.fromarray(image[..., c]).resize((new_w, new_h),
                                                                       Image.BILINEAR))
                      for c in range(3)], -1)
  top, left = (new_h - size) // 2, (new_w - size) // 2
  return resized[top:top + size, left:left + size]


def smooth_image(shape) -> np.ndarray:
  """A random image without detail at the pixel scale, where filters without antialiasing agree."""
  coarse = np.random.default_rng(0).uniform(0, 255, (shape[0] // 8, shape[1] // 8, 3))
  return tf.image.resize(coarse, shape, method='bicubic').numpy().clip(0, 255).astype(np.float32)


@pytest.mark.parametrize('shape,size,crop_fraction,mean_diff,max_diff', [
    ((20, 30), 16, 0.5, 1e-4, 1e-3),  # Upscaling: both are plain bilinear interpolation.
    ((120, 96), 56, 0.875, 1.0, 4.0),  # Downscaling by 1.5: PIL also antialiases.
])
def test_central_crop_matches_pil(shape, size, crop_fraction, mean_diff, max_diff):
  image = smooth_image(shape)
  got = preprocess.central_crop(tf.constant(image), size, crop_fraction).numpy()
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
