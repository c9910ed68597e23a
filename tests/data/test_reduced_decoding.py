"""config.pp.reducing_gap / pp_eval.reducing_gap: a JPEG decoded at 1/2, 1/4 or 1/8 of its size
(libjpeg's DCT scaling) where its crop keeps that many times the output size. 0 (the default) must
be the full-size pixels to the bit; a gap must draw the same crops, keep images upright, and give
pixels nearer the full-size ones than another resampling filter would, on real photographs."""

import importlib.resources
import io

import numpy as np
from PIL import Image
import pytest

import helpers
from vit_jax import data
from vit_jax.data import crops
from vit_jax.data import images
from vit_jax.data import preprocess
from vit_jax.tools import classifiers, predict

# Photographs from a camera, as their JPEG files (scikit-learn's sample images, 640 x 427).
PHOTOS = ('china.jpg', 'flower.jpg')


def _photo(name: str) -> bytes:
  return (importlib.resources.files('sklearn.datasets.images') / name).read_bytes()


def _pp(**fields):
  return helpers.data_config(None, pp=fields).pp


def _pp_eval(**fields):
  pp_eval = helpers.data_config(None).pp_eval
  pp_eval.update(fields)
  return pp_eval


def _train(image, crop: str, gap: float, seed: int = 0, size: int = 32) -> np.ndarray:
  pp = _pp(crop=crop, flip=True, reducing_gap=gap)
  return preprocess.train_preprocess(image, (seed, 7), pp=pp, image_size=size)


def _eval(image, crop: str, gap: float, size: int = 32) -> np.ndarray:
  pp_eval = _pp_eval(crop=crop, reducing_gap=gap)
  return preprocess.eval_preprocess(image, pp_eval=pp_eval, image_size=size)


@pytest.mark.parametrize('fmt', ['JPEG', 'PNG', 'greyscale JPEG'])
@pytest.mark.parametrize('crop', ['inception', 'random_resized', 'random', 'resize'])
def test_without_a_gap_an_encoded_image_is_its_full_size_pixels(fmt, crop, jpeg_draft_scales):
  pixels = images.decode(_photo('china.jpg'))
  if fmt.startswith('greyscale'):
    pixels = pixels[..., 0]
  encoded = images.Encoded(helpers.encoded(pixels, fmt.split()[-1]))
  decoded = images.decode(encoded.data)
  for seed in range(4):
    np.testing.assert_array_equal(_train(encoded, crop, 0, seed), _train(decoded, crop, 0, seed))
  for eval_crop in preprocess.EVAL_CROPS:
    np.testing.assert_array_equal(_eval(encoded, eval_crop, 0), _eval(decoded, eval_crop, 0))
  assert not jpeg_draft_scales


@pytest.mark.parametrize(
    'gap,scale',
    [(1, 8), (1.5, 8), (2, 4), (3, 4), (4, 2), (6, 2), (6.1, None), (12, None)],
)
def test_a_jpeg_is_decoded_at_the_smallest_scale_that_leaves_the_gap(gap, scale, jpeg_draft_scales):
  """A 1600 x 1200 JPEG resized to 100 x 100: its shorter side is 12 outputs, so scale s is taken
  where 12 / s >= gap (PIL's thumbnail's rule)."""
  encoded = images.Encoded(helpers.encoded(np.zeros((1200, 1600, 3), np.uint8)))
  whole = lambda height, width: ((0, 0, height, width), (100, 100))
  got = images.crop_and_resize(encoded, whole, True, gap)
  assert got.shape == (100, 100, 3)
  assert jpeg_draft_scales == ([] if scale is None else [scale])


def test_a_jpeg_that_holds_more_images_is_reduced_as_its_first(jpeg_draft_scales):
  """An MPO file (a camera's JPEG with a depth map or a stereo pair after it) decodes reduced, as
  PIL's thumbnail decodes it."""
  first, second = (Image.fromarray(np.full((1200, 1600, 3), v, np.uint8)) for v in (40, 200))
  mpo = io.BytesIO()
  first.save(mpo, format='MPO', save_all=True, append_images=[second])
  with Image.open(mpo) as opened:
    assert opened.format == 'MPO'
  whole = lambda height, width: ((0, 0, height, width), (100, 100))
  got = images.crop_and_resize(images.Encoded(mpo.getvalue()), whole, True, 3)
  assert jpeg_draft_scales == [4]
  want = images.crop_and_resize(images.Encoded(helpers.encoded(np.asarray(first))), whole, True, 3)
  np.testing.assert_array_equal(got, want)


def test_the_crop_box_picks_the_scale(jpeg_draft_scales):
  """An inception crop's box, not the image, is what must keep the gap; its draws are made on the
  full-size image, so they are the same with and without one."""
  encoded = images.Encoded(helpers.encoded(np.zeros((1200, 1600, 3), np.uint8)))
  for seed in range(20):
    jpeg_draft_scales.clear()
    box = crops.inception_box((1200, 1600), np.random.default_rng(seed), 0.05)

    def geometry(height, width, seed=seed):
      assert (height, width) == (1200, 1600)
      return crops.inception_box((height, width), np.random.default_rng(seed), 0.05), (32, 32)

    images.crop_and_resize(encoded, geometry, True, 2)
    assert jpeg_draft_scales == [s for s in (8, 4, 2) if min(box[2:]) / 32 >= 2 * s][:1], box


def _filter_difference(photo: np.ndarray, size: int) -> float:
  """Mean |bilinear - bicubic| of PIL's antialiased resizes of `photo` to `size`: how much the choice
  of a resampling filter moves the pixels."""
  image = Image.fromarray(photo)
  bilinear, bicubic = (
      np.asarray(image.resize((size, size), f), np.float64)
      for f in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC)
  )
  return float(np.abs(bilinear - bicubic).mean())


@pytest.mark.parametrize('name', PHOTOS)
@pytest.mark.parametrize('size', [32, 64])
@pytest.mark.parametrize('gap,bound', [(2, 1.0), (3, 0.8)])
def test_reduced_pixels_are_nearer_the_full_size_ones_than_another_filter(
    name, size, gap, bound, jpeg_draft_scales
):
  """On camera JPEGs, for the eval crops and the same train crops, the mean difference from the
  full-size pixels is under `bound` times that between bilinear and bicubic resizing: at PIL's
  thumbnail gap (2) and at the one PIL calls indistinguishable from fair resampling (3), less."""
  encoded = images.Encoded(_photo(name))
  bound *= _filter_difference(images.decode(encoded.data), size)
  for crop in preprocess.EVAL_CROPS:
    full, reduced = (_eval(encoded, crop, g, size).astype(float) for g in (0, gap))
    assert np.abs(full - reduced).mean() < bound, crop
  for crop in ('resize', 'random'):
    full, reduced = (_train(encoded, crop, g, 3, size).astype(float) for g in (0, gap))
    assert np.abs(full - reduced).mean() < bound, crop
  # The random crops: boxes of 5-100% of the photo, some too small to be reduced.
  differences = [
      np.abs(
          _train(encoded, crop, 0, seed, size)
          - _train(encoded, crop, gap, seed, size).astype(float)
      )
      for crop in ('inception', 'random_resized')
      for seed in range(8)
  ]
  assert np.mean(differences) < bound
  assert jpeg_draft_scales and set(jpeg_draft_scales) <= {2, 4}


@pytest.mark.parametrize('orientation', [3, 6, 8])
def test_a_reduced_jpeg_is_turned_upright_where_asked(orientation):
  """Hugging Face images are turned upright by their EXIF orientation (a quarter turn swaps the
  sides the crop sees): reduced or not, the same image."""
  photo = images.decode(_photo('flower.jpg'))
  tagged = helpers.encoded(photo, orientation=orientation)
  for exif_orientation in (False, True):
    encoded = images.Encoded(tagged, exif_orientation)
    full, reduced = (_eval(encoded, 'central', gap, 48).astype(float) for gap in (0, 2))
    assert np.abs(full - reduced).mean() < 2, exif_orientation
  upright = images.decode(tagged, exif_orientation=True)
  assert upright.shape[:2] == (photo.shape[:2] if orientation == 3 else photo.shape[1::-1])


def test_images_that_cannot_be_decoded_are_unreadable_with_a_gap():
  photo = _photo('china.jpg')
  for encoded, reason in [
      (photo[: len(photo) // 3], 'OSError: image file is truncated'),
      (b'not an image', 'not an image format PIL reads'),
      (images.LFS_POINTER + b' spec', 'a git-lfs pointer, not the image'),
  ]:
    with pytest.raises(images.UnreadableImage, match=f'^{reason}'):
      _eval(images.Encoded(encoded), 'resize', 2)


@pytest.mark.parametrize('gap', [0.5, -1.0, 0.999])
def test_a_gap_between_0_and_1_is_a_one_line_error(gap):
  for check, field, config in [
      (preprocess.check_pp, 'config.pp', _pp(reducing_gap=gap)),
      (preprocess.check_pp_eval, 'config.pp_eval', _pp_eval(reducing_gap=gap)),
  ]:
    with pytest.raises(ValueError, match=rf'^{field}.reducing_gap={gap} must be 0 .* or >= 1'):
      check(config)


def _folder(root, count: int = 6) -> str:
  """Camera photos (and their mirror images) as an image folder of two classes."""
  for split in ('train', 'test'):
    for k in range(count):
      photo = images.decode(_photo(PHOTOS[k % 2]))
      path = root / split / PHOTOS[k % 2][:-4] / f'{k}.jpg'
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_bytes(helpers.encoded(photo[:, ::-1] if k % 4 >= 2 else photo))
  return str(root)


def test_the_pipeline_reads_the_gap_of_its_config(tmp_path, jpeg_draft_scales):
  config = helpers.data_config(_folder(tmp_path), dataset='folder', image_size=32)
  config.pp.crop = 'inception'
  data.get_info(config)  # Lists the folder, probing a sample of its images at 1/8 of their size.
  jpeg_draft_scales.clear()
  full = next(data.train_iterator(config, local_batch_size=6))
  full_eval = next(data.eval_iterator(config, 'test', local_batch_size=6))
  assert not jpeg_draft_scales
  config.pp.reducing_gap = config.pp_eval.reducing_gap = 2
  reduced = next(data.train_iterator(config, local_batch_size=6))
  train_scales = len(jpeg_draft_scales)
  reduced_eval = next(data.eval_iterator(config, 'test', local_batch_size=6))
  assert train_scales and len(jpeg_draft_scales) > train_scales  # The eval's images reduced too.
  for a, b in ((full, reduced), (full_eval, reduced_eval)):
    np.testing.assert_array_equal(a['label'], b['label'])
    assert 0 < np.abs(a['image'].astype(float) - b['image']).mean() < 3


def test_predict_decodes_as_the_runs_evaluation(tmp_path):
  """A run's pp_eval.reducing_gap is how its evaluation decoded: predict decodes so too."""
  path = tmp_path / 'china.jpg'
  path.write_bytes(_photo('china.jpg'))
  pp_eval = {'crop': 'central', 'crop_fraction': 0.875, 'antialias': True, 'reducing_gap': 2.0}
  classifier = classifiers.Classifier(lambda x: x, 32, ('a',), pp_eval=pp_eval)
  [(name, got)] = list(predict._readable([str(path)], classifier))  # pylint: disable=protected-access
  assert name == str(path)
  want = preprocess.eval_preprocess(
      images.Encoded(path.read_bytes()), pp_eval=_pp_eval(**pp_eval), image_size=32
  )
  np.testing.assert_array_equal(got, preprocess.model_input(want))
  full = classifiers.model_input(
      classifiers.read_image(str(path)), 32, {**pp_eval, 'reducing_gap': 0.0}
  )
  assert np.abs(got - full).max() > 0  # Reduced: not the full-size pixels.
