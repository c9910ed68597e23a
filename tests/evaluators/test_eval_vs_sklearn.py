"""The evaluators against independent implementations: scikit-learn's metrics and ridge classifier,
timm's ImageNet-ReaL scorer, and big_vision's few-shot formula and shot sampling (in NumPy)."""

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
import scipy.special
from sklearn import linear_model, metrics as sk_metrics

import helpers
from vit_jax import data, evaluators, sharding, tasks
from vit_jax.data import digits, on_device, preprocess
from vit_jax.evaluators import fewshot, split as split_lib
from vit_jax.tasks import classification


class _LogitsAreTheInput(nn.Module):
  """A 'model' whose logits are its input: eval steps scored on logits chosen by the test."""

  @nn.compact
  def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
    del train
    return x


def _split_images(config, split):
  """The split's eval-preprocessed images and labels, sliced from the digits' arrays here (not by
  our pipeline): `split` is 'test[a:b]'."""
  name, _, bounds = split.rstrip(']').partition('[')
  start, stop = (int(b) if b else None for b in bounds.split(':'))
  images, labels = (arrays[start:stop] for arrays in digits.split_arrays()[name])
  return np.stack(
      [
          preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=config.image_size)
          for image in images
      ]
  ), np.asarray(labels)


# Splits of 3 (fewer than make test's 8 devices, in one batch of 64), 37 (batches of 24: 3 per
# device, the last batch part padding) and 13 (batches of 16) examples.
@pytest.mark.parametrize(
    'split, eval_batch_size, loss',
    [
        ('test[:3]', 64, 'softmax_xent'),
        ('test[5:42]', 24, 'softmax_xent'),
        ('test[:13]', 16, 'sigmoid_xent'),
    ],
)
def test_split_metrics_are_sklearns_over_every_example_once(data_dir, split, eval_batch_size, loss):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'eval_split': split,
          'eval_batch_size': eval_batch_size,
          'loss': loss,
          'label_smoothing': 0.1,
      },
  )
  info = data.get_info(config)
  task = tasks.get(config.task)
  model = task.make_model(config, helpers.model_config(config), info.num_classes)
  context = evaluators.Context(
      config, info, task, model, sharding.make_mesh(config.mesh), helpers.model_config(config)
  )
  (evaluator,) = [e for e in evaluators.make_evaluators(context) if e.name == 'eval']
  params = helpers.random_params(model, config.image_size)
  metrics = evaluator(params)

  images, labels = _split_images(config, split)
  logits = np.asarray(
      jax.jit(lambda x: model.apply({'params': params}, on_device.model_input(x), train=False))(
          images
      ),
      np.float64,
  )
  classes = np.arange(info.num_classes)
  assert metrics['top1'] == pytest.approx(sk_metrics.accuracy_score(labels, logits.argmax(-1)))
  assert metrics['top5'] == pytest.approx(
      sk_metrics.top_k_accuracy_score(labels, logits, k=5, labels=classes)
  )
  if loss == 'softmax_xent':
    want = sk_metrics.log_loss(labels, scipy.special.softmax(logits, axis=-1), labels=classes)
  else:  # Binary cross-entropy of each class against the one-hot labels, summed over the classes.
    want = sum(
        sk_metrics.log_loss(labels == c, scipy.special.expit(logits[:, c]), labels=[0, 1])
        for c in classes
    )
  assert metrics['loss'] == pytest.approx(want, rel=1e-5)

  # Every example exactly once: the mean label and the mean pixel sum of the counted rows.
  def sums_of_real_rows(params, batch):
    del params
    mask = batch['mask'].astype(jnp.float32)
    return {
        'correct': jnp.sum(mask * batch['label']),
        'correct_top5': jnp.sum(mask * batch['image'].sum(axis=(1, 2, 3))),
        'count': jnp.sum(mask),
    }

  counter = split_lib.SplitEvaluator(
      'count',
      1,
      config=config,
      split=split,
      eval_step=sums_of_real_rows,
      mesh=context.mesh,
      metrics=('top1', 'top5'),
  )
  means = counter(params)
  assert means['top1'] == pytest.approx(labels.mean())
  assert means['top5'] == pytest.approx(images.sum(axis=(1, 2, 3)).mean(), rel=1e-6)


def test_top1_of_tied_logits_is_the_lowest_class_index_and_top5_of_4_classes_is_1():
  eval_step = classification.make_eval_step(
      ml_collections.ConfigDict({'loss': 'softmax_xent'}), _LogitsAreTheInput()
  )
  logits = np.array(
      [[1, 1, 1, 1], [0, 2, 2, 0], [3, 3, 3, 3], [0, 1, 0, 1], [4, 0, 1, 2]], np.float32
  )
  labels = np.array([0, 2, 3, 3, 0])
  mask = np.array([True, True, True, True, False])  # A padding row never counts.
  sums = eval_step({}, {'image': logits, 'label': labels, 'mask': mask})
  # On a tie, np.argmax's class (the lowest index): only row 0 is right; rows 1, 2 and 3 predict
  # classes 1, 0 and 1, not their labels 2, 3 and 3 (ties broken upwards would score 3 of 4).
  assert (
      float(sums['correct'])
      == sk_metrics.accuracy_score(labels[:4], logits[:4].argmax(-1), normalize=False)
      == 1
  )
  with (
      warnings.catch_warnings()
  ):  # sklearn warns that k >= the classes makes every prediction right.
    warnings.simplefilter('ignore')
    assert (
        float(sums['correct_top5']) / 4
        == sk_metrics.top_k_accuracy_score(labels[:4], logits[:4], k=5, labels=np.arange(4))
        == 1.0
    )
  assert float(sums['count']) == 4
  assert float(sums['loss_sum']) == pytest.approx(
      4
      * sk_metrics.log_loss(
          labels[:4], scipy.special.softmax(logits[:4], axis=-1), labels=np.arange(4)
      ),
      rel=1e-6,
  )


def _big_vision_fewshot_accuracy(x, y, x_test, y_test, num_classes, l2_reg):
  """big_vision/evaluators/fewshot_lsr.py in NumPy: train-standardised features, a constant feature
  of 100 as the (almost unregularised) bias, ridge regression to {-1, 1} one-hot targets."""
  mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + 1e-5
  with_bias = lambda f: np.pad((f - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
  x = with_bias(x)
  targets = 2.0 * np.eye(num_classes)[y] - 1.0
  weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(x.shape[1]), x.T @ targets)
  return np.mean((with_bias(x_test) @ weights).argmax(1) == y_test)


def test_the_fewshot_fit_is_sklearns_ridge_classifier_and_big_visions_formula():
  rng = np.random.default_rng(0)
  for _ in range(60):  # Random problems: classes, dimensions, shots, scales, offsets and l2_reg.
    num_classes, dim, shots = rng.integers(2, 12), rng.integers(2, 40), rng.integers(1, 6)
    centres = rng.normal(0, 1, (num_classes, dim))
    y, y_test = np.repeat(np.arange(num_classes), shots), rng.integers(0, num_classes, 200)
    x = (centres[y] + rng.normal(0, 1, (len(y), dim))) * rng.uniform(0.1, 10, dim) + rng.normal(
        0, 5, dim
    )
    x_test = (centres[y_test] + rng.normal(0, 1, (200, dim))) * rng.uniform(0.1, 10, dim)
    l2_reg = float(rng.choice([1e-3, 0.1, 1.0, 4.0, 100.0]))
    ours = fewshot.fit_and_score(x, y, x_test, y_test, num_classes, l2_reg)
    mean, std = x.mean(0), x.std(0) + 1e-5
    ridge = linear_model.RidgeClassifier(alpha=l2_reg).fit((x - mean) / std, y)
    assert ours == np.mean(ridge.predict((x_test - mean) / std) == y_test)
    assert ours == _big_vision_fewshot_accuracy(x, y, x_test, y_test, num_classes, l2_reg)


def test_fewshot_shots_are_big_visions_draw_and_a_class_of_exactly_shots_gives_them_all():
  rng = np.random.default_rng(3)
  labels = rng.permutation(np.repeat(np.arange(6), [5, 9, 7, 5, 12, 8]))
  for seed in range(3):
    # big_vision: a permutation of each class's indices from default_rng(seed), the first `shots`.
    draw = np.random.default_rng(seed)
    class_indices = [draw.permutation(np.where(labels == c)[0]) for c in range(6)]
    for shots in (1, 2, 5):
      chosen = fewshot.sample_shots(labels, shots, 6, np.random.default_rng(seed))
      np.testing.assert_array_equal(chosen, np.concatenate([i[:shots] for i in class_indices]))
      assert len(set(chosen)) == len(chosen) == 6 * shots
  # Classes 0 and 3 have exactly 5 examples: 5 shots take them all, 6 are too many.
  chosen = fewshot.sample_shots(labels, 5, 6, np.random.default_rng(0))
  assert set(chosen[:5]) == set(np.flatnonzero(labels == 0))
  with pytest.raises(ValueError, match='class 0 has 5 readable train examples, fewer than 6 shots'):
    fewshot.sample_shots(labels, 6, 6, np.random.default_rng(0))
