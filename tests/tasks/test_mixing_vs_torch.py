"""Mixup and CutMix against timm's Mixup, draw for draw: the comparisons of test_mixing.py with the
torch-based peers, which `make test-all` runs (they need the test extra)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
import torch
from timm.data import mixup as timm_mixup

from vit_jax.tasks import mixing
from test_mixing import HEIGHT, NUM_CLASSES, SMOOTHING, WIDTH, _batch, _mix_config


def _timm(images, labels, seed, **kwargs):
  """timm's batch mixing of NHWC numpy images, its draws from numpy's global generator at `seed`."""
  mixer = timm_mixup.Mixup(
      mode='batch', label_smoothing=SMOOTHING, num_classes=NUM_CLASSES, **kwargs
  )
  np.random.seed(seed)
  mixed, targets = mixer(
      torch.from_numpy(images.transpose(0, 3, 1, 2)).clone(), torch.from_numpy(labels).long()
  )
  return mixed.numpy().transpose(0, 2, 3, 1), targets.numpy()


@pytest.mark.parametrize('seed', range(4))
def test_mixup_matches_timm(seed):
  images, labels = _batch(seed)
  expected_images, expected_targets = _timm(images, labels, seed, mixup_alpha=0.8, cutmix_alpha=0.0)
  np.random.seed(seed)  # timm's draws, in its order: apply?, then lam.
  np.random.rand()
  lam = jnp.float32(np.random.beta(0.8, 0.8))
  mixed = mixing.mix_images(jnp.asarray(images), lam, jnp.bool_(False), jnp.zeros(4, jnp.int32))
  np.testing.assert_allclose(mixed, expected_images, atol=1e-6)
  np.testing.assert_allclose(
      mixing.mix_targets(labels, NUM_CLASSES, lam, SMOOTHING), expected_targets, atol=1e-6
  )
  assert not np.allclose(mixed, images)


def test_cutmix_matches_timm():
  corrected = []
  for seed in range(24):
    images, labels = _batch(seed)
    expected_images, expected_targets = _timm(
        images, labels, seed, mixup_alpha=0.0, cutmix_alpha=1.0
    )
    np.random.seed(seed)  # timm's draws, in its order: apply?, lam, then the box's centre.
    np.random.rand()
    raw_lam = np.random.beta(1.0, 1.0)
    centre_y, centre_x = np.random.randint(0, HEIGHT), np.random.randint(0, WIDTH)
    box = mixing.cutmix_box(jnp.float32(raw_lam), centre_y, centre_x, HEIGHT, WIDTH)
    lam = mixing.box_lam(box, HEIGHT, WIDTH)
    np.random.seed(seed)
    np.random.rand()
    np.random.beta(1.0, 1.0)
    expected_box, expected_lam = timm_mixup.cutmix_bbox_and_lam((HEIGHT, WIDTH), raw_lam)
    np.testing.assert_array_equal(box, expected_box)
    np.testing.assert_allclose(lam, expected_lam, rtol=1e-6)
    mixed = mixing.mix_images(jnp.asarray(images), lam, jnp.bool_(True), box)
    np.testing.assert_array_equal(mixed, expected_images)
    np.testing.assert_allclose(
        mixing.mix_targets(labels, NUM_CLASSES, lam, SMOOTHING), expected_targets, atol=1e-6
    )
    corrected.append(abs(float(lam) - raw_lam) > 0.05)
  assert 3 <= sum(corrected) <= 21  # Clipped boxes and unclipped ones were both compared.


def _timm_draws(n, height, width, seed=0, **kwargs):
  """timm's (lam, cutmix, box) of `n` batches, drawn in its order; lam corrected for clipping."""
  mixer = timm_mixup.Mixup(mode='batch', num_classes=NUM_CLASSES, **kwargs)
  np.random.seed(seed)
  lams, cutmixes, boxes = [], [], []
  for _ in range(n):
    lam, cutmix = mixer._params_per_batch()  # pylint: disable=protected-access
    box = (0, 0, 0, 0)
    if cutmix and lam != 1:
      box, lam = timm_mixup.cutmix_bbox_and_lam((height, width), lam)
    lams.append(lam)
    cutmixes.append(cutmix)
    boxes.append(box)
  return np.float32(lams), np.array(cutmixes), np.array(boxes)


def test_lam_and_box_distributions_match_timm():
  # Both alphas set and different, so drawing one kind's lam with the other's alpha shows; an odd,
  # non-square image, so the boxes' clipping and the centre's range show.
  fields = dict(mixup_alpha=0.3, cutmix_alpha=1.5, prob=0.8, switch_prob=0.4)
  n, height, width = 6000, 13, 7
  keys = jax.random.split(jax.random.key(3), n)
  mix = _mix_config(**fields)
  draws = jax.jit(jax.vmap(lambda key: mixing.draw(key, 0, mix, height, width)))(keys)
  lam, cutmix, box = np.asarray(draws.lam), np.asarray(draws.cutmix), np.asarray(draws.box)
  timm_lam, timm_cutmix, timm_box = _timm_draws(n, height, width, **fields)
  assert abs(cutmix.mean() - timm_cutmix.mean()) < 0.03
  # CutMix's lam takes few values here: rounded, so float32 and float64 arithmetic give the same ones.
  for ours, theirs in [
      (lam[~cutmix], timm_lam[~timm_cutmix]),
      (np.round(lam[cutmix], 5), np.round(timm_lam[timm_cutmix], 5)),
      *zip(box[cutmix].T, timm_box[timm_cutmix].T),
  ]:
    assert stats.ks_2samp(ours, theirs).pvalue > 1e-3
