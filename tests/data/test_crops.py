"""The train crops, flip and train_preprocess's streams: pp.crop='random_resized' against timm's and
torchvision's RandomResizedCrop, 'inception' against TensorFlow's sample_distorted_bounding_box
(the original code's crop), 'random' (pad and crop), and how train_preprocess seeds each op."""

import itertools

import ml_collections
import numpy as np
import pytest
from scipy import stats

import helpers

from vit_jax import defaults
from vit_jax.data import crops
from vit_jax.data import images
from vit_jax.data import preprocess
from vit_jax.data import resizing
from vit_jax.data import train_ops

_RATIO = (3 / 4, 4 / 3)


def _pp(**overrides) -> ml_collections.ConfigDict:
  pp = defaults.get_config().pp
  pp.update(overrides)
  return pp


def _image(height: int, width: int, seed: int = 0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def test_the_train_crop_reads_min_area_and_checks_it():
  pp = _pp(crop='random_resized', min_area=0.0)
  with pytest.raises(ValueError, match=r'^config.pp.min_area=0.0 must be in \(0, 1\]'):
    preprocess.check_pp(pp)
  whole = crops.random_resized_box((40, 40), np.random.default_rng(3), 1.0)
  assert whole == (0, 0, 40, 40)  # A square image's whole area is the only box.
  assert crops.random_resized_box((40, 40), np.random.default_rng(3), 0.1)[2] < 40


# The inception crop: TensorFlow's sampler.


def _inception_boxes(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  """[n, 4] rows of (top, left, height, width), one per seed."""
  return np.array(
      [
          crops.inception_box((height, width), np.random.default_rng([i, 7]), min_area)
          for i in range(n)
      ]
  )


def _tensorflow_boxes(height: int, width: int, min_area: float, n: int) -> np.ndarray:
  tf = helpers.tensorflow()

  @tf.function
  def boxes(seeds):
    def box(seed):
      begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
          [height, width, 3],
          tf.zeros([1, 0, 4]),
          seed,
          min_object_covered=0.0,
          aspect_ratio_range=_RATIO,
          area_range=(min_area, 1.0),
          use_image_if_no_bounding_boxes=True,
      )
      return tf.concat([begin[:2], size[:2]], 0)

    return tf.map_fn(box, seeds)

  return boxes(tf.constant(np.stack([np.arange(n), np.full(n, 7)], 1), tf.int32)).numpy()


@pytest.mark.parametrize(
    'height,width,min_area', [(48, 64, 0.3), (40, 40, 0.08), (30, 90, 0.5), (375, 500, 0.05)]
)
def test_inception_boxes_are_distributed_as_tensorflows(height, width, min_area):
  n = 3000
  ours = _inception_boxes(height, width, min_area, n)
  reference = _tensorflow_boxes(height, width, min_area, n)
  for column, name in enumerate(('top', 'left', 'height', 'width')):
    p = stats.ks_2samp(ours[:, column], reference[:, column]).pvalue
    assert p > 1e-3, (name, p)
  area, reference_area = (b[:, 2] * b[:, 3] / (height * width) for b in (ours, reference))
  aspect, reference_aspect = (b[:, 3] / b[:, 2] for b in (ours, reference))
  assert abs(area.mean() - reference_area.mean()) < 0.02
  assert abs(aspect.mean() - reference_aspect.mean()) < 0.02
  # Neither box reaches the last row or column unless it spans the side: TensorFlow's offsets.
  for boxes in (ours, reference):
    assert ((boxes[:, 0] + boxes[:, 2] < height) | (boxes[:, 2] == height)).all()
    assert ((boxes[:, 1] + boxes[:, 3] < width) | (boxes[:, 3] == width)).all()


@pytest.mark.parametrize(
    'height,width,min_area',
    [(48, 64, 0.3), (30, 90, 0.5), (13, 11, 0.05), (10, 200, 0.9), (375, 500, 1.0)],
)
def test_inception_boxes_cover_min_area_at_an_allowed_aspect_ratio_or_are_the_image(
    height, width, min_area
):
  boxes = _inception_boxes(height, width, min_area, 500)
  top, left, box_h, box_w = boxes.T
  assert ((top >= 0) & (top + box_h <= height) & (left >= 0) & (left + box_w <= width)).all()
  whole = (box_h == height) & (box_w == width)
  area = box_h * box_w
  # The width is the height times a ratio in [3/4, 4/3], rounded.
  fits = (
      (area >= min_area * height * width)
      & (box_w >= np.round(box_h * _RATIO[0]))
      & (box_w <= np.round(box_h * _RATIO[1]))
  )
  assert (fits | whole).all()


@pytest.mark.parametrize('height,width,min_area', [(10, 200, 0.9), (375, 500, 1.0)])
def test_when_no_inception_box_fits_both_take_the_whole_image(height, width, min_area):
  """No box of the allowed ratios covers the area (500 / 375 is 4/3: only the exact ratio fits)."""
  ours = _inception_boxes(height, width, min_area, 50)
  reference = _tensorflow_boxes(height, width, min_area, 50)
  whole = [0, 0, height, width]
  assert (reference == whole).all(1).mean() > 0.9 and (ours == whole).all(1).mean() > 0.9
  assert (ours == whole).all(1).all() == (reference == whole).all(1).all()


# Pad and crop, flip.


def test_pad_and_random_crop_shifts_by_each_offset_up_to_twice_the_pad():
  image = _image(6, 7).astype(np.float32)
  padded = np.pad(image, [(2, 2), (2, 2), (0, 0)])
  offsets = []
  for seed in range(500):
    got = crops.pad_and_random_crop(image, np.random.default_rng(seed), 2)
    assert got.shape == image.shape
    offsets.append(
        next(
            (top, left)
            for top in range(5)
            for left in range(5)
            if np.array_equal(got, padded[top : top + 6, left : left + 7])
        )
    )
  counts = np.bincount([top * 5 + left for top, left in offsets], minlength=25)
  assert stats.chisquare(counts).pvalue > 1e-3  # All 25 offsets, uniformly.
  np.testing.assert_array_equal(
      crops.pad_and_random_crop(image, np.random.default_rng(0), 0), image
  )


def test_flip_mirrors_half_the_images_and_only_when_asked():
  image = _image(5, 8).astype(np.float32)
  flip = train_ops.AUGMENTS[0].apply
  mirrored = 0
  for seed in range(400):
    got = flip(image, np.random.default_rng(seed), _pp(flip=True), 8)
    assert got.shape == image.shape and got.flags.c_contiguous
    is_mirror = np.array_equal(got, image[:, ::-1])
    assert is_mirror or np.array_equal(got, image)
    mirrored += is_mirror
  assert stats.binomtest(mirrored, 400).pvalue > 1e-3
  assert train_ops.AUGMENTS[0].on(_pp(flip=True)) and not train_ops.AUGMENTS[0].on(_pp(flip=False))


def test_normalize_maps_0_255_to_minus_1_1_in_a_new_contiguous_array():
  image = np.float32([[[0] * 3, [127.5] * 3, [255] * 3]])[:, ::-1]
  got = images.normalize(image)
  assert got.dtype == np.float32 and got.flags.c_contiguous
  np.testing.assert_array_equal(got, [[[1] * 3, [0] * 3, [-1] * 3]])
  np.testing.assert_array_equal(
      images.normalize(np.uint8([[[0, 255, 51]]])),
      np.float32([[[0, 255, 51]]]) / np.float32(127.5) - 1,
  )


# train_preprocess: op i draws from default_rng([*seed, i]).


@pytest.mark.parametrize('crop', list(train_ops.CROPS))
def test_train_preprocess_is_its_ops_each_with_the_stream_of_its_position(crop):
  """Prefix-stable: op i's stream is default_rng([*seed, i]) whatever follows it, so an op added
  at the end (or off) leaves the others' draws as they were."""
  pp = _pp(crop=crop, pad=3 if crop == 'random' else 0)
  image = _image(20, 26)
  for seed in [(0, 3), (5, 3), (1, 2, 3)]:
    expected = image
    for i, op in enumerate((train_ops.CROPS[crop], *train_ops.AUGMENTS)):
      if op.on(pp):
        expected = op.apply(expected, np.random.default_rng([*seed, i]), pp, 16)
    got = preprocess.train_preprocess(image, seed, pp=pp, image_size=16)
    assert got.dtype == preprocess.train_dtype(pp) and got.shape == (16, 16, 3)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(preprocess.model_input(got), expected)


@pytest.mark.parametrize(
    'pp',
    [
        dict(),
        dict(crop='random_resized', antialias=True),
        dict(randaug_layers=2, three_augment=True, color_jitter=0.4, erase_prob=0.5),
    ],
    ids=str,
)
def test_train_preprocess_is_a_function_of_the_image_and_seed(pp):
  pp = _pp(**pp)
  image = _image(30, 40)
  first = [preprocess.train_preprocess(image, (i, 7), pp=pp, image_size=16) for i in range(12)]
  again = [preprocess.train_preprocess(image, (i, 7), pp=pp, image_size=16) for i in range(12)]
  np.testing.assert_array_equal(first, again)
  assert len({x.tobytes() for x in first}) == 12  # Each seed its own augmentation.
  for x in first:
    assert x.dtype == preprocess.train_dtype(pp) and x.shape == (16, 16, 3) and x.flags.c_contiguous


def test_crops_of_the_whole_image_are_plain_resizes():
  image = _image(24, 24)  # Square: the whole image is the only box of all its area.
  for (crop, fields), antialias in itertools.product(
      [
          ('inception', dict(min_area=1.0)),
          ('random_resized', dict(min_area=1.0)),
          ('random', dict(pad=0)),
          ('resize', {}),
      ],
      (False, True),
  ):
    pp = _pp(crop=crop, flip=False, antialias=antialias, **fields)
    expected = images.normalize(resizing.resize(image, 16, antialias))
    got = preprocess.train_preprocess(image, (0, 1), pp=pp, image_size=16)
    np.testing.assert_array_equal(preprocess.model_input(got), expected)
