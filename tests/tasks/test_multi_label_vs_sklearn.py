"""Multi-label classification: a run trains on a set of classes an image (a Sequence of ClassLabel)
with sigmoid_xent, and its evaluation measures top-1 / top-5 in the set, the loss and the mean average
precision, against numpy formulas and sklearn's average_precision_score."""

import jax
import ml_collections
import numpy as np
import pytest
import sklearn.metrics
import tensorflow_datasets as tfds

import helpers
import tfds_fixtures
from vit_jax import data
from vit_jax.data import digits, on_device
from vit_jax.evaluators import average_precision
from vit_jax.tasks import classification, mixing
from vit_jax.tools import fewshot as fewshot_tool
from vit_jax.train import loop, setup as train_setup

CLASSES = helpers.LABEL_SET_NAMES


class LabelSetDigits(tfds_fixtures.DigitsBuilder, skip_registration=True):
  """The digits, each with a set of classes ('labels') beside its digit ('label')."""

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(8, 8, 3)),
                'label': tfds.features.ClassLabel(names=CLASSES[:10]),
                'labels': tfds.features.Sequence(tfds.features.ClassLabel(names=CLASSES)),
            }
        )
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {
        split: self._generate(split, *arrays) for split, arrays in digits.split_arrays().items()
    }

  def _generate(self, split, images, labels):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {
          'image': tfds_fixtures.png(image),
          'label': label,
          'labels': helpers.digit_label_set(key, int(label), split),
      }


@pytest.fixture(scope='module')
def label_set_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('label_set_digits'))
  assert tfds_fixtures.prepare(LabelSetDigits, path) == 'label_set_digits'
  return path


def run_config(data_dir: str, **overrides):
  return helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'label_set_digits',
          'data_dir': data_dir,
          'label_feature': 'labels',
          'loss': 'sigmoid_xent',
          'data_workers': 0,
          **overrides,
      },
  )


def test_average_precision_is_sklearns():
  rng = np.random.default_rng(0)
  for examples, classes, ties in ((50, 7, None), (400, 300, 4), (1000, 20, 1)):
    scores = rng.normal(size=(examples, classes)).astype(np.float32)
    if ties:  # Equal scores count together, as sklearn's thresholds.
      scores = np.round(scores * ties) / ties
    labels = rng.random((examples, classes)) < 0.3
    labels[0] = True
    expected = [
        sklearn.metrics.average_precision_score(labels[:, c], scores[:, c]) for c in range(classes)
    ]
    # Float32 sums of up to 1000 terms.
    np.testing.assert_allclose(
        average_precision.average_precisions(scores, labels), expected, rtol=1e-5
    )
    # Rows outside the mask (a batch's padding) are left out, whatever they hold.
    padded_scores = np.concatenate([scores, np.full((3, classes), 9.0, np.float32)])
    padded_labels = np.concatenate([labels, np.ones((3, classes), bool)])
    mask = np.arange(examples + 3) < examples
    mean = average_precision.mean_average_precision(padded_scores, padded_labels, mask)
    assert float(mean) == pytest.approx(
        sklearn.metrics.average_precision_score(labels, scores, average='macro'), rel=1e-5
    )
  # A class with no positive has no AP, and is left out of the mean.
  labels = np.array([[1, 0], [0, 0], [1, 0]], bool)
  aps = average_precision.average_precisions(np.array([[0.9, 1], [0.8, 2], [0.1, 3]]), labels)
  assert aps[0] == pytest.approx(
      sklearn.metrics.average_precision_score(labels[:, 0], [0.9, 0.8, 0.1])
  )
  assert np.isnan(aps[1])
  mask = np.ones(2, bool)
  assert np.isnan(
      average_precision.mean_average_precision(np.zeros((2, 2)), np.zeros((2, 2), bool), mask)
  )


def test_label_sets_are_smoothed_and_mixed_as_one_hots():
  labels = np.array([[True, False, True], [False, False, False]])
  np.testing.assert_allclose(
      mixing.one_hot_targets(labels, 3, 0.3), [[0.8, 0.1, 0.8], [0.1, 0.1, 0.1]], rtol=1e-6
  )
  mixed = mixing.mix_targets(labels, 3, np.float32(0.75), 0.0)
  np.testing.assert_allclose(mixed, [[0.75, 0, 0.75], [0.25, 0, 0.25]])
  logits = np.array([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], np.float32)
  sigmoid_xent = classification.loss_of_examples(
      ml_collections.ConfigDict({'loss': 'sigmoid_xent'})
  )
  loss = classification.compute_loss(logits, labels, loss=sigmoid_xent)
  p = 1 / (1 + np.exp(-logits))
  expected = -np.mean(np.sum(labels * np.log(p) + (1 - labels) * np.log(1 - p), axis=-1))
  assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_the_train_batches_hold_each_image_set(label_set_dir):
  config = run_config(label_set_dir)
  batch = next(iter(data.train_iterator(config, local_batch_size=64)))
  assert 'label' not in batch and batch['labels'].shape == (64, 12)
  labels = batch['labels']
  digit = labels[:, :10].argmax(-1)
  assert np.all(labels[:, :10].sum(-1) == 1)  # No train image is unlabelled.
  np.testing.assert_array_equal(labels[:, 10], digit % 2 == 0)
  np.testing.assert_array_equal(labels[:, 11], digit >= 5)


# The mAP's rows stay where their batch rows are (over data, or fsdp with copies on tensor), and its
# 12 classes are split unevenly over the 8 devices.
@pytest.mark.parametrize('mesh', [(('data', -1),), (('fsdp', 4), ('tensor', 2))])
def test_eval_measures_top1_in_the_set_the_loss_and_the_map(tmp_path, label_set_dir, mesh):
  config = run_config(label_set_dir, eval_batch_size=64, mesh=mesh)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  assert setup.info.multi_label and setup.info.class_names == tuple(CLASSES)
  evaluator = {e.name: e for e in setup.evaluators}['eval']
  params = helpers.random_params(setup.model, config.image_size)
  metrics = evaluator(params)

  apply = jax.jit(lambda p, x: setup.model.apply({'params': p}, on_device.model_input(x)))
  logits, labels = [], []
  for batch in data.eval_iterator(config, 'test', local_batch_size=64):
    logits.append(np.asarray(apply(params, batch['image']))[batch['mask']])
    labels.append(batch['labels'][batch['mask']])
  logits, labels = np.concatenate(logits), np.concatenate(labels)
  assert len(logits) == 360 and labels.dtype == bool
  labelled = labels.any(-1)
  assert labelled.sum() == 320  # 40 test images have no label: no top-1, negatives for the mAP.
  top5 = np.argsort(-logits, axis=-1, kind='stable')[:, :5]
  hits = np.take_along_axis(labels, top5, axis=-1)[labelled]
  assert metrics['top1'] == pytest.approx(hits[:, 0].mean())
  assert metrics['top5'] == pytest.approx(hits.any(-1).mean())
  p = 1 / (1 + np.exp(-logits.astype(np.float64)))
  loss = -np.sum(labels * np.log(p) + (1 - labels) * np.log1p(-p), axis=-1)
  assert metrics['loss'] == pytest.approx(loss.mean(), rel=1e-4)
  assert metrics['map'] == pytest.approx(
      sklearn.metrics.average_precision_score(labels, logits, average='macro'), rel=1e-6
  )
  # The test tells: counting the unlabelled images in top-1 gives another number.
  assert metrics['top1'] != pytest.approx(np.mean(np.take_along_axis(labels, top5[:, :1], -1)))


def test_an_evaluator_of_another_split_measures_it_alike(tmp_path, label_set_dir):
  config = run_config(label_set_dir, eval_batch_size=64)
  config.evals.test_sets = dict(
      type='classification', split='test', label_feature='labels', every_steps=12
  )
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  evaluators = {e.name: e for e in setup.evaluators}
  params = helpers.random_params(setup.model, config.image_size)
  assert evaluators['test_sets'](params) == evaluators['eval'](params)


@pytest.mark.slow  # 400 steps of training each: make test-all's.
@pytest.mark.parametrize('loss', ['sigmoid_xent', 'asl'])
def test_a_run_learns_the_label_sets(tmp_path, label_set_dir, loss):
  config = run_config(
      label_set_dir,
      loss=loss,
      total_steps=400,
      eval_every_steps=400,
      checkpoint_every_steps=400,
      batch_size=32,
      **{'lr.base': 3e-3, 'lr.warmup_steps': 20, 'mix.mixup_alpha': 0.2, 'label_smoothing': 0.1},
  )
  workdir = str(tmp_path / 'run')
  metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  with pytest.raises(ValueError, match='few-shot and k-NN classify into one class an image'):
    fewshot_tool.evaluate_checkpoint(workdir)
  # Chance: a class's AP is its share of the images, 0.2 on average; top-1 in the set ~0.3.
  assert metrics['eval_map'] > 0.6, metrics
  assert metrics['eval_top1'] > 0.6, metrics


@pytest.mark.parametrize(
    'overrides, error',
    [
        ({'loss': 'softmax_xent'}, "set of classes an image, which config.loss='softmax_xent'"),
        ({'distill.teacher': 'x'}, 'unset --config.distill.teacher'),
        ({'fewshot.every_steps': 4}, 'unset config.fewshot.every_steps'),
        ({'knn.every_steps': 4}, 'unset config.knn.every_steps'),
    ],
)
def test_what_a_label_set_cannot_do_is_a_one_line_error(tmp_path, label_set_dir, overrides, error):
  with pytest.raises(ValueError, match=error.replace('(', r'\(').replace('.', r'\.')):
    train_setup.prepare(run_config(label_set_dir, **overrides), str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def _digit_grids(root, seed: int = 0) -> None:
  """Images of 2x2 digits (16x16 px: four random digits of the split), each labelled with the set of
  digits it shows (1 to 4 of them): a multi-object layout, written by `datasets` as Parquet files of
  a list column of ClassLabel."""
  datasets = pytest.importorskip('datasets')
  from PIL import Image  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  features = datasets.Features(
      {'image': datasets.Image(), 'digits': datasets.List(datasets.ClassLabel(names=CLASSES[:10]))}
  )
  for split, (pixels, labels) in digits.split_arrays().items():
    picks = rng.integers(0, len(labels), (len(labels) * (2 if split == 'train' else 1), 4))
    grey = pixels[..., 0]
    grids = [np.block([[grey[a], grey[b]], [grey[c], grey[d]]]) for a, b, c, d in picks]
    datasets.Dataset.from_dict(
        {
            'image': [Image.fromarray(g) for g in grids],
            'digits': [sorted({int(labels[p]) for p in pick}) for pick in picks],
        },
        features=features,
    ).to_parquet(str(root / 'data' / f'{split}-00000-of-00001.parquet'))


@pytest.mark.slow  # 500 steps of the demo's ViT: about a minute.
def test_the_demo_vit_learns_every_digit_of_a_grid(tmp_path):
  """Several objects an image, any of which the model must name: the sets a single-label
  classifier cannot give. The demo's ViT, 500 steps: mAP 0.912, top-1 0.992 (2-core AMD EPYC Zen
  4, 2026-12-05); chance mAP is about 0.34 (the share of the images a digit is in)."""
  _digit_grids(tmp_path / 'grids')
  config = helpers.load_config(
      'demo',
      {
          'dataset': 'huggingface',
          'data_dir': str(tmp_path / 'grids'),
          'label_feature': 'digits',
          'loss': 'sigmoid_xent',
          'label_smoothing': 0.0,
          'pp.min_area': 0.9,  # A digit cut away would still be in the label set.
          'total_steps': 500,
          'eval_every_steps': 500,
          'checkpoint_every_steps': 500,
          'data_workers': 0,
      },
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'run')))
  assert metrics['eval_map'] > 0.8, metrics
  assert metrics['eval_top1'] > 0.9, metrics
