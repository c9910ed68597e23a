"""A greyscale image ([h, w, 1], as `decode` gives an 8-bit greyscale file and the digits are served)
is preprocessed as its RGB image is, to the bit, whatever the ops; only faster."""

import io

import numpy as np
from PIL import Image
import pytest

from vit_jax import defaults
from vit_jax.data import digits
from vit_jax.data import images
from vit_jax.data import preprocess
from vit_jax.data import resizing

# Each op on, alone or with others; the crops up and down in size; both resizes.
PP_VARIANTS = {
    'inception': dict(crop='inception', flip=True),
    'random_resized': dict(crop='random_resized', flip=True, min_area=0.08),
    'random': dict(crop='random', pad=3, flip=True),
    'resize': dict(crop='resize'),
    'tensorflow_resize': dict(crop='inception', antialias=False, flip=True),
    'randaugment': dict(flip=True, randaug_layers=2, randaug_magnitude=15),
    'three_augment': dict(three_augment=True),
    'color_jitter_erase': dict(color_jitter=0.4, erase_prob=1.0),
}
SHAPES = ((7, 9), (37, 53), (300, 211))


def _pp(config, **overrides):
  config.update(overrides)
  return config


def _grey(shape, seed=0) -> np.ndarray:
  # Smooth with noise, so that every resize tap and rounding shows.
  y, x = np.mgrid[0 : shape[0], 0 : shape[1]]
  smooth = np.sin(x / 5) * 80 + np.cos(y / 7) * 40 + 128
  noise = np.random.default_rng(seed).normal(0, 15, shape)
  return np.clip(smooth + noise, 0, 255).astype(np.uint8)[..., None]


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('variant', PP_VARIANTS)
def test_train_preprocess_of_a_greyscale_image_is_its_rgb_images(variant, shape):
  pp = _pp(defaults.get_config().pp, **PP_VARIANTS[variant])
  grey = _grey(shape)
  for position in range(6):
    seed = (3, 1, position)
    got = preprocess.train_preprocess(grey, seed, pp=pp, image_size=24)
    want = preprocess.train_preprocess(images.rgb(grey), seed, pp=pp, image_size=24)
    assert got.shape == (24, 24, 3) and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize('shape', SHAPES)
@pytest.mark.parametrize('antialias', (True, False))
@pytest.mark.parametrize('crop', list(preprocess.EVAL_CROPS))
def test_eval_preprocess_of_a_greyscale_image_is_its_rgb_images(crop, antialias, shape):
  pp_eval = _pp(defaults.get_config().pp_eval, crop=crop, antialias=antialias)
  grey = _grey(shape, seed=1)
  got = preprocess.eval_preprocess(grey, pp_eval=pp_eval, image_size=32)
  want = preprocess.eval_preprocess(images.rgb(grey), pp_eval=pp_eval, image_size=32)
  assert got.shape == (32, 32, 3)
  np.testing.assert_array_equal(got, want)


def test_a_greyscale_file_decodes_to_one_channel_and_pils_rgb():
  grey = _grey((20, 30))[..., 0]
  for fmt in ('PNG', 'JPEG'):
    encoded = io.BytesIO()
    Image.fromarray(grey).save(encoded, format=fmt)
    decoded = images.decode(encoded.getvalue())
    assert decoded.shape == (20, 30, 1)
    pils = np.asarray(Image.open(io.BytesIO(encoded.getvalue())).convert('RGB'))
    np.testing.assert_array_equal(images.rgb(decoded), pils)


def test_rgb_leaves_an_rgb_image_as_it_is():
  image = np.zeros((2, 3, 3), np.uint8)
  assert images.rgb(image) is image


def test_the_crop_and_resize_of_a_greyscale_image_work_on_one_channel(monkeypatch):
  """The point of carrying [h, w, 1]: the default ops resize a third of the pixels."""
  resized = []
  pil_resize = resizing._pil_resize  # pylint: disable=protected-access

  def recorded(image, height, width):
    resized.append(image.shape[-1])
    return pil_resize(image, height, width)

  monkeypatch.setattr(resizing, '_pil_resize', recorded)
  pp = _pp(defaults.get_config().pp, flip=True)
  preprocess.train_preprocess(_grey((30, 40)), (0, 0, 1), pp=pp, image_size=16)
  preprocess.eval_preprocess(_grey((30, 40)), pp_eval=defaults.get_config().pp_eval, image_size=16)
  assert resized == [1, 1]


def test_the_digits_are_served_greyscale_and_are_the_rgb_digits():
  source = digits.DigitsSource()
  records = source.examples('test')
  rgb_images, labels = digits.split_arrays()['test']
  for k in (0, 7, records.num_records - 1):
    example = source.load(records.read(k))
    assert images.pixels(example['image']).shape == (8, 8, 1)
    np.testing.assert_array_equal(images.rgb(images.pixels(example['image'])), rgb_images[k])
    assert example['label'] == labels[k]
