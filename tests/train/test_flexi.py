"""FlexiViT training (vit_jax/train/flexi.py): each step's loss is the loss of the model at a drawn
patch size on parameters resampled to it (equal to adapt_params' host-side resampling), drawn by
the weights; the gradient reaches the stored kernel through the pseudo-inverse (its chain rule in
NumPy); a step keeps the activations of the drawn size alone; parameters kept at FlexiViT's own shapes (flexi.kernel_size, posemb_grid) load unresampled
and are fitted wherever they are used; a run resumes bit for bit; the errors."""

import functools

import jax
import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import adapting, npz_files, patch_resizing, run_dir
from vit_jax.train import flexi, loop, setup as train_setup

SIZES = (2, 4, 8)  # Of 8 px images, the parameters' at 4: grids of 4x4, 2x2 and 1x1.


def _setup(tmp_path, data_dir, **overrides):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'flexi.patch_sizes': SIZES,
          'patch_interpolation': 'bicubic',
          **overrides,
      },
  )
  return train_setup.prepare(config, str(tmp_path / 'run'))


def _batch(size: int = 8, n: int = 6):
  rng = np.random.default_rng(1)
  return rng.uniform(-1, 1, (n, size, size, 3)).astype(np.float32), rng.integers(0, 10, n)


def _resampled_losses(setup, params, images, labels, key):
  """The task's loss of the model at each size, on parameters resampled once on the host."""
  losses = {}
  for size in SIZES:
    model = setup.model.clone(patch_size=size)
    fitted, _ = adapting.adapt_params(
        params,
        adapting.param_shapes(model, setup.config.image_size),
        keep_head=True,
        keep_pre_logits=False,
        patch_method=setup.config.patch_interpolation,
    )
    loss = setup.task.make_loss(setup.config, model)
    losses[size] = float(loss(fitted, images, labels, key))
  return losses


# FlexiViT's way of keeping the parameters (its 32 px kernel and 7x7 grid): here an 8 px kernel and a
# 3x3 grid, neither model.patch_size's (4) nor the images' grid (2).
KEPT = {'flexi.kernel_size': 8, 'flexi.posemb_grid': 3}


@pytest.mark.parametrize('kept', [{}, KEPT], ids=['model_shapes', 'kept_shapes'])
def test_each_step_is_the_loss_of_the_model_at_a_drawn_patch_size(tmp_path, data_dir, kept):
  """Without dropout, the loss at each size is one number: every key's loss is one of them (the
  parameters resampled on the host), drawn 1:2:1 as the weights say."""
  setup = _setup(
      tmp_path,
      data_dir,
      **{
          'flexi.weights': (1.0, 2.0, 1.0),
          'model.dropout_rate': 0.0,
          'model.head_dropout_rate': 0.0,
          **kept,
      },
  )
  params = helpers.random_params(*adapting.kept_model(setup.config, setup.model))
  if kept:
    assert params['embedding']['kernel'].shape[:2] == (8, 8)
    assert params['Transformer']['posembed_input']['pos_embedding'].shape[1] == 3 * 3 + 1
  images, labels = _batch()
  expected = _resampled_losses(setup, params, images, labels, jax.random.key(0))
  assert len({round(v, 3) for v in expected.values()}) == len(SIZES)  # Tells them apart.
  loss_fn = flexi.make_loss(
      setup.config, setup.model, functools.partial(setup.task.make_loss, setup.config)
  )
  keys = jax.random.split(jax.random.key(1), 800)
  losses = np.asarray(jax.jit(jax.vmap(lambda k: loss_fn(params, images, labels, k)))(keys))
  drawn = np.array([min(SIZES, key=lambda s: abs(expected[s] - loss)) for loss in losses])
  np.testing.assert_allclose(losses, [expected[s] for s in drawn], rtol=1e-5)
  frequencies = [np.mean(drawn == size) for size in SIZES]
  np.testing.assert_allclose(frequencies, [0.25, 0.5, 0.25], atol=0.05)


def test_the_gradient_reaches_the_stored_kernel_through_the_resampling(tmp_path, data_dir):
  """A step drawn at patch 8: the stored 4x4 kernel's gradient is the 8x8 kernel's, pulled back
  through the pseudo-inverse resize, as NumPy's chain rule of its matrices computes it."""
  setup = _setup(tmp_path, data_dir, **{'flexi.weights': (1e-9, 1e-9, 1.0)})
  params = helpers.random_params(setup.model, 8)
  images, labels = _batch()
  key = jax.random.key(3)
  grads = jax.grad(
      flexi.make_loss(
          setup.config, setup.model, functools.partial(setup.task.make_loss, setup.config)
      )
  )(params, images, labels, key)
  model = setup.model.clone(patch_size=8)
  fitted, _ = adapting.adapt_params(
      params,
      adapting.param_shapes(model, 8),
      keep_head=True,
      keep_pre_logits=False,
      patch_method='bicubic',
  )
  expected = jax.grad(setup.task.make_loss(setup.config, model))(fitted, images, labels, key)
  pinv = patch_resizing.pinv_resize(4, 8, 'bicubic')  # (4, 8): the resize's pseudo-inverse.
  pulled_back = np.einsum(
      'hH,wW,HW...->hw...', pinv, pinv, np.asarray(expected['embedding']['kernel'], np.float64)
  )
  np.testing.assert_allclose(grads['embedding']['kernel'], pulled_back, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(
      grads['head']['kernel'], expected['head']['kernel'], rtol=1e-4, atol=1e-7
  )
  assert np.abs(pulled_back).max() > 1e-3


def test_a_step_needs_the_memory_of_the_smallest_patches_alone(tmp_path, data_dir):
  """Differentiated through the switch, a step would keep every size's activations (1.13x the
  smallest patches' here: grids of 16x16, 8x8 and 4x4); each branch's own backward pass keeps one's.
  """

  def temp_bytes(sizes):
    setup = _setup(
        tmp_path / str(sizes), data_dir, **{'image_size': 32, 'flexi.patch_sizes': sizes}
    )
    loss = flexi.make_loss(
        setup.config, setup.model, functools.partial(setup.task.make_loss, setup.config)
    )
    params = helpers.random_params(setup.model, 32)
    images, labels = _batch(32, 8)
    step = jax.jit(jax.value_and_grad(loss)).lower(params, images, labels, jax.random.key(0))
    return step.compile().memory_analysis().temp_size_in_bytes

  assert temp_bytes(SIZES) < 1.03 * temp_bytes(SIZES[:1])


def _kept_checkpoint(tmp_path, data_dir, overrides):
  """Random parameters of the shapes a run of `overrides` keeps, saved as tmp_path/flexivit.npz (as
  a FlexiViT's file, its 32 px kernel and 7x7 grid)."""
  plain = _setup(tmp_path / 'plain', data_dir, **overrides)
  checkpoint = helpers.random_params(*adapting.kept_model(plain.config, plain.model), seed=5)
  npz_files.save_npz(checkpoint, str(tmp_path / 'flexivit.npz'))
  return checkpoint


def test_parameters_kept_at_their_own_shapes_load_unresampled_and_are_fitted_where_used(
    tmp_path, data_dir
):
  """A checkpoint of the kept shapes (as FlexiViT's 32 px kernel and 7x7 grid) loads as it is; the
  run keeps those shapes; its evaluation measures them fitted to model.patch_size as the model runs,
  which is the evaluation of the parameters fitted once on the host; the tools read them fitted."""
  overrides = {**KEPT, 'total_steps': 4, 'eval_every_steps': 4, 'checkpoint_every_steps': 4}
  checkpoint = _kept_checkpoint(tmp_path, data_dir, overrides)
  setup = _setup(
      tmp_path, data_dir, **overrides, init_from=str(tmp_path / 'flexivit.npz'), keep_head=True
  )
  for kept in (('embedding', 'kernel'), ('Transformer', 'posembed_input', 'pos_embedding')):
    loaded, given = setup.init_params, checkpoint
    for key in kept:
      loaded, given = loaded[key], given[key]
    np.testing.assert_array_equal(loaded, given)  # Not resampled: FlexiViT's own tensors.

  loop.train_and_evaluate(setup)
  saved = helpers.checkpoint_params(setup.workdir, 4)
  assert saved['embedding']['kernel'].shape[:2] == (8, 8)
  assert saved['Transformer']['posembed_input']['pos_embedding'].shape[1] == 10
  fitted, _ = adapting.adapt_params(
      saved,
      adapting.param_shapes(setup.model, 8),
      keep_head=True,
      keep_pre_logits=False,
      posemb_method=setup.config.posemb_interpolation,
      patch_method=setup.config.patch_interpolation,
  )
  trained = run_dir.load_trained(setup.workdir)
  for got, want in zip(jax.tree.leaves(trained.params), jax.tree.leaves(fitted)):
    np.testing.assert_array_equal(got, want)
  # The run's own evaluation, fitting as it runs, is the evaluation of the fitted parameters by a run
  # that keeps model.patch_size's shapes.
  unkept = setup.config.copy_and_resolve_references()
  unkept.flexi.kernel_size = unkept.flexi.posemb_grid = None
  evaluator, _ = helpers.evaluator(unkept, 'eval')
  expected = evaluator(jax.tree.map(np.asarray, fitted))
  logged = helpers.read_scalars(setup.workdir)
  assert logged['eval_top1'][4] == pytest.approx(float(expected['top1']), abs=1e-6)
  assert logged['eval_loss'][4] == pytest.approx(float(expected['loss']), rel=1e-4)


def test_a_kept_kernel_read_from_a_file_is_not_the_runs_patch_size(tmp_path, data_dir):
  """variant='checkpoint' takes a file's patch size from its kernel: a kept one (FlexiViT's 32 px) says
  nothing of the size the run evaluates, which the user sets."""
  checkpoint = _kept_checkpoint(tmp_path, data_dir, KEPT)
  from_file = {
      **KEPT,
      **helpers.UNSET_SIZES,
      'variant': 'checkpoint',
      'init_from': str(tmp_path / 'flexivit.npz'),
  }
  with pytest.raises(
      ValueError,
      match=r"^config.flexi.kernel_size keeps config.init_from's 8 px patch kernel, which is not the "
      r'patch size the run evaluates: set it, one of config.flexi.patch_sizes, e.g. '
      r'--config.model.patch_size=4$',
  ):
    _setup(tmp_path, data_dir, **from_file)
  assert not (tmp_path / 'run').exists()
  setup = _setup(tmp_path, data_dir, **from_file, **{'model.patch_size': 2})
  assert setup.model_config['patch_size'] == 2 and setup.model_config['hidden_size'] == 32
  np.testing.assert_array_equal(
      setup.init_params['embedding']['kernel'], checkpoint['embedding']['kernel']
  )


@pytest.mark.slow  # Three runs of the loop, one resumed: make test-all's.
@pytest.mark.parametrize('kept', [{}, KEPT], ids=['model_shapes', 'kept_shapes'])
def test_a_flexi_run_trains_and_resumes_bit_exact(tmp_path, data_dir, kept):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'flexi.patch_sizes': SIZES,
          'total_steps': 8,
          'log_every_steps': 4,
          'eval_every_steps': 8,
          **kept,
      },
  )
  config.evals.p8 = dict(type='classification', split='test', every_steps=8, patch_size=8)
  # The backbone's evaluators too: they fit kept shapes as the split's does.
  config.evals.shots = dict(type='fewshot', every_steps=8, shots=(2,), seeds=1, l2_reg=4.0)
  config.evals.neighbours = dict(type='knn', every_steps=8, ks=(5,), temperature=0.07)
  full = str(tmp_path / 'full')
  metrics = loop.train_and_evaluate(train_setup.prepare(config, full))
  assert {'eval_top1', 'p8_top1', 'shots_2shot', 'neighbours_5nn'} <= set(metrics), metrics
  assert np.isfinite(helpers.read_scalars(full)['train_loss'][8])
  helpers.assert_resume_is_bit_exact(config, full, str(tmp_path / 'resumed'))


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'flexi.patch_sizes': (2, 3)},
            r'^config.flexi.patch_sizes has 3, which does not divide config.image_size=8: use sizes',
        ),
        (
            {'task': 'mpp', 'model.head_dropout_rate': None},
            r'^config.flexi.patch_sizes trains a ViT classifier at several patch sizes, and this run '
            r"is config.task='mpp': unset --config.flexi.patch_sizes$",
        ),
        ({'flexi.patch_sizes': (2, 0)}, r'^config.flexi.patch_sizes=\(2, 0\) must be distinct'),
        ({'flexi.weights': (1.0,)}, r'must be one positive number per patch size \(3\)'),
        (
            {'flexi.patch_sizes': (), 'flexi.kernel_size': 32},
            r'^config.flexi.kernel_size keeps the parameters of a FlexiViT run, and '
            r'config.flexi.patch_sizes is empty: set the patch sizes, or unset it$',
        ),
        (
            {'flexi.posemb_grid': 7, 'model.posemb': 'sincos2d'},
            r'^config.flexi.posemb_grid keeps learned position embeddings on a grid, and '
            r"model.posemb='sincos2d' has none: unset config.flexi.posemb_grid$",
        ),
    ],
)
def test_what_flexi_cannot_do_is_a_one_line_error(tmp_path, data_dir, overrides, message):
  with pytest.raises(ValueError, match=message):
    _setup(tmp_path, data_dir, **overrides)
  assert not (tmp_path / 'run').exists()
