"""ImageNet-ReaL's eval step against timm's RealLabelsImagenet scorer: make test-all's (it needs the
test extra)."""

import json

import numpy as np
import pytest
from timm.data.real_labels import RealLabelsImagenet
import torch

from vit_jax.evaluators import real
from test_eval_vs_sklearn import _LogitsAreTheInput


def test_real_eval_step_is_timms_real_labels_scorer(tmp_path):
  rng = np.random.default_rng(0)
  num_images, num_classes = 203, 12
  logits = rng.normal(size=(num_images, num_classes)).astype(np.float32)  # Ties have probability 0.
  # Label sets of 0 to 3 classes: about a quarter of the images are unlabelled and skipped.
  label_sets = [
      sorted(rng.choice(num_classes, rng.integers(0, 4), replace=False).tolist())
      for _ in range(num_images)
  ]
  (tmp_path / 'real.json').write_text(json.dumps(label_sets))
  filenames = [f'ILSVRC2012_val_{i + 1:08d}.JPEG' for i in range(num_images)]
  theirs = RealLabelsImagenet(filenames, real_json=str(tmp_path / 'real.json'))
  theirs.add_result(torch.from_numpy(logits))

  multi_hot = np.zeros((num_images, num_classes), bool)
  for i, labels in enumerate(label_sets):
    multi_hot[i, labels] = True
  # Padded to batches of 64 as the evaluator feeds it: padding rows have no labels and mask False.
  rows = 256
  padded = lambda x: np.concatenate([x, np.zeros((rows - num_images, *x.shape[1:]), x.dtype)])
  batch = {
      'image': padded(logits),
      'labels': padded(multi_hot),
      'mask': padded(np.ones(num_images, bool)),
  }
  sums = {k: 0.0 for k in ('correct', 'correct_top5', 'labelled')}
  for start in range(0, rows, 64):
    out = real.eval_step(
        {}, {k: v[start : start + 64] for k, v in batch.items()}, model=_LogitsAreTheInput()
    )
    sums = {k: sums[k] + float(out[k]) for k in sums}
  assert sums['labelled'] == sum(1 for labels in label_sets if labels)
  assert 100 * sums['correct'] / sums['labelled'] == pytest.approx(theirs.get_accuracy(1))
  assert 100 * sums['correct_top5'] / sums['labelled'] == pytest.approx(theirs.get_accuracy(5))
