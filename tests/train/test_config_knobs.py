"""A knob the config names changes what it says it changes: run the code with and without it."""

import glob
import os

import jax
import numpy as np
import optax
import pytest

import helpers
from vit_jax.tasks import mpp
from vit_jax.train import field_checks

_IMAGES = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3)).astype(np.float32)


def _mpp_loss(label_smoothing: float) -> tuple[float, float]:
  """The tiny MPP model's train loss of random images (random parameters), and the unsmoothed
  integer-label cross-entropy of the same logits (what the loss was before it read label_smoothing).
  """
  config = helpers.load_config('mpp_demo', {**helpers.TINY, 'label_smoothing': label_smoothing})
  model = mpp.make_model(config, helpers.model_config(config), None)
  params = helpers.random_params(model, config.image_size)
  key = jax.random.key(0)
  loss = float(mpp.make_loss(config, model)(params, _IMAGES, None, key))
  dropout_key, mpp_key = jax.random.split(key)  # As make_loss splits it.
  logits, corrupted = model.apply(
      {'params': params}, _IMAGES, train=True, rngs={'dropout': dropout_key, 'mpp': mpp_key}
  )
  xent = optax.softmax_cross_entropy_with_integer_labels(
      logits, mpp.colour_targets(_IMAGES, model.input_stride, model.num_bits)
  )
  return loss, float(np.sum(xent * corrupted) / np.maximum(np.sum(corrupted), 1))


def test_label_smoothing_smooths_the_mpp_colour_targets():
  """config.label_smoothing used to be read by the classification loss only: an MPP run with it set
  (configs/demo.py's 0.1 with --config.task=mpp) trained bit for bit as without it."""
  plain, unsmoothed = _mpp_loss(0.0)
  smoothed, _ = _mpp_loss(0.3)
  assert plain == unsmoothed  # Unsmoothed runs train as they did.
  assert smoothed > plain + 0.1  # Smoothed targets of 512 classes: far from the one-hot's loss.


def _config_files() -> list[str]:
  # finetune.py is the recipe the vit_*_finetune files call (with a variant and a dataset).
  files = glob.glob(os.path.join(helpers.REPO, 'configs', '*.py'))
  return sorted(
      os.path.basename(path)[:-3]
      for path in files
      if os.path.basename(path) not in ('__init__.py', 'finetune.py')
  )


@pytest.mark.parametrize('name', _config_files())
def test_every_shipped_config_has_exactly_the_default_fields(name):
  """setup refuses a field the defaults lack (a typo that would change nothing): no shipped experiment
  file may have one."""
  field_checks.check_field_names(helpers.load_config(name))
