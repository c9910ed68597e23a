"""Training with low-rank adapters (model.lora_*): the adapters and the head train, the pretrained
weights stay as loaded and cost no weight gradient; config.optim.trained chooses otherwise; a run's
adapters fold into its kernels for the tools, for export and for a run that starts from it."""

import os
import shutil

import chex
import jax
import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import npz_files, run_dir, saved_state, teacher as teacher_lib
from vit_jax.models import lora
from vit_jax.tools import export
from vit_jax.train import loop, param_groups, setup as train_setup

ALL = ('query', 'key', 'value', 'out', 'mlp_in', 'mlp_out')


def _trained_after_four_steps(tmp_path, overrides):
  step, state, batch = helpers.jitted_step(
      tmp_path, {'optim.name': 'sgd', 'lr.base': 0.5, **overrides}
  )
  before = helpers.flat_params(state.params)
  # The head starts at zeros, so the first step trains it alone; b at the second; a from the third.
  for _ in range(4):
    state, _ = step(state, batch)
  after = helpers.flat_params(state.params)
  optimizer_state = sum(x.size for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0)
  return {p for p in after if not np.array_equal(after[p], before[p])}, after, optimizer_state


@pytest.mark.parametrize('scan', [False, True])
def test_the_adapters_and_the_head_train_and_the_rest_stays(tmp_path, scan):
  overrides = {'model.lora_rank': 4, 'model.lora_targets': ALL, 'model.scan': scan}
  changed, params, optimizer_state = _trained_after_four_steps(tmp_path, overrides)
  trained = {p for p in params if lora.ADAPTER_PATH.search(p) or p.startswith('head/')}
  assert changed == trained
  # SGD's momentum for the trained parameters alone: the frozen ones keep no state.
  assert optimizer_state == sum(params[p].size for p in trained)


@pytest.mark.parametrize(
    'fast_path',
    [
        {'model.remat': 'nothing_saveable'},
        {'model.scan': True, 'model.remat': 'dots_saveable'},
        {'accum_steps': 2},
        {'model.matmul': 'fp8'},
        {'model.attention': 'dot_product_attention'},
    ],
    ids=lambda fast_path: ','.join(fast_path),
)
def test_adapters_train_alone_with_every_fast_path(tmp_path, fast_path):
  overrides = {'model.lora_rank': 4, 'model.lora_targets': ALL, **fast_path}
  changed, params, _ = _trained_after_four_steps(tmp_path, overrides)
  assert changed == {p for p in params if lora.ADAPTER_PATH.search(p) or p.startswith('head/')}


def test_optim_trained_chooses_what_trains_beside_the_adapters(tmp_path):
  changed, params, _ = _trained_after_four_steps(
      tmp_path / 'lora',
      {'model.lora_rank': 4, 'optim.trained': ('^head', 'LayerNorm_')},
  )
  assert changed == {
      p for p in params if lora.ADAPTER_PATH.search(p) or p.startswith('head/') or 'LayerNorm_' in p
  }
  # Without adapters it is a linear probe in one line (optim.frozen would need every other path).
  changed, params, _ = _trained_after_four_steps(tmp_path / 'probe', {'optim.trained': ('^head',)})
  assert changed == {'head/kernel', 'head/bias'}


def _evaluated_from(workdir: str, data_dir: str, out: str) -> dict[str, float]:
  """The metrics of a run that starts from `workdir`'s model, head and all, and trains no step."""
  overrides = {'data_dir': data_dir, 'init_from': workdir, 'keep_head': True, 'total_steps': 0}
  config = helpers.load_config('demo', {**helpers.TINY, **overrides})
  return loop.train_and_evaluate(train_setup.prepare(config, out))


def _is_trained(path: str) -> bool:
  return bool(lora.ADAPTER_PATH.search(path)) or path.startswith('head/')


@pytest.mark.parametrize('scan', [False, True])
def test_the_polyak_average_keeps_the_trained_parameters_alone(tmp_path, scan):
  step, state, batch = helpers.jitted_step(
      tmp_path,
      {
          'optim.name': 'sgd',
          'lr.base': 0.5,
          'model.lora_rank': 4,
          'model.scan': scan,
          'polyak_decay': 0.75,
      },
  )
  want = helpers.flat_params(state.params)
  for _ in range(4):
    state, _ = step(state, batch)
    params = helpers.flat_params(state.params)
    want = {p: 0.75 * want[p] + 0.25 * params[p] for p in params}
  average = helpers.flat_params(state.ema_params)
  assert set(average) == {p for p in params if _is_trained(p)}
  # The frozen ones' average is themselves: put back where the average is evaluated and exported.
  averaged = helpers.flat_params(param_groups.with_trained(state.ema_params, state.params))
  assert averaged.keys() == want.keys()
  for path, value in want.items():
    np.testing.assert_allclose(averaged[path], value, rtol=1e-6, atol=1e-7, err_msg=path)
  assert not np.allclose(averaged['head/kernel'], params['head/kernel'])  # It lags.


def test_a_lora_run_resumes_evaluates_and_exports_the_average_of_what_trains(
    tmp_path, data_dir, trained_tiny_run
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'init_from': trained_tiny_run,
          'model.lora_rank': 4,
          'lr.base': 0.05,
          'polyak_decay': 0.5,
      },
  )
  workdir = str(tmp_path / 'lora')
  metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  saved = saved_state.saved_shapes(os.path.join(workdir, 'checkpoints', '12'))
  averaged = _leaf_paths(saved['ema_params'])
  assert averaged and all(_is_trained(path) for path in averaged), averaged
  helpers.assert_resume_is_bit_exact(config, workdir, str(tmp_path / 'resumed'))
  assert run_dir.load_trained(workdir).parameters == 'polyak'
  # A run from it starts from the average, frozen weights and all: as is, it scores what the run's
  # Polyak evaluation did.
  evaluated = _evaluated_from(workdir, data_dir, str(tmp_path / 'next'))
  assert evaluated['eval_loss'] == pytest.approx(metrics['eval_polyak_loss'], rel=1e-4)
  assert evaluated['eval_loss'] != pytest.approx(metrics['eval_loss'], rel=1e-4)


def _leaf_paths(tree) -> list[str]:
  return [
      jax.tree_util.keystr(path, simple=True, separator='/')
      for path, _ in jax.tree_util.tree_leaves_with_path(tree)
  ]


def test_a_probe_saved_with_an_average_of_every_parameter_resumes_with_that_of_the_head(
    tmp_path, data_dir, monkeypatch
):
  overrides = {'data_dir': data_dir, 'optim.trained': ('^head',), 'polyak_decay': 0.5}
  config = helpers.load_config('demo', {**helpers.TINY, **overrides})
  older = str(tmp_path / 'older')
  with monkeypatch.context() as patched:  # As runs saved before the average left frozen ones out.
    patched.setattr(param_groups, 'trained_part', lambda tree, frozen_labels: tree)
    loop.train_and_evaluate(train_setup.prepare(config, older))
  last = lambda workdir: os.path.join(workdir, 'checkpoints', '12')
  assert len(_leaf_paths(saved_state.saved_shapes(last(older))['ema_params'])) > 2
  resumed = str(tmp_path / 'resumed')
  shutil.copytree(older, resumed)
  shutil.rmtree(last(resumed))
  loop.train_and_evaluate(train_setup.prepare(config, resumed))
  assert _leaf_paths(saved_state.saved_shapes(last(resumed))['ema_params']) == [
      'head/bias',
      'head/kernel',
  ]
  chex.assert_trees_all_equal(
      helpers.checkpoint_params(resumed, 12), helpers.checkpoint_params(older, 12)
  )
  # The frozen parameters' average was themselves, to a rounding.
  chex.assert_trees_all_close(
      saved_state.restore_params(last(resumed))[0],
      saved_state.restore_params(last(older))[0],
      rtol=1e-6,
  )


def test_a_lora_step_computes_no_gradient_of_the_pretrained_weights(tmp_path):
  full = helpers.compiled_flops(*helpers.jitted_step(tmp_path / 'full', {}))
  adapted = helpers.compiled_flops(*helpers.jitted_step(tmp_path / 'lora', {'model.lora_rank': 4}))
  # The backward pass of a frozen layer is its input's gradient alone, half of a trained one's: the
  # step ~2/3 of full fine-tuning's (0.668x measured on this tiny model; the weights' gradients
  # computed and dropped, it would be above 1x).
  assert adapted < 0.75 * full, (adapted, full)


@pytest.mark.slow  # A run, its export and a run from it, end to end: make test-all's.
def test_a_run_with_adapters_folds_them_for_the_tools_export_and_the_next_run(
    tmp_path, data_dir, trained_tiny_run, caplog
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'init_from': trained_tiny_run,
          'model.lora_rank': 4,
          'model.lora_alpha': 8.0,
          'model.lora_targets': ALL,
          'lr.base': 0.05,
      },
  )
  workdir = str(tmp_path / 'lora')
  with caplog.at_level('INFO'):
    metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert 'drew 12 low-rank adapters (b zeros: the checkpoint unchanged)' in caplog.text
  assert 'parameters (' in caplog.text and ' trained), float32' in caplog.text
  # Resumed from its step-8 checkpoint, its step 12 is the uninterrupted run's, adapters and all.
  helpers.assert_resume_is_bit_exact(config, workdir, str(tmp_path / 'resumed'))
  saved = helpers.checkpoint_params(workdir, 12)
  flat = {k: v for k, v in helpers.flat_params(saved).items()}
  pretrained = helpers.flat_params(helpers.checkpoint_params(trained_tiny_run, 12))
  for path, value in pretrained.items():
    if not path.startswith('head/'):  # The head is new: zeros, then trained.
      np.testing.assert_array_equal(flat[path], value, err_msg=path)
  images = np.random.default_rng(0).uniform(-1, 1, (4, 8, 8, 3)).astype(np.float32)
  adapted_logits = helpers.model_logits(workdir, saved, images)

  # The tools see a plain ViT whose kernels hold the adapters' updates.
  trained = run_dir.load_trained(workdir)
  assert trained.model_config['lora_rank'] is None and not lora.has_adapters(trained.params)
  folded_logits = trained.model.apply({'params': trained.params}, images)
  assert np.abs(adapted_logits).max() > 0.1
  np.testing.assert_allclose(folded_logits, adapted_logits, rtol=1e-4, atol=1e-5)
  out = str(tmp_path / 'export')
  description = export.export(workdir, out)
  # peft's adapters name timm's or transformers' modules, of a base they read (test_peft_export.py).
  assert description['peft'].startswith(
      "not written: the adapters name timm's or transformers' modules, and the run started from "
      f'{trained_tiny_run}'
  )
  exported = npz_files.load_npz(os.path.join(out, 'model.npz'))
  assert not lora.has_adapters(exported)
  _, infer = run_dir.load_export(out)
  np.testing.assert_allclose(infer(images), adapted_logits, rtol=1e-4, atol=1e-5)
  # As a distillation teacher.
  distilling = helpers.load_config('demo', {**helpers.TINY, 'distill.teacher': workdir})
  teacher = teacher_lib.load_teacher(distilling, num_classes=10)
  assert not lora.has_adapters(teacher.params)
  np.testing.assert_allclose(
      teacher.model.apply({'params': teacher.params}, images), adapted_logits, rtol=1e-4, atol=1e-5
  )

  # A run from it starts from the folded model: evaluated as is, it scores what the run did.
  with caplog.at_level('INFO'):
    evaluated = _evaluated_from(workdir, data_dir, str(tmp_path / 'next'))
  assert 'its low-rank adapters folded into their kernels' in caplog.text
  assert evaluated['eval_loss'] == pytest.approx(metrics['eval_loss'], rel=1e-4)
  assert evaluated['eval_top1'] == metrics['eval_top1']


@pytest.mark.parametrize('scan', [False, True])
@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_fsdp_x_tensor_training_with_adapters_has_the_losses_of_one_device(
    tmp_path, data_dir, scan
):
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'model.lora_rank': 4,
      'model.lora_targets': ALL,
      'model.scan': scan,
      'optim.name': 'sgd',
      'lr.base': 0.1,
      'lr.warmup_steps': 0,
  }
  setup = train_setup.prepare(helpers.load_config('demo', overrides), str(tmp_path / 'mesh'))
  _, state = helpers.train_as_on_one_device(setup, str(tmp_path / 'one'), steps=4)
  block = state.params['Transformer']['encoderblock' if scan else 'encoderblock_0']
  # Split over the heads and MLP units as the kernels they update (encoder.TENSOR_RULES).
  query_b = block['MultiHeadDotProductAttention_1']['query_lora']['b']
  assert query_b.sharding.spec[-2] == 'tensor', query_b.sharding.spec
  assert block['MlpBlock_3']['Dense_1_lora']['a'].sharding.spec[-2] == 'tensor'
