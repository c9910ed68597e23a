"""Tests of vit_jax.data.randaugment: each op against PIL or numpy, the magnitudes, the policy."""

import numpy as np
from PIL import Image, ImageEnhance, ImageOps
import pytest

from vit_jax.data import randaugment as ra

SHAPES = [(32, 32), (24, 40)]  # Square and not: catches swapped height / width.
FILL = (128, 128, 128)


def random_image(shape, low=0, high=256, seed=0):
  return np.random.default_rng(seed).integers(low, high, (*shape, 3), dtype=np.uint8)


def op(name, image, *args):
  return ra.OPS[name](image, *args)


def pil_op(fn, image, *args):
  return np.asarray(fn(Image.fromarray(image), *args))


def assert_nearly_equal(got, want):
  """Equal but for at most 0.5% of the values: coordinates within float error of a half pixel round
  either way in numpy and PIL (none do in these tests today)."""
  assert np.mean(got != want) <= 0.005, np.mean(got != want)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize(
    'name, pil_fn, args',
    [
        ('AutoContrast', ImageOps.autocontrast, ()),
        ('Equalize', ImageOps.equalize, ()),
        ('Invert', ImageOps.invert, ()),
        ('Posterize', ImageOps.posterize, (1,)),
        ('Posterize', ImageOps.posterize, (4,)),
        ('Solarize', ImageOps.solarize, (100,)),
        ('Solarize', ImageOps.solarize, (256,)),
    ],
)
def test_lookup_ops_equal_pil(shape, name, pil_fn, args):
  # A narrower range than [0, 255], so AutoContrast and Equalize have something to stretch.
  image = random_image(shape, 30, 200)
  np.testing.assert_array_equal(op(name, image, *args), pil_op(pil_fn, image, *args))


def test_posterize_to_zero_bits_is_black():
  # PIL refuses 0 bits; no magnitude asks for them (see test_magnitude_to_fixed_args).
  assert not op('Posterize', random_image((8, 8)), 0).any()


@pytest.mark.parametrize('magnitude', [0, 2, 5, 9, 10, 12, 15, 20])
def test_solarize_and_posterize_equal_the_tf_reference_as_tf_data_runs_it(magnitude):
  """big_vision's autoaugment.py ops, traced as tf.data traces them, with its level_to_arg's Python
  int: the threshold becomes a uint8 (256 is 0), and a shift of 8 bits is clamped to 7."""
  tf = pytest.importorskip('tensorflow')
  image = random_image((16, 24))
  level = magnitude / 10
  threshold, shift = int(level * 256), 8 - int(level * 4)
  solarized = tf.function(lambda im: tf.where(im < threshold, im, 255 - im))
  posterized = tf.function(
      lambda im: tf.bitwise.left_shift(tf.bitwise.right_shift(im, shift), shift)
  )
  rng = np.random.default_rng(0)
  for name, reference in (('Solarize', solarized), ('Posterize', posterized)):
    want = reference(tf.constant(image)).numpy()
    np.testing.assert_array_equal(op(name, image, *ra.op_args(name, magnitude, rng, image)), want)


def test_constant_channels_are_kept_as_pil_does():
  image = random_image((16, 16), 30, 200)
  image[..., 1] = 77
  for name, pil_fn in [('AutoContrast', ImageOps.autocontrast), ('Equalize', ImageOps.equalize)]:
    np.testing.assert_array_equal(op(name, image), pil_op(pil_fn, image))


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('factor', [0.1, 0.64, 1.0, 1.9, 3.7])  # 3.7: magnitude 20.
@pytest.mark.parametrize(
    'name, enhancer',
    [
        ('Color', ImageEnhance.Color),
        ('Contrast', ImageEnhance.Contrast),
        ('Brightness', ImageEnhance.Brightness),
        ('Sharpness', ImageEnhance.Sharpness),
    ],
)
def test_enhance_ops_equal_pil(shape, factor, name, enhancer):
  image = random_image(shape)
  want = pil_op(lambda im, f: enhancer(im).enhance(f), image, factor)
  np.testing.assert_array_equal(op(name, image, factor), want)


def test_contrast_blends_towards_the_mean_grey_not_pixel_count_over_256():
  """The reference's bug would use 32 * 32 / 256 = 4 as the 'mean' of this bright image."""
  image = random_image((32, 32), 150, 256)
  want = pil_op(lambda im: ImageEnhance.Contrast(im).enhance(0.1), image)
  np.testing.assert_array_equal(op('Contrast', image, 0.1), want)


# The second's sum is past float32's 2**24.
@pytest.mark.parametrize('shape', [(16, 16), (300, 300)])
def test_contrast_rounds_a_mean_ending_in_half_up_as_pil_does(shape):
  grey = np.random.default_rng(0).integers(0, 100, shape)
  count = grey.size
  grey.reshape(-1)[: (count // 2 - grey.sum()) % count] += 1  # Now sum % count == count / 2.
  assert grey.mean() % 1 == 0.5
  # Grey pixels: PIL's L is the value.
  image = np.repeat(grey[..., None], 3, axis=-1).astype(np.uint8)
  want = pil_op(lambda im: ImageEnhance.Contrast(im).enhance(1.9), image)
  np.testing.assert_array_equal(op('Contrast', image, 1.9), want)


@pytest.mark.parametrize('shape', [(1, 1), (2, 2), (2, 7), (7, 1), (3, 3)])
def test_sharpness_of_images_under_three_pixels_wide_equals_pil(shape):
  image = random_image(shape)
  want = pil_op(lambda im: ImageEnhance.Sharpness(im).enhance(0.3), image)
  np.testing.assert_array_equal(op('Sharpness', image, 0.3), want)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('addition', [0, 55, 110])
def test_solarize_add_equals_numpy(shape, addition):
  image = random_image(shape)
  want = np.where(image < 128, np.minimum(image.astype(int) + addition, 255), image)
  np.testing.assert_array_equal(op('SolarizeAdd', image, addition), want)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize(
    'half_size, center', [(0, (5, 5)), (4, (10, 12)), (40, (3, 30)), (6, (0, 0)), (6, (23, 31))]
)
def test_cutout_equals_numpy_box(shape, half_size, center):
  image = random_image(shape)
  want = image.copy()
  (cy, cx), p = center, half_size
  want[max(cy - p, 0) : cy + p, max(cx - p, 0) : cx + p] = 128
  np.testing.assert_array_equal(op('Cutout', image, half_size, center), want)
  assert (image == random_image(shape)).all()  # A new array: the input is not written.


def pil_affine(image, matrix):
  """PIL's affine transform with nearest resampling and grey fill, for a matrix in pixel indices.

  PIL samples input floor(M (x + 1/2, y + 1/2) + t) for output pixel (x, y); the ops sample
  round(M (x, y) + t'), so t' = t - 1/2 + M (1/2, 1/2) is the same map.
  """
  a, b, c, d, e, f = matrix
  data = (a, b, c + 0.5 - (a + b) / 2, d, e, f + 0.5 - (d + e) / 2)
  return np.asarray(
      Image.fromarray(image).transform(
          Image.fromarray(image).size,
          Image.Transform.AFFINE,
          data,
          resample=Image.Resampling.NEAREST,
          fillcolor=FILL,
      )
  )


def numpy_affine(image, matrix):
  """Output pixel (x, y) = input pixel round(M (x, y) + t) (halves up), grey where that is outside
  the image: the TF reference's nearest sampling, written independently of PIL."""
  a, b, c, d, e, f = matrix
  y, x = np.mgrid[: image.shape[0], : image.shape[1]].astype(np.float64)
  src_x = np.floor(a * x + b * y + c + 0.5).astype(int)
  src_y = np.floor(d * x + e * y + f + 0.5).astype(int)
  inside = (src_x >= 0) & (src_x < image.shape[1]) & (src_y >= 0) & (src_y < image.shape[0])
  out = np.full_like(image, 128)
  out[inside] = image[src_y[inside], src_x[inside]]
  return out


def rotation_matrix(shape, degrees):
  """Counter-clockwise about the centre ((w - 1) / 2, (h - 1) / 2) of pixel indices."""
  radians = np.deg2rad(degrees)
  cos, sin = np.cos(radians), np.sin(radians)
  h, w = shape[0] - 1, shape[1] - 1
  return (cos, -sin, (w - cos * w + sin * h) / 2, sin, cos, (h - sin * w - cos * h) / 2)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize(
    'name, arg, matrix',
    [
        ('ShearX', 0.3, (1, 0.3, 0, 0, 1, 0)),
        ('ShearX', -0.17, (1, -0.17, 0, 0, 1, 0)),
        ('ShearY', 0.3, (1, 0, 0, 0.3, 1, 0)),
        ('ShearY', -0.21, (1, 0, 0, -0.21, 1, 0)),
        ('TranslateX', 7.0, (1, 0, 7, 0, 1, 0)),
        ('TranslateX', -12.4, (1, 0, -12.4, 0, 1, 0)),
        ('TranslateY', 5.0, (1, 0, 0, 0, 1, 5)),
        ('TranslateY', -100.0, (1, 0, 0, 0, 1, -100)),
    ],
)
def test_shear_and_translate_match_pil_transform_and_numpy(shape, name, arg, matrix):
  image = random_image(shape)
  got = op(name, image, arg)
  assert_nearly_equal(got, pil_affine(image, matrix))
  assert_nearly_equal(got, numpy_affine(image, matrix))


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('degrees', [30.0, -30.0, 13.5, 90.0, 60.0])  # 60: magnitude 20.
def test_rotate_matches_pil_rotate_and_numpy(shape, degrees):
  image = random_image(shape)
  want = pil_op(
      lambda im: im.rotate(degrees, resample=Image.Resampling.NEAREST, fillcolor=FILL), image
  )
  got = op('Rotate', image, degrees)
  np.testing.assert_array_equal(got, want)
  assert_nearly_equal(got, numpy_affine(image, rotation_matrix(shape, degrees)))


def test_translate_moves_content_and_fills_grey():
  image = random_image((8, 10))
  got = op('TranslateX', image, 3.0)
  np.testing.assert_array_equal(got[:, :7], image[:, 3:])
  assert (got[:, 7:] == 128).all()


def args_at(name, magnitude, seed=(1, 2)):
  image = np.zeros([50, 60, 3], np.uint8)
  return ra.op_args(name, magnitude, np.random.default_rng(seed), image)


# The reference's level_to_arg with big_vision's randaug constants (translate 100, cutout 40).
@pytest.mark.parametrize(
    'name, magnitude, want',
    [
        ('AutoContrast', 10, ()),
        ('Equalize', 10, ()),
        ('Invert', 10, ()),
        ('Posterize', 10, (4,)),
        ('Posterize', 5, (2,)),
        ('Posterize', 2, (1,)),  # TF's reference shifts by at most 7 bits: 1 bit is kept.
        ('Posterize', 0, (1,)),
        ('Posterize', 20, (8,)),
        ('Solarize', 10, (0,)),  # 256 as TF's uint8 (big_vision issue #110): all inverted.
        ('Solarize', 15, (128,)),  # AugReg's strongest recipes.
        ('Solarize', 20, (0,)),
        ('Solarize', 9, (230,)),
        ('Solarize', 5, (128,)),
        ('SolarizeAdd', 10, (110,)),
        ('SolarizeAdd', 5, (55,)),
        ('Color', 10, (1.9,)),
        ('Contrast', 5, (1.0,)),
        ('Brightness', 0, (0.1,)),
        ('Sharpness', 9, (1.72,)),
        ('Color', 20, (3.7,)),
    ],
)
def test_magnitude_to_fixed_args(name, magnitude, want):
  np.testing.assert_allclose(args_at(name, magnitude), want, rtol=1e-6)


@pytest.mark.parametrize(
    'name, magnitude, size',
    [
        ('Rotate', 10, 30.0),
        ('Rotate', 5, 15.0),
        ('ShearX', 10, 0.3),
        ('ShearY', 5, 0.15),
        ('TranslateX', 10, 100.0),
        ('TranslateY', 3, 30.0),
    ],
)
def test_magnitude_to_signed_args(name, magnitude, size):
  signed = [args_at(name, magnitude, (s, 0))[0] for s in range(40)]
  np.testing.assert_allclose(np.abs(signed), size, rtol=1e-6)
  assert 10 <= sum(v > 0 for v in signed) <= 30  # Each sign about half the time.


def test_cutout_args_are_half_size_and_a_uniform_center():
  centers = []
  for s in range(200):
    half_size, center = args_at('Cutout', 5, (s, 7))
    assert half_size == 20
    centers.append(center)
  centers = np.array(centers)
  assert centers.min(0).tolist() == [0, 0] and centers.max(0).tolist() == [49, 59]


def augment(image, seed, num_layers=2, magnitude=9.0):
  return ra.randaugment(
      np.asarray(image, np.float32), np.random.default_rng(seed), num_layers, magnitude
  )


@pytest.mark.parametrize('shape', [(48, 48), (40, 64)])
def test_randaugment_is_a_function_of_image_and_seed(shape):
  # Magnitude 3 translates by 30 pixels, less than these sizes: a larger shift turns them all grey.
  image = random_image(shape, 10, 246)
  outputs = [augment(image, (s, 3), magnitude=3.0) for s in range(8)]
  np.testing.assert_array_equal(augment(image, (0, 3), magnitude=3.0), outputs[0])
  assert len({o.tobytes() for o in outputs}) >= 6
  for out in outputs:
    assert out.dtype == np.float32 and out.shape == image.shape and out.flags.c_contiguous
    assert out.min() >= 0 and out.max() <= 255 and (out == np.round(out)).all()


def test_draws_come_from_the_generator_in_order():
  """Per layer: the op's index, uniform in [0, 16), then its arguments; nothing from numpy's global
  state, which a worker process forked from another shares."""
  image = random_image((24, 40), 10, 246)
  for s in range(20):
    np.random.seed(s)  # Would change the output if the ops drew from it.
    got = augment(image, (s, 9), magnitude=5.0)
    rng = np.random.default_rng((s, 9))
    want = image
    for _ in range(2):
      name = list(ra.OPS)[rng.integers(16)]
      want = ra.OPS[name](want, *ra.op_args(name, 5.0, rng, want))
    np.testing.assert_array_equal(got, want)


def test_zero_layers_is_identity():
  image = np.random.default_rng(0).uniform(0, 255, (12, 20, 3)).astype(np.float32)
  np.testing.assert_array_equal(augment(image, (1, 2), num_layers=0), image)


def test_float_pixels_are_rounded_half_to_even_and_clipped_for_the_ops():
  image = np.float32([[[0.5, 1.5, 2.5], [127.49, 127.5, 128.5], [-3.0, 254.6, 300.0]]])
  # A seed whose one layer draws Invert (index 2), an op that keeps every level distinct.
  seed = next(s for s in range(100) if np.random.default_rng(s).integers(16) == 2)
  got = augment(image, seed, num_layers=1)
  rounded = np.float32([[[0, 2, 2], [127, 128, 128], [0, 255, 255]]])
  np.testing.assert_array_equal(got, 255 - rounded)


def test_every_op_at_magnitude_20_keeps_shape_dtype_and_range():
  """AugReg's strongest recipes go to 20: Posterize keeps 8 bits, Rotate turns 60 degrees, ..."""
  image = random_image((24, 40), 10, 246)
  for name, fn in ra.OPS.items():
    out = fn(image, *ra.op_args(name, 20.0, np.random.default_rng(0), image))
    assert out.dtype == np.uint8 and out.shape == image.shape, name
  np.testing.assert_array_equal(op('Posterize', image, *args_at('Posterize', 20)), image)


def test_one_layer_applies_one_uniformly_drawn_op_always():
  """The 10 ops without random arguments: each drawn about 1/16 of the time, and never skipped."""
  image = random_image((16, 24), 10, 246)
  magnitude = 9.0
  seedless = [
      'AutoContrast',
      'Equalize',
      'Invert',
      'Posterize',
      'Solarize',
      'Color',
      'Contrast',
      'Brightness',
      'Sharpness',
      'SolarizeAdd',
  ]
  expected = {}
  for name in seedless:
    args = ra.op_args(name, magnitude, np.random.default_rng(0), image)
    expected[op(name, image, *args).tobytes()] = name
  assert len(expected) == len(seedless)  # Distinguishable, and none is the identity:
  assert image.tobytes() not in expected
  n = 800
  counts = dict.fromkeys(seedless, 0)
  for s in range(n):
    out = augment(image, (s, 1), num_layers=1, magnitude=magnitude)
    assert out.tobytes() != image.astype(np.float32).tobytes()
    name = expected.get(out.astype(np.uint8).tobytes())
    if name:
      counts[name] += 1
  # 50 expected each; binomial std ~7.
  assert all(25 <= c <= 80 for c in counts.values()), counts
