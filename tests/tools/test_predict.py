"""Inference on image files: preprocessing as evaluation's, class names, bad files, exports, the command.

`trained_tiny_run` is the tiny run of the real loop that this file, test_pictures.py and test_fewshot.py
read: trained once per session, whichever file asks first.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax import data
from vit_jax.checkpoints import run_dir, saved_state
from vit_jax.tools import classifiers, export, predict
from vit_jax.data import on_device
from vit_jax.tasks import classification
from vit_jax.data import sources
from vit_jax.data import images

PREDICT_CMD = [sys.executable, '-m', 'vit_jax.tools.predict']


def _test_images(workdir, n):
  """The first `n` raw test images (uint8 8x8x3) and their eval batch's images as the eval step
  gives them to the model, in the eval pipeline's order."""
  config, _ = run_dir.load_run_info(workdir)
  source = sources.make_source(config)
  records = source.examples('test')
  raw = [
      images.rgb(images.pixels(source.load(records.read(k))['image'])) for k in range(n)
  ]  # Served grey.
  batch = next(data.eval_iterator(config, 'test', local_batch_size=n))
  return raw, on_device.model_input(jax.numpy.asarray(batch['image'])), config


def _saved_test_images(workdir, n, folder) -> list[str]:
  """The first `n` raw test images saved as PNGs in `folder`: their paths."""
  raw, _, _ = _test_images(workdir, n)
  for i, image in enumerate(raw):
    Image.fromarray(image).save(folder / f'{i}.png')
  return [str(folder / f'{i}.png') for i in range(n)]


def test_images_in_any_format_are_predicted_as_evaluation_sees_them(trained_tiny_run, tmp_path):
  raw, eval_images, config = _test_images(trained_tiny_run, 4)
  # The same pixels as RGB, greyscale (the digits are grey) and RGBA PNGs, and a BMP.
  Image.fromarray(raw[0]).save(tmp_path / 'rgb.png')
  Image.fromarray(raw[1][..., 0]).save(tmp_path / 'grey.png')
  Image.fromarray(raw[2]).convert('RGBA').save(tmp_path / 'rgba.png')
  Image.fromarray(raw[3]).save(tmp_path / 'image.bmp')
  paths = [str(tmp_path / name) for name in ('rgb.png', 'grey.png', 'rgba.png', 'image.bmp')]
  classifier = classifiers.load_run(trained_tiny_run)
  results = predict.predict(paths, classifier, top_k=10, batch_size=3)  # Two batches, one padded.

  model = classification.make_model(config, helpers.model_config(config), 10)
  params = saved_state.restore_params(saved_state.find_checkpoint(trained_tiny_run)[0])[0]
  expected = jax.nn.softmax(model.apply({'params': params}, eval_images))
  assert [path for path, _ in results] == paths
  for (_, top), probs in zip(results, np.asarray(expected)):
    assert [label for label, _ in top] == [str(i) for i in np.argsort(-probs, kind='stable')]
    np.testing.assert_allclose([p for _, p in top], np.sort(probs)[::-1], atol=1e-5)
  assert len(predict.predict(paths[:1], classifier, top_k=3)[0][1]) == 3


def test_unreadable_files_are_reported_in_one_line_each_and_skipped(
    trained_tiny_run, tmp_path, capsys
):
  raw, _, _ = _test_images(trained_tiny_run, 1)
  Image.fromarray(raw[0]).save(tmp_path / 'good.png')
  (tmp_path / 'corrupt.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 40)
  (tmp_path / 'empty.jpg').write_bytes(b'')
  paths = [str(tmp_path / name) for name in ('corrupt.png', 'good.png', 'empty.jpg', 'missing.png')]
  results = predict.predict(paths, classifiers.load_run(trained_tiny_run))
  assert [path for path, _ in results] == [str(tmp_path / 'good.png')]
  not_an_image = 'not an image format PIL reads'
  assert capsys.readouterr().err.splitlines() == [
      f'skipped: cannot decode {tmp_path}/corrupt.png: {not_an_image}',
      f'skipped: cannot decode {tmp_path}/empty.jpg: {not_an_image}',
      f'skipped: cannot read {tmp_path}/missing.png (No such file or directory)',
  ]


def test_folders_are_searched_recursively_for_images(tmp_path):
  for name in (
      'b/z.png',
      'b/a.JPG',
      'a.jpeg',
      'b/c/d.png',
      'notes.txt',
      'b/c/e.gif',
      'b/._z.png',
      '.ipynb_checkpoints/a.png',
  ):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes(b'')
  assert predict.find_images([str(tmp_path), str(tmp_path / 'notes.txt')]) == [
      f'{tmp_path}/a.jpeg',
      f'{tmp_path}/b/a.JPG',
      f'{tmp_path}/b/z.png',
      f'{tmp_path}/b/c/d.png',
      f'{tmp_path}/b/c/e.gif',  # The image folders' extensions (folder.IMAGE_EXTENSIONS).
      f'{tmp_path}/notes.txt',
  ]  # A file named explicitly is tried whatever its name.


def test_folders_reached_by_symbolic_links_are_searched_as_image_folders_search_them(tmp_path):
  (tmp_path / 'elsewhere').mkdir()
  (tmp_path / 'elsewhere/a.png').write_bytes(b'')
  (tmp_path / 'inputs').mkdir()
  (tmp_path / 'inputs/linked').symlink_to(tmp_path / 'elsewhere')
  assert predict.find_images([str(tmp_path / 'inputs')]) == [f'{tmp_path}/inputs/linked/a.png']
  (tmp_path / 'inputs/loop').symlink_to(tmp_path / 'inputs')
  with pytest.raises(ValueError, match=r'is a symbolic link to .*, which holds it'):
    predict.find_images([str(tmp_path / 'inputs')])


def test_an_export_predicts_what_its_run_predicts(trained_tiny_run, tmp_path):
  paths = _saved_test_images(trained_tiny_run, 3, tmp_path)
  export.export(trained_tiny_run, str(tmp_path / 'export'))
  from_export = predict.predict(paths, classifiers.load_export(str(tmp_path / 'export')), top_k=10)
  from_run = predict.predict(paths, classifiers.load_run(trained_tiny_run), top_k=10)
  for a, b in zip(from_export, from_run):
    assert a[0] == b[0] and [label for label, _ in a[1]] == [label for label, _ in b[1]]
    np.testing.assert_allclose([p for _, p in a[1]], [p for _, p in b[1]], atol=1e-5)
  # How an image file is decoded travels with the export (the digits: as PIL opens it).
  description = tmp_path / 'export/config.json'
  assert json.loads(description.read_text())['exif_orientation'] is False
  description.write_text(
      json.dumps({**json.loads(description.read_text()), 'exif_orientation': True})
  )
  assert classifiers.load_export(str(tmp_path / 'export')).exif_orientation


def test_a_run_predicts_at_another_size_and_patch_size(trained_tiny_run, tmp_path):
  """--image_size / --patch_size: each image prepared at that size for the model fitted to it."""
  paths = _saved_test_images(trained_tiny_run, 2, tmp_path)
  classifier = classifiers.load_run(trained_tiny_run, image_size=16, patch_size=8)
  assert classifier.image_size == 16
  results = predict.predict(paths, classifier, top_k=10)
  trained = run_dir.at_size(run_dir.load_trained(trained_tiny_run), 16, 8)
  inputs = np.stack([classifiers.read_model_input(path, classifier) for path in paths])
  assert inputs.shape == (2, 16, 16, 3)
  expected = jax.nn.softmax(trained.model.apply({'params': trained.params}, inputs, train=False))
  for (_, top), probs in zip(results, np.asarray(expected)):
    assert [label for label, _ in top] == [str(i) for i in np.argsort(-probs, kind='stable')]
    np.testing.assert_allclose([p for _, p in top], np.sort(probs)[::-1], atol=1e-5)


@pytest.mark.parametrize('loss', ['sigmoid_xent', 'asl'])
def test_a_sigmoid_trained_model_gets_independent_class_probabilities(loss):
  logits = np.array([[2.0, -1.0, 0.0]])
  np.testing.assert_allclose(
      classifiers.probabilities(logits, loss), 1 / (1 + np.exp(-logits)), rtol=1e-6
  )
  np.testing.assert_allclose(
      classifiers.probabilities(logits, 'softmax_xent'),
      np.exp(logits) / np.exp(logits).sum(),
      rtol=1e-6,
  )


def test_a_temperature_divides_a_softmax_models_logits(trained_tiny_run, tmp_path):
  """softmax(z / T) is softmax(log softmax(z) / T): the probabilities at T from those at 1."""
  raw, _, _ = _test_images(trained_tiny_run, 1)
  Image.fromarray(raw[0]).save(tmp_path / 'a.png')
  classifier = classifiers.load_run(trained_tiny_run)
  [(_, at_1)] = predict.predict([str(tmp_path / 'a.png')], classifier, top_k=10)
  [(_, at_2)] = predict.predict([str(tmp_path / 'a.png')], classifier, top_k=10, temperature=2.0)
  probabilities = np.array([p for _, p in sorted(at_1)], np.float64)
  expected = np.sqrt(probabilities) / np.sqrt(probabilities).sum()
  np.testing.assert_allclose([p for _, p in sorted(at_2)], expected, rtol=1e-4)
  assert [label for label, _ in at_2] == [label for label, _ in at_1]  # The same order.
  assert classifiers.softmax_trained(classifier.loss)
  assert not any(classifiers.softmax_trained(loss) for loss in ('sigmoid_xent', 'asl'))


def test_command_line_prints_the_top_labels_and_skips_bad_files(trained_tiny_run, tmp_path):
  raw, _, _ = _test_images(trained_tiny_run, 2)
  (tmp_path / 'in' / 'sub').mkdir(parents=True)
  Image.fromarray(raw[0]).save(tmp_path / 'in' / 'a.png')
  Image.fromarray(raw[1]).save(tmp_path / 'in' / 'sub' / 'b.jpg', quality=95)
  (tmp_path / 'in' / 'sub' / 'bad.png').write_text('not an image')
  run = subprocess.run(
      [*PREDICT_CMD, f'--workdir={trained_tiny_run}', '--top_k=2', str(tmp_path / 'in')],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  lines = run.stdout.splitlines()
  assert [lines[0], lines[3]] == [f'{tmp_path}/in/a.png', f'{tmp_path}/in/sub/b.jpg'] and len(
      lines
  ) == 6
  for line in lines[1:3] + lines[4:6]:
    probability, label = line.split()
    assert 0 <= float(probability) <= 1 and label in '0123456789'
  skipped = [line for line in run.stderr.splitlines() if 'bad.png' in line]
  assert skipped == [
      f'skipped: cannot decode {tmp_path}/in/sub/bad.png: not an image format PIL ' 'reads'
  ]


def test_command_line_exits_1_when_no_image_could_be_predicted(trained_tiny_run, tmp_path):
  (tmp_path / 'bad.png').write_text('not an image')
  run = subprocess.run(
      [
          *PREDICT_CMD,
          f'--workdir={trained_tiny_run}',
          str(tmp_path / 'bad.png'),
          str(tmp_path / 'missing.png'),
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 1, run.stderr[-2000:]
  assert run.stdout == ''
  assert run.stderr.splitlines()[-1].startswith('error: none of 2 image files could be predicted')


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--workdir=W', '--export=E', 'x.png'],
            '^error: pass exactly one of --workdir and --export',
        ),
        (['--export=E', '--step=3', 'x.png'], '^error: --step chooses a checkpoint of --workdir'),
        (['--workdir=W'], '^error: no images given'),
        (
            ['--export=E', '--patch_size=2', 'x.png'],
            '^error: an export runs at the size it was exported at',
        ),
        (['--workdir=W', '--image_size=0', 'x.png'], '^error: flag --image_size=0: must be'),
        (['--workdir=W', '--top_k=none', 'x.png'], '^error: flag --top_k=none'),
        (['--workdir=W', '--temperature=0', 'x.png'], '^error: --temperature=0.0 must be positive'),
        (
            ['--workdir=W', '--temperature=inf', 'x.png'],
            '^error: --temperature=inf must be positive',
        ),
    ],
)
def test_command_line_bad_input_is_one_line(args, message):
  run = subprocess.run(
      [*PREDICT_CMD, *args], cwd=helpers.REPO, capture_output=True, text=True, timeout=300
  )
  assert run.returncode == 2
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
  assert __import__('re').search(message, run.stderr), run.stderr


def test_a_run_without_a_classifier_is_a_clear_error(trained_tiny_run, tmp_path):
  config = json.loads(open(os.path.join(trained_tiny_run, 'config.json')).read())
  mpp_config = {**config, 'task': 'mpp', 'model': {**config['model'], 'head_dropout_rate': None}}
  (tmp_path / 'config.json').write_text(json.dumps(mpp_config))
  shutil.copy(os.path.join(trained_tiny_run, 'dataset_info.json'), tmp_path)
  os.symlink(os.path.join(trained_tiny_run, 'checkpoints'), tmp_path / 'checkpoints')
  with pytest.raises(ValueError, match="is a 'mpp' run, which has no classifier: fine-tune it"):
    classifiers.load_run(str(tmp_path))


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--threshold=0.5'],
            r'^error: --threshold picks a set of classes an image, of a model trained with a '
            r'sigmoid loss \(sigmoid_xent, asl\); this one was trained with softmax_xent: drop '
            r'--threshold$',
        ),
        (
            ['--threshold=0.5', '--thresholds=t.csv'],
            '^error: pass one of --threshold and --thresholds$',
        ),
    ],
)
def test_thresholds_on_a_model_of_one_class_an_image_are_one_line(
    trained_tiny_run, tmp_path, args, message
):
  Image.new('RGB', (8, 8)).save(tmp_path / 'x.png')
  run = subprocess.run(
      [*PREDICT_CMD, f'--workdir={trained_tiny_run}', *args, str(tmp_path / 'x.png')],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2, run.stderr[-2000:]
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
  assert __import__('re').search(message, run.stderr.strip()), run.stderr


@pytest.mark.parametrize('dataset,upright', [('huggingface', True), ('folder', False)])
def test_an_exif_rotated_file_is_predicted_as_the_runs_evaluation_decoded_it(
    tmp_path, dataset, upright
):
  """A Hugging Face dataset's images decode upright by their EXIF orientation (as `datasets` does),
  an image folder's as PIL opens them: predict, and an export's description, prepare a file as the
  run's evaluation did."""
  pixels = np.random.RandomState(0).randint(0, 256, (12, 20, 3), dtype=np.uint8)
  for split in ('train', 'test'):
    for name in ('cat', 'dog'):
      path = tmp_path / 'data' / split / name / 'rotated.jpg'
      path.parent.mkdir(parents=True)
      path.write_bytes(helpers.encoded(pixels, orientation=6))
  config = helpers.data_config(str(tmp_path / 'data'), dataset=dataset, image_size=8)
  source = sources.make_source(config)
  evaluated = classifiers.model_input(
      source.load(source.examples('test').read(0))['image'], 8, config.pp_eval.to_dict()
  )
  assert classifiers.exif_upright(config) == upright
  classifier = classifiers.Classifier(
      lambda x: x, 8, ('cat', 'dog'), pp_eval=config.pp_eval.to_dict(), exif_orientation=upright
  )
  path = str(tmp_path / 'data/test/cat/rotated.jpg')
  np.testing.assert_array_equal(classifiers.read_model_input(path, classifier), evaluated)
  turned = dataclasses.replace(classifier, exif_orientation=not upright)
  assert np.abs(classifiers.read_model_input(path, turned) - evaluated).max() > 0.1
