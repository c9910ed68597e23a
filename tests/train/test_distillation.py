"""config.distill: a teacher loaded from a vit_jax workdir into the run's step, on its mesh, and the
one-line errors. DeiT's formulas against DeiT's code, and teachers from timm: *_vs_torch.py."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest
from PIL import Image

import helpers
from vit_jax import sharding
from vit_jax.checkpoints import checkpoint, run_dir
from vit_jax.data import on_device
from vit_jax.tasks import distillation
from vit_jax.train import loop, setup as train_setup
from vit_jax.train import state as train_state
from vit_jax.train import step as train_step


def _config(**overrides):
  return helpers.load_config('demo', {**helpers.TINY, **overrides})


def _batches(n: int = 2) -> list[dict]:
  rng = np.random.RandomState(0)
  return [
      {
          'image': rng.randint(0, 256, (16, 8, 8, 3)).astype(np.uint8),
          'label': rng.randint(0, 10, 16).astype(np.int32),
      }
      for _ in range(n)
  ]


def test_a_workdir_teacher_runs_in_the_step_and_alpha_weighs_its_loss(trained_tiny_run, tmp_path):
  """alpha 0: the labels' loss alone, the losses of the run without a teacher; alpha 1 through the
  distillation token's head: the distillation loss alone, other losses (soft: the zero heads' uniform
  logits give every hard target the same loss, ln 10, and the teacher's softmax a KL of its own)."""
  plain, _ = helpers.train_losses(
      train_setup.prepare(_config(), str(tmp_path / 'plain')), _batches()
  )
  run = train_setup.prepare(
      _config(**{'distill.teacher': trained_tiny_run, 'distill.alpha': 0.0}), str(tmp_path / 'a0')
  )
  assert 'of step 12 of' in run.teacher.source
  np.testing.assert_allclose(helpers.train_losses(run, _batches())[0], plain, rtol=1e-6)
  distilled = train_setup.prepare(
      _config(
          **{
              'distill.teacher': trained_tiny_run,
              'distill.alpha': 1.0,
              'distill.kind': 'soft',
              'model.distilled': True,
              'label_smoothing': 0.0,  # Of the labels' loss, weighed 0.
          }
      ),
      str(tmp_path / 'a1'),
  )
  losses, _ = helpers.train_losses(distilled, _batches())
  assert np.all(np.isfinite(losses)) and not np.allclose(losses, plain, rtol=1e-3)


@pytest.mark.parametrize('size,teacher_size', [(28, 40), (40, 24), (240, 384), (384, 240)])
def test_the_teachers_images_are_the_students_resized_as_pil_resizes(size, teacher_size):
  """teacher_input against PIL's BILINEAR resize of each float channel: up, down (its filter widened
  by the factor), whole and fractional factors."""
  images = np.random.default_rng(size).uniform(-1, 1, (2, size, size, 3)).astype(np.float32)
  expected = [
      [
          np.asarray(
              Image.fromarray(image[..., c], 'F').resize((teacher_size,) * 2, Image.BILINEAR)
          )
          for c in range(3)
      ]
      for image in images
  ]
  np.testing.assert_allclose(
      distillation.teacher_input(images, teacher_size),
      np.moveaxis(np.array(expected), 1, -1),
      atol=1e-4,
  )


def test_a_teacher_at_its_own_image_size_sees_the_students_images_resized(
    trained_tiny_run, tmp_path
):
  """distill.teacher_image_size=16: the 8 px run's teacher gets 4x4 position embeddings (resized
  from its 2x2) and the loss is the KL of its logits of the PIL-resized images, the student's of its
  own, computed by NumPy."""
  run = train_setup.prepare(
      _config(
          **{
              'distill.teacher': trained_tiny_run,
              'distill.teacher_image_size': 16,
              'distill.kind': 'soft',
              'distill.alpha': 1.0,
              'label_smoothing': 0.0,
          }
      ),
      str(tmp_path / 'w'),
  )
  teacher = run.teacher
  assert teacher.params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 17, 32)
  student_params = run_dir.load_trained(trained_tiny_run).params
  batch = _batches(1)[0]
  images = on_device.model_input(batch['image'])
  key = jax.random.key(3)
  loss = run.task.make_loss(run.config, run.model, teacher.model)(
      student_params, images, batch['label'], key, teacher.params
  )
  resized = np.array(
      [
          [
              np.asarray(
                  Image.fromarray(np.asarray(image[..., c]), 'F').resize((16, 16), Image.BILINEAR)
              )
              for c in range(3)
          ]
          for image in images
      ]
  )
  teacher_logits = teacher.model.apply(
      {'params': teacher.params}, np.moveaxis(resized, 1, -1), train=False
  )
  student_logits = run.model.apply(
      {'params': student_params}, images, train=True, rngs={'dropout': key}
  )
  log_p = np.asarray(jax.nn.log_softmax(teacher_logits), np.float64)
  log_q = np.asarray(jax.nn.log_softmax(student_logits), np.float64)
  expected = np.sum(np.exp(log_p) * (log_p - log_q)) / log_p.size
  np.testing.assert_allclose(float(loss), expected, rtol=1e-4)


def test_a_teacher_evaluator_measures_the_teacher_once_as_its_own_run_measured_it(
    trained_tiny_run, tmp_path
):
  """type='teacher' on the split the teacher's run evaluated: its run's last eval metrics, at every
  evaluation while the student trains, loaded once (the step's teacher), with no _polyak twin."""
  config = _config(
      **{
          'distill.teacher': trained_tiny_run,
          'total_steps': 2,
          'eval_every_steps': 1,
          'polyak_decay': 0.9,
      }
  )
  config.evals.teacher = dict(type='teacher', split='test', every_steps=1)
  run = train_setup.prepare(config, str(tmp_path / 'w'))
  evaluator = next(e for e in run.evaluators if e.name == 'teacher')
  context = evaluator._context  # pylint: disable=protected-access
  assert context.teacher() is run.teacher  # Read once, for the step and the evaluator.
  loaded = []
  evaluator._context = dataclasses.replace(  # pylint: disable=protected-access
      context, teacher=lambda: loaded.append(1) or run.teacher
  )
  metrics = loop.train_and_evaluate(run)
  teachers_run = helpers.read_scalars(trained_tiny_run)
  logged = helpers.read_scalars(str(tmp_path / 'w'))
  for metric in ('top1', 'top5', 'loss'):
    expected = teachers_run[f'eval_{metric}'][max(teachers_run[f'eval_{metric}'])]
    assert sorted(logged[f'teacher_{metric}']) == [1, 2]
    for value in logged[f'teacher_{metric}'].values():
      assert value == pytest.approx(expected, rel=1e-6)
  assert loaded == [1]  # Measured once.
  assert 'eval_polyak_top1' in metrics and not any('teacher_polyak' in name for name in logged)


def test_a_teacher_of_the_same_classes_in_another_order_predicts_in_the_runs_order(
    trained_tiny_run, tmp_path
):
  """Its head permuted by class name, as config.keep_head's: read in its own order, logit i was the
  teacher's class i, another class of the run (the teacher scored 0.30 where its run measured 1.0).
  """
  from vit_jax.checkpoints import teacher as teacher_lib  # pylint: disable=g-import-not-at-top

  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  info_file = os.path.join(workdir, 'dataset_info.json')
  info = json.load(open(info_file))
  run_order = info['class_names']
  info['class_names'] = run_order[::-1]  # The teacher's head: class i is the run's 9 - i.
  json.dump(info, open(info_file, 'w'))
  config = _config(**{'distill.teacher': workdir})
  own = teacher_lib.load_teacher(config, 10)  # No class names to order by: its own order.
  reordered = teacher_lib.load_teacher(config, 10, run_order)
  for name in ('kernel', 'bias'):
    np.testing.assert_array_equal(
        reordered.params['head'][name], np.asarray(own.params['head'][name])[..., ::-1]
    )


def test_a_resume_distils_from_the_teacher_checkpoint_its_first_start_read(
    trained_tiny_run, tmp_path, data_dir
):
  """The teacher's run went on (a checkpoint 16 since): the resume read it, and its state was not an
  uninterrupted run's. A new run reads the latest; distill.teacher_step picks one."""
  teacher = helpers.copy_of(trained_tiny_run, tmp_path)
  overrides = {'data_dir': data_dir, 'distill.teacher': teacher, 'total_steps': 2}
  workdir = str(tmp_path / 'student')
  first = train_setup.prepare(_config(**overrides), workdir)
  assert first.config.distill.teacher_step == 12 and 'step 12 of' in first.teacher.source
  loop.train_and_evaluate(first)
  shutil.copytree(
      os.path.join(teacher, 'checkpoints', '12'), os.path.join(teacher, 'checkpoints', '16')
  )
  resumed = train_setup.prepare(_config(**{**overrides, 'total_steps': 4}), workdir)
  assert resumed.config.distill.teacher_step == 12 and 'step 12 of' in resumed.teacher.source
  fresh = train_setup.prepare(_config(**overrides), str(tmp_path / 'other'))
  assert fresh.config.distill.teacher_step == 16
  chosen = train_setup.prepare(
      _config(**overrides, **{'distill.teacher_step': 8}), str(tmp_path / 'chosen')
  )
  assert 'step 8 of' in chosen.teacher.source


def test_a_teacher_trained_at_another_size_is_named_with_the_field_that_runs_it_there(
    trained_tiny_run, tmp_path, caplog
):
  caplog.set_level('INFO')
  overrides = {'distill.teacher': trained_tiny_run, 'image_size': 16}
  train_setup.prepare(_config(**overrides), str(tmp_path / 'w'))
  assert (
      "was trained at 8 px and runs at the run's 16 px, its position embeddings resized: "
      '--config.distill.teacher_image_size=8 runs it at its own' in caplog.text
  )
  caplog.clear()
  run = train_setup.prepare(
      _config(**overrides, **{'distill.teacher_image_size': 8}), str(tmp_path / 'w')
  )
  assert 'was trained at' not in caplog.text and 'at 8 px: ' in caplog.text
  # Its own size: the checkpoint's position embeddings as they are.
  np.testing.assert_array_equal(
      run.teacher.params['Transformer']['posembed_input']['pos_embedding'],
      run_dir.load_trained(trained_tiny_run).params['Transformer']['posembed_input'][
          'pos_embedding'
      ],
  )


@pytest.mark.devices(8)
def test_the_teacher_is_sharded_by_the_students_rules_on_a_tensor_mesh(trained_tiny_run, tmp_path):
  run = train_setup.prepare(
      _config(**{'distill.teacher': trained_tiny_run, 'mesh': (('data', 4), ('tensor', 2))}),
      str(tmp_path / 'w'),
  )
  state, shardings, _ = train_state.create_state(run, checkpoint.make_manager(run.workdir, 1))
  step = train_step.jit_train_step(run, shardings)
  _, metrics = step(state, sharding.global_batch(_batches(1)[0], run.mesh))
  assert np.isfinite(float(metrics['train_loss']))


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'distill.alpha': 0.3},
            r'^config.distill.alpha=0.3 has no teacher to distil from: set '
            r'--config.distill.teacher=',
        ),
        ({'distill.kind': 'kl'}, r"^config.distill.kind='kl' has no teacher"),
        ({'distill.teacher_step': 8}, r'^config.distill.teacher_step=8 has no teacher'),
        (
            {'distill.teacher': 'teacher.npz', 'distill.teacher_step': 8},
            r'^config.distill.teacher_step=8 picks a checkpoint of a vit_jax workdir',
        ),
        (  # Unread: the labels' loss is weighed 0.
            {'distill.teacher': 'TEACHER', 'distill.alpha': 1.0, 'label_smoothing': 0.1},
            r'^config.label_smoothing=0.1 smooths the labels. loss, which config.distill.alpha=1.0 '
            'weighs 0',
        ),
        (  # As `--config.distill.teacher=$TEACHER` with TEACHER unset: it trained without one.
            {'distill.teacher': '', 'distill.kind': 'soft'},
            r'^config.distill.teacher is empty: set it to the teacher run.s WORKDIR',
        ),
        (
            {'distill.teacher': 'TEACHER', 'distill.kind': 'l2'},
            r"^Unknown config.distill.kind 'l2': use one of hard, soft, kl$",
        ),
        (
            {'distill.teacher': 'TEACHER', 'distill.alpha': 1.5},
            r'^config.distill.alpha=1.5 must be in \[0, 1\]',
        ),
        (
            {'distill.teacher': 'TEACHER', 'distill.temperature': 0.0},
            r'^config.distill.temperature=0.0 must be positive',
        ),
        (  # The default kind, 'hard', takes the teacher's top class: no temperature.
            {'distill.teacher': 'TEACHER', 'distill.temperature': 3.0},
            r"^config.distill.temperature=3.0 softens .* distill.kind='hard' takes its top class: "
            r'set --config.distill.kind=soft',
        ),
        (
            {'distill.teacher': 'TEACHER', 'task': 'mpp', 'model.head_dropout_rate': None},
            r"^config.distill.teacher distils a classifier's predictions, which config.task='mpp'",
        ),
        (
            {
                'distill.teacher': 'TEACHER',
                'task': 'mae',
                'model.head_dropout_rate': None,
                'label_smoothing': 0.0,
            },
            r"^config.distill.teacher distils a classifier's predictions, which config.task='mae'",
        ),
        (
            {'distill.teacher': 'teacher.npz'},
            r"^config.distill.teacher='teacher.npz': an .npz that is not a plain ViT's does not "
            r'say its model; pass the workdir',
        ),
        (
            {'evals': {'t': {'type': 'teacher', 'split': 'test', 'every_steps': 1}}},
            r"^Evaluator 't' of type 'teacher' measures config.distill.teacher, which is unset: "
            r'set --config.distill.teacher=WORKDIR',
        ),
        (
            {'distill.teacher': 'TEACHER', 'distill.teacher_image_size': 0},
            r'^config.distill.teacher_image_size=0 must be positive, e.g. 384',
        ),
        (
            {'distill.teacher': 'TEACHER', 'distill.teacher_image_size': 10},
            r"^config.distill.teacher='.+' cuts 4 px patches, which do not tile its 10 px images "
            r'\(config.distill.teacher_image_size\): set --config.distill.teacher_image_size to a '
            r'multiple of 4, e.g. 8$',
        ),
        (
            {'distill.teacher': 'TEACHER', 'image_size': 6, 'model.patch_size': 2},
            r"^config.distill.teacher='.+' cuts 4 px patches, which do not tile its 6 px images "
            r'\(config.image_size\): set --config.distill.teacher_image_size to a multiple of 4, '
            r'e.g. 4$',
        ),
    ],
    ids=[
        'alpha',
        'kind',
        'teacher_step_without_teacher',
        'teacher_step_of_a_file',
        'alpha_1_smoothing',
        'empty_teacher',
        'unknown_kind',
        'alpha_range',
        'temperature',
        'hard_temperature',
        'mpp',
        'mae',
        'npz',
        'teacher_evaluator',
        'teacher_image_size',
        'teacher_patches',
        'teacher_patches_of_the_run',
    ],
)
def test_distillation_knobs_without_effect_or_out_of_range_are_one_line_errors(
    trained_tiny_run, tmp_path, monkeypatch, overrides, message
):
  monkeypatch.chdir(tmp_path)
  np.savez(tmp_path / 'teacher.npz', x=np.zeros(1))
  overrides = {k: trained_tiny_run if v == 'TEACHER' else v for k, v in overrides.items()}
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(_config(**overrides), str(tmp_path / 'w'))
  assert '\n' not in str(error.value)
