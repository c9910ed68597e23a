"""Evaluators on another dataset with the run's classes: a split of it (as ImageNet-V2 beside ImageNet),
and multi-label top-1 (as ImageNet-ReaL); the eval loss; empty splits; their worker processes."""

import multiprocessing
import re
import shutil

import jax
import numpy as np
import pytest
import scipy.special
import tensorflow_datasets as tfds
from PIL import Image

import helpers
import tfds_fixtures
from vit_jax import data, evaluators, sharding, tasks
from vit_jax.data import digits, on_device, preprocess
from vit_jax.evaluators import split as split_evaluator
from vit_jax.tools import confusion
from vit_jax.train import loop, setup as train_setup

VALIDATION_IMAGES, VALIDATION_LABELS = digits.split_arrays()['test']


def real_label_set(key: int, label: int) -> list[int]:
  """A ReaL-like label set: none for some images (they are skipped), two classes, another class than
  the original label, or the original label alone."""
  return [[], [label, (label + 1) % 10], [(label + 2) % 10], [label]][key % 4]


class RealDigits(tfds_fixtures.DigitsBuilder, skip_registration=True):
  """The digits test split laid out as tfds' imagenet2012_real: 'original_label' and a Sequence of
  ClassLabel 'real_label', no 'label'."""

  def _info(self) -> tfds.core.DatasetInfo:
    classes = [str(d) for d in range(10)]
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
            {
                'image': tfds.features.Image(shape=(8, 8, 3)),
                'original_label': tfds.features.ClassLabel(names=classes),
                'real_label': tfds.features.Sequence(tfds.features.ClassLabel(names=classes)),
            }
        )
    )

  def _split_generators(self, dl_manager):
    del dl_manager
    return {'validation': self._generate_examples(VALIDATION_IMAGES, VALIDATION_LABELS)}

  def _generate_examples(self, images, labels):
    for key, (image, label) in enumerate(zip(images, labels)):
      yield key, {
          'image': tfds_fixtures.png(image),
          'original_label': label,
          'real_label': real_label_set(key, int(label)),
      }


@pytest.fixture(scope='module')
def real_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp('real_digits'))
  assert tfds_fixtures.prepare(RealDigits, path) == 'real_digits'
  return path


def test_another_dataset_with_the_same_classes_measures_the_same_images_alike(
    tmp_path, data_dir, sorted_digits_folder, real_dir
):
  # The run reads the digits as an image folder; the extra evaluator reads the same test images from the
  # digits in memory: the same pixels, so the same metrics.
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'folder',
          'data_dir': sorted_digits_folder,
          'total_steps': 4,
          'eval_every_steps': 4,
          'data_workers': 0,  # Worker processes cost 17 s to start here, and are not the subject.
      },
  )
  config.evals.digits_test = dict(
      type='classification', dataset='digits', data_dir=data_dir, split='test', every_steps=4
  )
  config.evals.real = dict(type='real', dataset='real_digits', data_dir=real_dir, every_steps=4)
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'run')))
  assert metrics['digits_test_top1'] == pytest.approx(metrics['eval_top1'])
  assert metrics['digits_test_loss'] == pytest.approx(metrics['eval_loss'], rel=1e-5)
  assert 0.0 <= metrics['real_top1'] <= metrics['real_top5'] <= 1.0


@pytest.mark.slow  # 20 s: eight worker processes start.
def test_evaluators_keep_their_workers_between_evaluations_and_the_run_ends_them(
    tmp_path, sorted_digits_folder
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'folder',
          'data_dir': sorted_digits_folder,
          'total_steps': 4,
          'eval_every_steps': 2,
          'data_workers': 2,
      },
  )
  config.evals.fewshot_run = dict(type='fewshot', every_steps=2, shots=(1,), seeds=1, l2_reg=4.0)
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  evaluator = {e.name: e for e in setup.evaluators}['eval']
  params = helpers.random_params(setup.model, config.image_size)
  first = evaluator(params)
  workers = multiprocessing.active_children()
  assert len(workers) == 2
  assert evaluator(params) == first and multiprocessing.active_children() == workers
  metrics = loop.train_and_evaluate(setup)  # Two evaluations by each evaluator, then the end:
  assert not multiprocessing.active_children()  # no worker outlives the run.
  assert metrics['fewshot_run_1shot'] > 0


@pytest.mark.parametrize('named', [True, False])
def test_another_dataset_with_other_classes_is_a_one_line_error(
    tmp_path, data_dir, sorted_digits_folder, named
):
  """Named by its dataset (beside the digits), or by its data_dir alone: another image folder than
  the run's, read as the run's dataset (not the run's own folder, silently)."""
  for split in ('train', 'test'):  # An image folder's classes are its train split's sub-folders.
    for name in ('cat', 'dog', 'eel'):
      (tmp_path / 'other' / split / name).mkdir(parents=True)
      Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(
          tmp_path / 'other' / split / name / '0.png'
      )
  run_data = (
      {'data_dir': data_dir} if named else {'dataset': 'folder', 'data_dir': sorted_digits_folder}
  )
  config = helpers.load_config('demo', {**helpers.TINY, **run_data})
  config.evals.other = dict(
      type='classification', data_dir=str(tmp_path / 'other'), split='test', every_steps=4
  )
  if named:
    config.evals.other.dataset = 'folder'
  with pytest.raises(
      ValueError,
      match=r"^Evaluator 'other': dataset 'folder' has 3 classes "
      r"\(cat, dog, eel\.\.\.\), not the run's 10",
  ) as error:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(error.value) and not (tmp_path / 'run').exists()


def test_a_dataset_of_some_of_the_runs_classes_is_measured_on_their_logits(
    tmp_path, data_dir, sorted_digits_folder
):
  """An image folder of the digits 7, 3 and 5 alone (as ImageNet-R holds 200 of ImageNet's classes,
  named as it names them): top-1 and loss of the logits of those three, as computed from the run's own
  predictions on the whole test split (the confusion tool's)."""
  some = (7, 3, 5)
  for digit in some:  # No train/ beside it, as ImageNet-R is downloaded.
    shutil.copytree(f'{sorted_digits_folder}/test/{digit}', tmp_path / 'some' / 'test' / str(digit))
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'total_steps': 4,
          'eval_every_steps': 4,
          'data_workers': 0,
      },
  )
  config.evals.some = dict(
      type='classification',
      dataset='folder',
      data_dir=str(tmp_path / 'some'),
      split='test',
      every_steps=4,
  )
  workdir = str(tmp_path / 'run')
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  logged = helpers.read_scalars(workdir)
  predictions, _, _ = confusion.predict_split(workdir, None, 'test')
  ordered = sorted(some)  # An image folder's classes: its sub-folders' names, sorted.
  kept = np.isin(predictions.labels, ordered)
  probabilities = predictions.probabilities[kept][:, ordered]
  labels = np.searchsorted(ordered, predictions.labels[kept])
  assert len(labels) == len(list((tmp_path / 'some' / 'test').rglob('*.png')))  # Those images.
  assert logged['some_top1'][4] == pytest.approx(
      np.mean(probabilities.argmax(-1) == labels), abs=1e-6
  )
  expected_loss = np.mean(
      -np.log(probabilities[np.arange(len(labels)), labels] / probabilities.sum(-1))
  )
  assert logged['some_loss'][4] == pytest.approx(expected_loss, rel=1e-4)
  assert logged['some_top5'][4] == 1.0  # Of three classes.


def test_an_evaluator_at_another_image_size_measures_the_resized_model(tmp_path, data_dir):
  """A run at 8 px measured at 16 px as it trains (its embeddings resized as the model runs), and
  its checkpoint fine-tuned to 16 px with no step (resized once on the host, as config.init_from
  does): the same metrics."""
  config = helpers.load_config(
      'demo',
      {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 4, 'eval_every_steps': 4},
  )
  config.evals.at16 = dict(type='classification', split='test', every_steps=4, image_size=16)
  run = str(tmp_path / 'run')
  loop.train_and_evaluate(train_setup.prepare(config, run))
  logged = helpers.read_scalars(run)
  assert logged['at16_top1'][4] != logged['eval_top1'][4] or (
      logged['at16_loss'][4] != logged['eval_loss'][4]
  )
  resized = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'image_size': 16,
          'init_from': run,
          'keep_head': True,
          'total_steps': 0,
      },
  )
  loop.train_and_evaluate(train_setup.prepare(resized, str(tmp_path / 'resized')))
  reference = helpers.read_scalars(str(tmp_path / 'resized'))
  assert logged['at16_top1'][4] == pytest.approx(reference['eval_top1'][0], abs=1e-6)
  assert logged['at16_loss'][4] == pytest.approx(reference['eval_loss'][0], rel=1e-5)


@pytest.mark.parametrize(
    'image_size,message',
    [
        (
            10,
            r"^Evaluator 'hi': image_size=10 must be a multiple of the patch size 4 \(in input "
            r'pixels\) of ViT-testing_4, e.g. 16$',
        ),
        ('16', r"image_size='16' must be a multiple"),
    ],
)
def test_an_image_size_the_patches_do_not_divide_is_a_one_line_error(
    tmp_path, data_dir, image_size, message
):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.hi = dict(type='classification', split='test', every_steps=4, image_size=image_size)
  with pytest.raises(ValueError, match=message):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_an_evaluator_at_another_patch_size_measures_the_resampled_model(tmp_path, data_dir):
  """A run at patch 4 on 8 px measured as it trains at patch 2 (a 4x4 grid) and at patch 8 on 16 px
  (its 2x2 grid, FlexiViT's), its patch embedding resampled as the model runs; the checkpoint
  fine-tuned to each with no step (resampled once on the host, as config.init_from does): the same
  metrics."""
  config = helpers.load_config(
      'demo',
      {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 4, 'eval_every_steps': 4},
  )
  config.patch_interpolation = 'bicubic'
  config.evals.p2 = dict(type='classification', split='test', every_steps=4, patch_size=2)
  config.evals.p8 = dict(
      type='classification', split='test', every_steps=4, patch_size=8, image_size=16
  )
  run = str(tmp_path / 'run')
  loop.train_and_evaluate(train_setup.prepare(config, run))
  logged = helpers.read_scalars(run)
  for name, patch_size, image_size in (('p2', 2, 8), ('p8', 8, 16)):
    assert logged[f'{name}_loss'][4] != logged['eval_loss'][4]
    resampled = helpers.load_config(
        'demo',
        {
            **helpers.TINY,
            'data_dir': data_dir,
            'image_size': image_size,
            'model.patch_size': patch_size,
            'patch_interpolation': 'bicubic',
            'init_from': run,
            'keep_head': True,
            'total_steps': 0,
        },
    )
    workdir = str(tmp_path / name)
    loop.train_and_evaluate(train_setup.prepare(resampled, workdir))
    reference = helpers.read_scalars(workdir)
    assert logged[f'{name}_top1'][4] == pytest.approx(reference['eval_top1'][0], abs=1e-6)
    assert logged[f'{name}_loss'][4] == pytest.approx(reference['eval_loss'][0], rel=1e-5)


@pytest.mark.parametrize(
    'fields,message',
    [
        (
            {'patch_size': 3},
            r"^Evaluator 'hi': image_size=8 must be a multiple of the patch size 3 \(in input "
            r'pixels\) of patch_size=3, e.g. 6$',
        ),
        (
            {'patch_size': 0},
            r"^Evaluator 'hi': patch_size=0 must be a whole number of pixels, e.g. 8$",
        ),
        ({'patch_size': '2'}, r"patch_size='2' must be a whole number"),
        (
            {'patch_size': 2, 'image_size': 9},
            r'image_size=9 must be a multiple of the patch size 2',
        ),
    ],
)
def test_a_patch_size_the_images_do_not_divide_into_is_a_one_line_error(
    tmp_path, data_dir, fields, message
):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.hi = dict(type='classification', split='test', every_steps=4, **fields)
  with pytest.raises(ValueError, match=message):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


def test_subset_indices_are_where_the_run_has_each_class():
  assert split_evaluator.subset_indices(('b', 'a'), ('a', 'b', 'c')) == (1, 0)
  assert split_evaluator.subset_indices(('a', 'd'), ('a', 'b', 'c')) is None
  assert split_evaluator.subset_indices(('a', 'a'), ('a', 'b', 'c')) is None


@pytest.mark.parametrize('eval_batch_size', [64, 8])  # 360 examples: padding rows, or none.
def test_real_top1_is_the_prediction_in_the_label_set_over_labelled_images(
    data_dir, real_dir, eval_batch_size
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'eval_batch_size': eval_batch_size,
      },
  )
  config.evals.real = dict(type='real', dataset='real_digits', data_dir=real_dir, every_steps=4)
  info = data.get_info(config)
  task = tasks.get(config.task)
  model = task.make_model(config, helpers.model_config(config), info.num_classes)
  context = evaluators.Context(
      config, info, task, model, sharding.make_mesh(config.mesh), helpers.model_config(config)
  )
  (real,) = [e for e in evaluators.make_evaluators(context) if e.name == 'real']
  params = helpers.random_params(model, config.image_size)
  metrics = real(params)

  # timm's RealLabelsImagenet, in NumPy, on logits of the same images applied one batch at a time.
  images = np.stack(
      [
          preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=config.image_size)
          for image in VALIDATION_IMAGES
      ]
  )
  logits = np.asarray(
      jax.jit(lambda x: model.apply({'params': params}, on_device.model_input(x), train=False))(
          images
      )
  )
  top5 = np.argsort(-logits, axis=-1)[:, :5]
  label_sets = [real_label_set(key, int(label)) for key, label in enumerate(VALIDATION_LABELS)]
  labelled = [(p, s) for p, s in zip(top5, label_sets) if s]
  assert len(labelled) == 270
  assert metrics['top1'] == pytest.approx(np.mean([p[0] in s for p, s in labelled]))
  assert metrics['top5'] == pytest.approx(np.mean([any(c in s for c in p) for p, s in labelled]))
  # The test tells: counting the unlabelled images, or the original labels, gives another number.
  assert metrics['top1'] != pytest.approx(np.mean([p[0] in s for p, s in zip(top5, label_sets)]))
  assert metrics['top1'] != pytest.approx(np.mean(top5[:, 0] == VALIDATION_LABELS))

  # On a single-label feature, every image has a set of one: the usual top-1.
  config.evals.real.label_feature = 'original_label'
  (real,) = [e for e in evaluators.make_evaluators(context) if e.name == 'real']
  assert real(params)['top1'] == pytest.approx(np.mean(top5[:, 0] == VALIDATION_LABELS))


@pytest.mark.parametrize(
    'where, error',
    [
        (
            {'dataset': 'digits'},
            r"^Dataset 'digits' has no ClassLabel \(or Sequence of ClassLabel\) feature "
            r"'real_label': set --config.label_feature \(or the evaluator's "
            r"label_feature\) to 'label'$",
        ),
        (
            {'dataset': 'folder'},
            r'^An image folder has one class an image, not a label feature '
            r"'real_label': read it from a tensorflow_datasets dataset that has it$",
        ),
        (
            {'task': 'mpp'},
            r"^Evaluator 'real' of type 'real' measures a classifier, but "
            r"config.task='mpp': drop config.evals.real$",
        ),
        (
            {'label_feature': 'file_name'},
            r"^Dataset 'real_digits' has no .* feature 'file_name': set "
            r"--config.label_feature \(or the evaluator's label_feature\) to "
            r"one of its ClassLabel features \['original_label'\] or label "
            r"sets \['real_label'\]$",
        ),
    ],
)
def test_real_on_a_dataset_without_label_sets_is_a_one_line_error(
    tmp_path, data_dir, real_dir, where, error
):
  task = where.pop('task', 'classification')
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'task': task,
          # An MPP run has no head to drop out before.
          **({'model.head_dropout_rate': None} if task == 'mpp' else {}),
      },
  )
  config.evals.real = {
      'type': 'real',
      'dataset': 'real_digits',
      'data_dir': real_dir,
      'every_steps': 4,
      **where,
  }
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


def test_a_classification_evaluator_reads_its_label_feature(data_dir, real_dir):
  # real_digits' validation split is the digits' test split, its 'original_label' their 'label'.
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.original = dict(
      type='classification',
      dataset='real_digits',
      data_dir=real_dir,
      split='validation',
      label_feature='original_label',
      every_steps=4,
  )
  original, model = helpers.evaluator(config, 'original')
  evaluator, _ = helpers.evaluator(config, 'eval')
  params = helpers.random_params(model, config.image_size)
  assert original(params) == pytest.approx(evaluator(params))
  # A feature the dataset lacks is a one-line error at the start.
  config.evals.original = dict(
      type='classification', split='test', label_feature='real_label', every_steps=4
  )
  with pytest.raises(ValueError, match=r"^Dataset 'digits' has no .* feature 'real_label'"):
    helpers.evaluator(config, 'original')
  # A label set is the real evaluator's: at the start, not a shape error at the first evaluation.
  config.evals.original = dict(
      type='classification',
      dataset='real_digits',
      data_dir=real_dir,
      split='validation',
      label_feature='real_label',
      every_steps=4,
  )
  with pytest.raises(
      ValueError,
      match=r"^Evaluator 'original': label_feature='real_label' is a set of "
      r"classes an image: measure it with type='real'",
  ):
    helpers.evaluator(config, 'original')


@pytest.mark.parametrize('loss', ['softmax_xent', 'sigmoid_xent'])
def test_eval_loss_is_the_runs_loss_over_every_image(data_dir, loss):
  # 360 test images in batches of 64 (on make test's 8 devices): the last batch has padding rows.
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'loss': loss,
          'label_smoothing': 0.1,
          'eval_batch_size': 64,
      },
  )
  evaluator, model = helpers.evaluator(config, 'eval')
  params = helpers.random_params(model, config.image_size)
  metrics = evaluator(params)

  images = np.stack(
      [
          preprocess.eval_preprocess(image, pp_eval=config.pp_eval, image_size=config.image_size)
          for image in VALIDATION_IMAGES
      ]
  )
  logits = np.asarray(
      jax.jit(lambda x: model.apply({'params': params}, on_device.model_input(x), train=False))(
          images
      ),
      np.float64,
  )
  targets = np.eye(10)[VALIDATION_LABELS]  # Unsmoothed: the loss of the labels themselves.
  if loss == 'softmax_xent':
    log_probs = logits - scipy.special.logsumexp(logits, axis=-1, keepdims=True)
    want = -np.sum(targets * log_probs, axis=-1)
  else:  # Summed over the classes, as the train loss.
    want = np.sum(np.logaddexp(0, logits) - targets * logits, axis=-1)
  assert metrics['loss'] == pytest.approx(np.mean(want), rel=1e-5)
  assert metrics['top1'] == pytest.approx(np.mean(logits.argmax(-1) == VALIDATION_LABELS))


@pytest.mark.parametrize(
    'evals, error',
    [
        (
            {'eval_split': 'test[:0]'},
            "'eval': split 'test[:0]' has no examples: set --config.eval_split",
        ),
        (
            {'evals.minival': {'type': 'classification', 'split': 'train[:0]', 'every_steps': 2}},
            "'minival': split 'train[:0]' has no examples: set config.evals.minival.split",
        ),
    ],
)
def test_an_evaluator_of_an_empty_split_is_a_one_line_error_at_the_start(
    tmp_path, data_dir, evals, error
):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  for field, value in evals.items():
    if field.startswith('evals.'):
      config.evals[field.partition('.')[2]] = value
    else:
      config[field] = value
  with pytest.raises(ValueError, match=re.escape(error)):
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
    'extra, error',
    [
        (
            dict(type='classification', split='test'),
            r"^Evaluator 'x' needs every_steps: its required fields are type, split, every_steps \(optional: ",
        ),
        (dict(type='classification', every_steps=4), r"^Evaluator 'x' needs split: "),
        (dict(type='fewshot', every_steps=4, shots=(1,)), r"^Evaluator 'x' needs seeds, l2_reg: "),
        (dict(type='real', dataset='real_digits'), r"^Evaluator 'x' needs every_steps: "),
    ],
)
def test_an_evaluator_missing_a_required_field_is_a_one_line_error(
    tmp_path, data_dir, extra, error
):
  # Each of these was a bare AttributeError naming only the field, e.g. "'every_steps'".
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.x = extra
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


@pytest.mark.parametrize(
    'name, error',
    [
        (
            'train',
            r'^config.evals.train: its train_loss would overwrite the training loss the loop logs',
        ),
        (
            'eval_polyak',
            r'^config.evals.eval_polyak: names ending in _polyak are those of the metrics of '
            r'the Polyak average',
        ),
        ('minival_polyak', r'^config.evals.minival_polyak: names ending in _polyak'),
    ],
)
def test_an_evaluator_whose_metrics_would_overwrite_others_is_a_one_line_error(
    tmp_path, data_dir, name, error
):
  # An evaluator 'train' logged its loss as train_loss, over the loop's training loss at the same steps;
  # one named 'eval_polyak' its top-1 as eval_polyak_top1, over the eval Polyak average's.
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, 'polyak_decay': 0.5})
  config.evals.minival = dict(type='classification', split='train[90%:]', every_steps=4)
  config.evals[name] = dict(type='classification', split='train[:64]', every_steps=4)
  with pytest.raises(ValueError, match=error) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


def test_real_on_a_split_without_labelled_images_is_nan_not_zero(data_dir, real_dir):
  # A mean over no images is undefined: 0.0 read as a (worst) accuracy, and a loss of 0.0 as the best.
  records = RealDigits(data_dir=real_dir).as_data_source(split='validation')
  first_unlabelled = next(i for i in range(len(records)) if not len(records[i]['real_label']))
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.real = dict(
      type='real',
      dataset='real_digits',
      data_dir=real_dir,
      every_steps=4,
      split=f'validation[{first_unlabelled}:{first_unlabelled + 1}]',
  )
  real, model = helpers.evaluator(config, 'real')
  metrics = real(helpers.random_params(model, config.image_size))
  assert list(metrics) == ['top1', 'top5'] and all(np.isnan(v) for v in metrics.values()), metrics
