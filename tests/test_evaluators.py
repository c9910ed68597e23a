"""An evaluator on a split of another dataset with the same classes (as ImageNet-V2 beside ImageNet)."""
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax.train import loop, setup as train_setup


def test_another_dataset_with_the_same_classes_measures_the_same_images_alike(
    tmp_path, data_dir, sorted_digits_folder):
  # The run reads the digits as an image folder; the extra evaluator reads the same test images from the
  # tfds digits: the same pixels, so the same metrics.
  config = helpers.load_config('demo', {**helpers.TINY, 'dataset': 'folder',
                                       'data_dir': sorted_digits_folder, 'total_steps': 4,
                                       'eval_every_steps': 4})
  config.evals.digits_test = dict(type='classification', dataset='digits', data_dir=data_dir,
                                  split='test', every_steps=4)
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'run')))
  assert metrics['digits_test_top1'] == pytest.approx(metrics['eval_top1'])
  assert metrics['digits_test_loss'] == pytest.approx(metrics['eval_loss'], rel=1e-5)


def test_another_dataset_with_other_classes_is_a_one_line_error(tmp_path, data_dir):
  for split in ('train', 'test'):  # An image folder's classes are its train split's sub-folders.
    for name in ('cat', 'dog', 'eel'):
      (tmp_path / 'other' / split / name).mkdir(parents=True)
      Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / 'other' / split / name / '0.png')
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.other = dict(type='classification', dataset='folder', data_dir=str(tmp_path / 'other'),
                            split='test', every_steps=4)
  with pytest.raises(ValueError, match=r"^Evaluator 'other': dataset 'folder' has 3 classes "
                                       r"\(cat, dog, eel\.\.\.\), not the run's 10") as error:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(error.value) and not (tmp_path / 'run').exists()
