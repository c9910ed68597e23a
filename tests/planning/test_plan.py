"""The planner (vit_jax/tools/plan.py, vit_jax/planning/footprint.py, vit_jax/planning/meshes.py): its per-device bytes against XLA's memory
analysis of the real train step, its suggestions, its chip registry, its JSON and its one-line errors.
"""

import functools
import gc
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import helpers
from vit_jax import data, sharding
from vit_jax.planning import chips, footprint, meshes
from vit_jax.train import optim, param_groups
from vit_jax.tasks import classification
from vit_jax.train import setup as train_setup, state as train_state, step as train_step

NUM_CLASSES = 10
H100 = chips.Target(
    chips.get('h100-80gb'), devices=8
)  # Only fits and step times depend on the chip.


def tiny(**overrides):
  """The tests' tiny ViT (2 blocks of width 32) at 32 px, 65 tokens: a batch of 64 (8 images a device)
  makes the activations most of the bytes. The demo's dropout 0.1 and AdamW stay on."""
  return helpers.load_config(
      'demo', {**helpers.TINY, 'image_size': 32, 'batch_size': 64, **overrides}
  )


def xla_bytes(config) -> int:
  """Per-device bytes of the train step as training jits it (train/step.py's jit_train_step with the
  state's shardings, as train/state.py's create_state makes them), from XLA's compiled memory analysis.

  The program is SPMD, so its sizes are one device's. The state is donated: its outputs alias its
  arguments (alias bytes), which stay allocated across the step; temp is what XLA allocates during it
  (activations, gradients, collectives' buffers). The peak is argument + output - alias + temp.
  """
  mesh = sharding.make_mesh(config.mesh)
  model_config = helpers.model_config(config)
  model = classification.make_model(config, model_config, NUM_CLASSES)
  tx, schedule = optim.make_optimizer(config, config.total_steps, model_config)
  info = data.DatasetInfo(NUM_CLASSES, 1000, 100, tuple(map(str, range(NUM_CLASSES))))
  setup = train_setup.Setup(
      config,
      '/unused',
      info,
      classification,
      model,
      mesh,
      config.total_steps,
      (),
      model_config,
      tx,
      schedule,
  )
  init = functools.partial(
      train_state.init_state,
      model=model,
      tx=tx,
      image_size=config.image_size,
      polyak=config.polyak_decay is not None,
      frozen_labels=param_groups.labeller(config.optim, model_config),
  )
  abstract = jax.eval_shape(
      lambda key: train_state.training_layout(init(key), model), jax.random.key(0)
  )
  shardings = sharding.state_shardings(abstract, mesh)
  state = jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), abstract, shardings
  )
  batch_sharding = sharding.batch_sharding(mesh)
  shape = (config.batch_size, config.image_size, config.image_size, 3)
  batch = {
      'image': jax.ShapeDtypeStruct(shape, jnp.float32, sharding=batch_sharding),
      'label': jax.ShapeDtypeStruct(shape[:1], jnp.int32, sharding=batch_sharding),
  }
  step = train_step.jit_train_step(setup, shardings)
  m = step.lower(state, batch).compile().memory_analysis()
  return (
      m.argument_size_in_bytes
      + m.output_size_in_bytes
      - m.alias_size_in_bytes
      + m.temp_size_in_bytes
  )


def planned(config) -> footprint.Estimate:
  mesh = meshes.check(config, helpers.model_config(config), 8)
  return footprint.estimate(
      config,
      footprint.trace(config, helpers.model_config(config), NUM_CLASSES),
      mesh,
      config.model.remat,
      config.accum_steps,
      H100,
  )


# Remat is tested on scanned models: XLA:CPU drops an unscanned model's remat (the same temp bytes with
# and without: the recomputation is merged back into the forward pass), and fsdp on a scanned model
# replicates the batch inside the loop on CPU (4x the activations), so those are not compared.
CASES = {
    'data': {},
    'fsdp_sgd_polyak': {'mesh': (('fsdp', 8),), 'optim.name': 'sgd', 'polyak_decay': 0.999},
    'lora_polyak': {'model.lora_rank': 4, 'polyak_decay': 0.999},
    'probe_accum2': {'optim.trained': ('^head',), 'accum_steps': 2},
    'fsdp_x_tensor_accum2_bf16_mu': {
        'mesh': (('fsdp', 4), ('tensor', 2)),
        'accum_steps': 2,
        'optim.mu_dtype': 'bfloat16',
    },
    'scan_nothing_saveable': {'model.scan': True, 'model.remat': 'nothing_saveable'},
    'scan_dots_saveable': {'model.scan': True, 'model.remat': 'dots_saveable'},
}


@pytest.mark.slow  # Tens of seconds of compiling: make test-all's.
def test_an_unscanned_model_keeps_every_attention_map():
  """257 tokens: the attention maps are most of the activations, and XLA keeps them whole (planned
  with the other residuals' discount: 0.92 of XLA's)."""
  config = tiny(**{'image_size': 64, 'batch_size': 16})
  assert 0.95 < planned(config).total / xla_bytes(config) < 1.1


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.parametrize('overrides', CASES.values(), ids=CASES.keys())
def test_total_within_15_percent_of_xla(overrides):
  config = tiny(**overrides)
  estimate, measured = planned(config), xla_bytes(config)
  assert abs(estimate.total / measured - 1) < 0.15, (estimate, measured)
  assert estimate.activations > estimate.total / 2  # The activations are what is being tested.


def test_parameters_and_optimizer_state_are_what_the_state_holds():
  # adamw: float32 parameters and two moments, the first in bfloat16 here; fsdp splits them 8 ways.
  config = tiny(**{'mesh': (('fsdp', 8),), 'optim.mu_dtype': 'bfloat16'})
  e = planned(config)
  params = 4 * sum(
      x.size
      for x in jax.tree.leaves(
          footprint.abstract_state(config, helpers.model_config(config), NUM_CLASSES)['params']
      )
  )
  assert (
      params / 8 <= e.params <= params / 8 + 4 * 1000
  )  # Arrays that 8 does not divide stay whole.
  assert e.optimizer_state == pytest.approx(e.params * 1.5, rel=0.02)
  assert e.polyak == 0 and e.gradients == e.params


def test_a_polyak_average_counts_the_parameters_that_train_alone():
  config = tiny(**{'model.lora_rank': 4, 'polyak_decay': 0.999})
  params = footprint.abstract_state(config, helpers.model_config(config), NUM_CLASSES)['params']
  trained = [
      x
      for path, x in jax.tree_util.tree_leaves_with_path(params)
      if '_lora' in jax.tree_util.keystr(path) or jax.tree_util.keystr(path).startswith("['head']")
  ]
  assert planned(config).polyak == 4 * sum(x.size for x in trained) > 0


def test_remat_and_accumulation_shrink_the_activations():
  traced_config = tiny(**{'model.scan': True})
  traced = footprint.trace(traced_config, helpers.model_config(traced_config), NUM_CLASSES)
  mesh = {'data': 8}
  acts = {
      (remat, accum): footprint.estimate(
          traced_config, traced, mesh, remat, accum, H100
      ).activations
      for remat in footprint.REMATS
      for accum in (1, 2)
  }
  assert acts[None, 1] > acts['dots_saveable', 1] > acts['nothing_saveable', 1]
  assert all(acts[remat, 2] < acts[remat, 1] for remat in footprint.REMATS)


def test_nothing_is_compiled_or_allocated():
  compiled = []
  listener = lambda name, *args, **kwargs: compiled.append(name)
  jax.monitoring.register_event_duration_secs_listener(listener)
  # Counted after a collection each time: arrays that earlier tests left to the garbage collector
  # would otherwise go during the planning and make the count fall (seen once in make test).
  gc.collect()
  arrays = len(jax.live_arrays())
  try:
    planned(helpers.load_config('vit_b16_i1k'))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert not [name for name in compiled if 'backend_compile' in name or 'mlir_module' in name]
  gc.collect()
  assert len(jax.live_arrays()) == arrays


def test_a_suggestion_that_fits_fits_when_planned_again():
  # ViT-B/16 at batch 4096 on 8 TPU v5e (16 GiB): 512 images a device do not fit without remat and
  # accumulation.
  config = helpers.load_config('vit_b16_i1k')
  target = chips.Target(chips.get('tpu-v5e'), devices=8)
  traced = footprint.trace(config, helpers.model_config(config), 1000)
  assert not target.fits(
      footprint.estimate(
          config, traced, meshes.check(config, helpers.model_config(config), 8), None, 1, target
      )
  )
  found = meshes.suggest(config, traced, target)
  assert found and found == sorted(found, key=lambda e: e.step_s)
  best = found[0]
  again = helpers.load_config(
      'vit_b16_i1k',
      {
          'mesh': tuple(best.mesh.items()),
          'model.remat': best.remat,
          'accum_steps': best.accum_steps,
      },
  )
  replanned = footprint.estimate(
      again,
      footprint.trace(again, helpers.model_config(again), 1000),
      meshes.check(again, helpers.model_config(again), 8),
      best.remat,
      best.accum_steps,
      target,
  )
  assert replanned == best and target.fits(replanned)
  # Nothing searched fits on chips of a 64th of the memory.
  small = chips.Chip('small', target.chip.hbm_bytes // 64, target.chip.peak_flops)
  assert meshes.suggest(config, traced, chips.Target(small, devices=8)) == []


def test_step_time_counts_the_recomputation():
  config = helpers.load_config('vit_b16_i1k')
  traced, target = footprint.trace(config, helpers.model_config(config), 1000), chips.Target(
      chips.get('tpu-v4'), devices=128
  )
  step = {
      remat: footprint.estimate(config, traced, {'data': 128}, remat, 1, target).step_s
      for remat in footprint.REMATS
  }
  assert step[None] == pytest.approx(
      3 * chips.vit_flops(traced.model, 224) * 4096 / 128 / (275e12 * 0.4)
  )
  assert step['dots_saveable'] == step[None] < step['nothing_saveable'] < 4 / 3 * step[None]


def test_chip_registry():
  assert {
      'tpu-v4',
      'tpu-v5e',
      'tpu-v5p',
      'tpu-v6e',
      'a100-40gb',
      'a100-80gb',
      'h100-80gb',
      'h200-141gb',
  } == set(chips.CHIPS)
  assert all(c.hbm_bytes >= 16 * 2**30 and c.peak_flops >= 197e12 for c in chips.CHIPS.values())
  with pytest.raises(
      ValueError, match='unknown chip .tpu-v9.: use one of tpu-v4, tpu-v5e, .*h200-141gb'
  ):
    chips.get('tpu-v9')


@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'mesh': (('fsdp', -1), ('tensor', 3))}, 'does not fit 8 devices'),
        ({'mesh': (('data', 4),)}, 'multiply to 4, but there are 8 devices'),
        ({'mesh': (('fsdp', 2), ('tensor', 4))}, 'does not divide the model.s num_heads=2'),
        ({'batch_size': 60}, 'config.batch_size=60 is not divisible'),
        ({'variant': 'ViT-Q_16'}, 'Unknown model variant'),
        # 0 images divide into any accumulation: suggest() doubled accum_steps forever.
        ({'batch_size': 0}, 'config.batch_size=0 must be at least 1'),
    ],
)
def test_what_training_refuses_is_a_value_error(overrides, message):
  config = tiny(**overrides)
  with pytest.raises(ValueError, match=message):
    meshes.check(config, helpers.model_config(config), 8)


def _plan(*args):
  return subprocess.run(
      [sys.executable, '-m', 'vit_jax.tools.plan', '--config=configs/demo.py', *args],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )


def test_json_output():
  run = _plan(
      '--devices=8', '--chip=tpu-v5e', '--json', '--num_classes=10', '--config.batch_size=64'
  )
  assert run.returncode == 0, run.stderr
  out = json.loads(run.stdout)
  assert out['chip']['name'] == 'TPU v5e' and out['devices'] == 8 and out['mfu'] == 0.4
  assert out['config'] == {
      'variant': 'ViT-Ti_4',
      'image_size': 16,
      'batch_size': 64,
      'dtype': 'float32',
  }
  assert [p['remat'] for p in out['plans']] == list(footprint.REMATS)
  for p in out['plans'] + out['suggestions']:
    assert p['total'] == sum(
        p[k] for k in ('params', 'gradients', 'optimizer_state', 'polyak', 'activations')
    )
    assert p['fits'] == (p['total'] <= out['usable_bytes'])
  assert out['plans'][0]['mesh'] == {'data': 8} and out['suggestions'][0]['fits']


@pytest.mark.slow  # Seven plans, each tracing every remat policy: 15 s.
def test_a_flexivit_is_planned_with_its_parameters_and_its_smallest_patches_activations():
  """The state of the shapes the run keeps; the activations and step time of its costliest branch."""
  target = chips.Target(chips.get('tpu-v5e'), devices=8)

  def plans(**overrides):  # The demo's: 16 px images, 4 px patches, learned position embeddings.
    config = helpers.load_config('demo', {'batch_size': 64, **overrides})
    traced = footprint.trace(config, train_setup.resolve_model(config), NUM_CLASSES)
    return [
        footprint.estimate(config, traced, {'data': 8}, remat, 1, target)
        for remat in footprint.REMATS
    ]

  state = lambda e: (e.params, e.gradients, e.optimizer_state, e.polyak)
  flexi = {'flexi.patch_sizes': (2, 4, 8)}
  smallest = plans(**{'model.patch_size': 2})
  # Patch 4's parameters (a 4x4 kernel, 4x4 position embeddings): the run's state; patch 2's 64
  # tokens hold the most and take the longest.
  for plan, at_4, at_2 in zip(plans(**flexi), plans(), smallest):
    assert state(plan) == state(at_4) != state(at_2)
    assert (plan.activations, plan.step_s) == (at_2.activations, at_2.step_s)
  # FlexiViT's own shapes: an 8 px kernel and position embeddings on patch 4's grid (4x4), or on
  # posemb_grid's (2x2): a model of 8 px patches at 32 or 16 px.
  for grid, image_size in [({}, 32), ({'flexi.posemb_grid': 2}, 16)]:
    kept = plans(**flexi, **grid, **{'flexi.kernel_size': 8})
    same = plans(**{'model.patch_size': 8, 'image_size': image_size})
    for plan, at_8, at_2 in zip(kept, same, smallest):
      assert state(plan) == state(at_8)
      assert plan.activations == at_2.activations


def test_table_output_and_one_line_errors():
  run = _plan('--devices=8', '--chip=h100-80gb')
  assert run.returncode == 0, run.stderr
  assert '| activations |' in run.stdout and '| fits in 72.00 GiB | yes | yes | yes |' in run.stdout
  assert 'step time at 40% MFU' in run.stdout and 'Suggestions that fit' in run.stdout
  for args, message in [
      (('--devices=8', '--chip=tpu-v9'), "unknown chip 'tpu-v9': use one of tpu-v4, tpu-v5e"),
      (
          ('--devices=6', '--chip=tpu-v4', "--config.mesh=(('fsdp', -1), ('tensor', 4))"),
          'does not fit 6 devices',
      ),
      (('--devices=8',), '--chip is required: use --config=FILE --devices=N --chip=NAME'),
      (('--devices=8', '--chip=tpu-v4', '--config.no_such_field=1'), 'bad config override'),
      # What a run refuses of its fields (train/setup.py's check_fields, resolve_model: FlexiViT's
      # included), before anything is traced.
      (
          ('--devices=8', '--chip=tpu-v4', '--config.flexi.kernel_size=8'),
          'config.flexi.kernel_size keeps the parameters of a FlexiViT run',
      ),
  ]:
    run = _plan(*args)
    assert run.returncode == 2 and run.stdout == '', run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: ') and message in lines[0], run.stderr


def test_scanned_blocks_under_fsdp_compute_only_each_devices_share_of_the_batch():
  # Without scanned.ACTIVATION_SHARDING, XLA's sharding propagation into the scan followed the
  # fsdp-split parameters and every device computed the whole global batch (3.4x these bytes here).
  fsdp = xla_bytes(tiny(**{'model.scan': True, 'mesh': (('fsdp', -1),)}))
  data_parallel = xla_bytes(tiny(**{'model.scan': True, 'mesh': (('data', -1),)}))
  assert fsdp < 1.3 * data_parallel, (fsdp, data_parallel)


def test_flags_the_plan_cannot_use_are_one_line_errors():
  for args, message in [
      # A head of no classes divided by zero in a traceback.
      (('--devices=8', '--chip=tpu-v4', '--num_classes=0'), '--num_classes=0 must be at least 1'),
      (('--devices=8', '--chip=tpu-v4', '--suggestions=-1'), '--suggestions=-1 at least 0'),
      # Its mesh of that many integers took minutes to build.
      (('--devices=100000000', '--chip=tpu-v4'), '--devices=100000000 must be from 1 to 1048576'),
  ]:
    run = _plan(*args)
    assert run.returncode == 2 and run.stdout == '', run
    assert (
        run.stderr.strip().splitlines() == [f'error: {run.stderr.strip()[7:]}']
        and message in run.stderr
    )
  # config_flags raised the missing file's error at first use, a traceback of 40 lines.
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.plan',
          '--config=configs/no_such_file.py',
          '--devices=8',
          '--chip=tpu-v4',
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2 and run.stderr.strip().splitlines() == [
      'error: cannot load the --config file: [Errno 2] No such file or directory: '
      "'configs/no_such_file.py'"
  ], run.stderr


def test_no_suggestions_asked_for_is_not_nothing_fits():
  run = _plan('--devices=8', '--chip=tpu-v4', '--suggestions=0')
  assert run.returncode == 0, run.stderr
  assert (
      '| fits in 28.80 GiB | yes | yes | yes |' in run.stdout
  )  # All fit: it must not say otherwise.
  assert 'Nothing searched fits' not in run.stdout and 'Suggestions' not in run.stdout


@pytest.mark.parametrize(
    'fields',
    [
        {},
        {'mlp_gated': True},
        {'num_kv_heads': (1, 4)},
        {'parallel_block': True},
        {'diff_attention': True},
    ],
)
def test_the_analytic_forward_flops_agree_with_xla(fields):
  """SwiGLU's third matrix (EVA-02's) counted, grouped key and value heads (a block's), parallel
  blocks, differential attention's maps (whose zero-padded halves XLA counts in full): within the
  few percent XLA adds for norms, softmax and activations."""
  from vit_jax.models import variants  # pylint: disable=g-import-not-at-top

  model = variants.get_model_config(
      'ViT-testing_8',
      {'hidden_size': 256, 'mlp_dim': 1024, 'num_layers': 2, 'num_heads': 4, **fields},
  )
  module = variants.build('ViT-testing_8', model, num_classes=NUM_CLASSES, dtype=jnp.float32)
  images = jnp.zeros((2, 64, 64, 3))
  params = jax.eval_shape(module.init, jax.random.key(0), images)
  xla = jax.jit(module.apply).lower(params, images).compile().cost_analysis()['flops']
  analytic = 2 * chips.vit_flops(model, 64, NUM_CLASSES)
  assert analytic <= xla <= 1.05 * analytic


def test_a_distillation_teacher_adds_its_parameters_forward_pass_and_flops(trained_tiny_run):
  """The teacher's float32 parameters split over the fsdp axis as the student's, its forward pass's
  widest block per image, and one forward pass per image in the step time."""
  from vit_jax.checkpoints import teacher  # pylint: disable=g-import-not-at-top

  config = tiny(**{'mesh': (('fsdp', 8),), 'distill.teacher': trained_tiny_run})
  model_config = helpers.model_config(config)
  mesh = meshes.check(config, model_config, 8)
  alone = footprint.trace(config, model_config, NUM_CLASSES)
  traced = footprint.trace(config, model_config, NUM_CLASSES, teacher.architecture(config))
  without, with_teacher = (
      footprint.estimate(config, t, mesh, None, 1, H100) for t in (alone, traced)
  )
  # The teacher is the tiny run's model, the student's twin: 2 blocks of width 32 at 32 px.
  teacher_params = 4 * sum(x.size for x in jax.tree.leaves(traced.teacher.params))
  student_params = 4 * sum(x.size for x in jax.tree.leaves(alone.state['params']))
  assert teacher_params == student_params
  tokens, images = 65, 64 // 8
  transient = images * tokens * (64 + 2 * tokens) * 4  # MLP units and 2 heads' weights, float32.
  assert with_teacher.teacher == pytest.approx(teacher_params / 8 + transient, rel=0.02)
  assert with_teacher.total == without.total + with_teacher.teacher
  flops = chips.vit_flops(model_config, 32, NUM_CLASSES)
  assert with_teacher.step_s / without.step_s == pytest.approx(
      (chips.train_flops(model_config, 32, NUM_CLASSES, None) + flops)
      / chips.train_flops(model_config, 32, NUM_CLASSES, None)
  )


def test_a_teacher_at_its_own_image_size_is_counted_at_it(trained_tiny_run):
  """distill.teacher_image_size: the teacher's position embeddings, forward pass and FLOPs at 64 px
  (256 patch tokens), the student's at 32."""
  from vit_jax.checkpoints import teacher  # pylint: disable=g-import-not-at-top

  config = tiny(**{'distill.teacher': trained_tiny_run, 'distill.teacher_image_size': 64})
  model_config = helpers.model_config(config)
  traced = footprint.trace(config, model_config, NUM_CLASSES, teacher.architecture(config))
  assert traced.teacher.params['Transformer']['posembed_input']['pos_embedding'].shape == (
      1,
      257,
      32,
  )
  assert traced.teacher.flops == chips.vit_flops(model_config, 64, NUM_CLASSES)
  assert traced.teacher.transient == 257 * (64 + 2 * 257) * 4


def _plan_with_teacher(teacher: str, *json_flag: str) -> str:
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.plan',
          '--config=configs/demo.py',
          '--devices=8',
          '--chip=h100-80gb',
          f'--config.distill.teacher={teacher}',
          '--config.model.distilled=True',
          '--suggestions=0',
          *json_flag,
      ],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return run.stdout


def test_the_plan_command_counts_a_teacher(trained_tiny_run):
  plans = json.loads(_plan_with_teacher(trained_tiny_run, '--json'))['plans']
  # The tiny run as the demo's teacher: its parameters over 8 devices and its forward pass.
  assert all(0 < plan['teacher'] < plan['total'] for plan in plans)
  assert '| distillation teacher | 0.00 |' in _plan_with_teacher(trained_tiny_run)


@pytest.mark.slow  # Four plans of ViT-B/16: 10 s.
def test_step_time_counts_only_the_gradients_computed():
  """A frozen parameter gets no gradient (train/step.py): low-rank adapters' steps skip the frozen
  weights' gradients (XLA counts 0.68x full training's FLOPs for ViT-B/16: test_benchmarks.py), a
  linear probe's the whole backward pass."""
  target = chips.Target(chips.get('tpu-v4'), devices=128)

  def step_s(**overrides):
    config = helpers.load_config('vit_b16_i1k', overrides)
    traced = footprint.trace(config, helpers.model_config(config), 1000)
    return footprint.estimate(config, traced, {'data': 128}, None, 1, target).step_s

  full = step_s()
  assert step_s(**{'model.lora_rank': 16}) / full == pytest.approx(2 / 3, abs=0.01)
  assert step_s(**{'optim.trained': ('^head',)}) / full == pytest.approx(1 / 3, abs=0.01)
  # The head alone frozen: every gradient below it, the head's weights' none.
  assert full * 0.99 < step_s(**{'optim.frozen': ('^head',)}) < full


def test_the_analytic_mae_flops_agree_with_xla():
  """A masked autoencoder's encoder over a quarter of the patches and its decoder over all of them:
  within the few percent XLA adds for norms, softmax and activations."""
  from vit_jax.models import mae, mpp, variants  # pylint: disable=g-import-not-at-top

  model = variants.get_model_config(
      'ViT-testing_8', {'hidden_size': 256, 'mlp_dim': 1024, 'num_layers': 2, 'num_heads': 4}
  )
  fields = dict(
      mask_ratio=0.75,
      decoder_hidden_size=128,
      decoder_mlp_dim=512,
      decoder_num_heads=4,
      decoder_num_layers=2,
  )
  module = mae.MaskedAutoencoder(**mpp.backbone_fields(model), **fields)
  images, noise = jnp.zeros((2, 64, 64, 3)), jnp.zeros((2, 64))
  params = jax.eval_shape(module.init, jax.random.key(0), images)
  apply = lambda p, x, n: module.apply(p, x, noise=n)
  xla = jax.jit(apply).lower(params, images, noise).compile().cost_analysis()['flops']
  analytic = 2 * chips.mae_flops(model, 64, fields)[0]
  assert analytic <= xla <= 1.05 * analytic


def test_a_masked_autoencoders_step_time_is_its_own_flops():
  # Two decoder blocks of MAE's eight: each trace of the residuals holds the whole decoder.
  config = helpers.load_config('mae_vit_b16_i1k', {'mae.decoder_num_layers': 2})
  traced = footprint.trace(config, helpers.model_config(config), 1000)
  target = chips.Target(chips.get('tpu-v4'), devices=128)
  step = footprint.estimate(config, traced, {'data': 128}, None, 1, target).step_s
  forward = chips.mae_flops(traced.model, 224, config.mae)[0]
  assert step == pytest.approx(3 * forward * 4096 / 128 / (275e12 * 0.4))
  assert forward < 0.6 * chips.vit_flops(traced.model, 224)  # MAE's point: a cheaper step.
