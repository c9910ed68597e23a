"""Per-example image ops, as TensorFlow graph functions for tf.data.

Every random op is stateless and takes its seed explicitly, so an augmented example is a pure function
of its bytes and its seed: the same example at the same stream position looks the same in a resumed run.
"""
import ml_collections
import tensorflow as tf

CROPS = ('inception', 'random', 'resize')
# Aspect ratios (width / height) of the inception crop, as in the original Inception and ViT code.
_ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)


def check_pp(pp: ml_collections.ConfigDict) -> None:
  """Raises ValueError, naming the field to fix, if the train preprocessing config is invalid."""
  if pp.crop not in CROPS:
    raise ValueError(f'Unknown config.pp.crop {pp.crop!r}: use one of {", ".join(map(repr, CROPS))}')
  if pp.crop == 'inception' and not 0 < pp.min_area <= 1:
    raise ValueError(f'config.pp.min_area={pp.min_area} must be in (0, 1], e.g. 0.05')
  if pp.crop == 'random' and pp.pad < 0:
    raise ValueError(f'config.pp.pad={pp.pad} must be >= 0 pixels')


def decode(data: tf.Tensor) -> tf.Tensor:
  """Encoded JPEG / PNG / GIF / BMP bytes to uint8 [h, w, 3]; greyscale becomes RGB."""
  return tf.io.decode_image(data, channels=3, expand_animations=False)


def resize(image: tf.Tensor, size: int) -> tf.Tensor:
  """Bilinear resize of [h, w, 3] to float32 [size, size, 3] in the input's value range."""
  return tf.image.resize(image, (size, size), method='bilinear')


def normalize(image: tf.Tensor) -> tf.Tensor:
  """Pixel values in [0, 255] to float32 in [-1, 1]."""
  return tf.cast(image, tf.float32) / 127.5 - 1


def inception_crop(image: tf.Tensor, seed: tf.Tensor, min_area: float) -> tf.Tensor:
  """A random crop covering [min_area, 1] of the image with aspect ratio in [3/4, 4/3]."""
  begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image),
      bounding_boxes=tf.zeros([1, 0, 4], tf.float32),
      seed=seed,
      min_object_covered=0.0,
      aspect_ratio_range=_ASPECT_RATIO_RANGE,
      area_range=(min_area, 1.0),
      use_image_if_no_bounding_boxes=True)
  return tf.slice(image, begin, size)


def pad_and_random_crop(image: tf.Tensor, seed: tf.Tensor, pad: int) -> tf.Tensor:
  """Pads `pad` black pixels on every side, then crops back to the input size at a random offset."""
  padded = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
  return tf.image.stateless_random_crop(padded, tf.shape(image), seed=seed)


def train_preprocess(image: tf.Tensor, seed: tf.Tensor, *, pp: ml_collections.ConfigDict,
                     image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to an augmented float32 [image_size, image_size, 3] in [-1, 1].

  `pp.crop` is 'inception' (random resized crop), 'random' (resize, pad `pp.pad`, random crop) or
  'resize'; then a random horizontal flip if `pp.flip`. `seed` is a [2] int tensor. `pp` must have
  passed `check_pp`.
  """
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  if pp.crop == 'inception':
    image = resize(inception_crop(image, crop_seed, pp.min_area), image_size)
  elif pp.crop == 'random':
    image = pad_and_random_crop(resize(image, image_size), crop_seed, pp.pad)
  else:  # 'resize'; check_pp has rejected anything else.
    image = resize(image, image_size)
  if pp.flip:
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
  return normalize(image)


def eval_preprocess(image: tf.Tensor, *, image_size: int) -> tf.Tensor:
  """Decoded uint8 [h, w, 3] to float32 [image_size, image_size, 3] in [-1, 1]: resize only."""
  return normalize(resize(image, image_size))
