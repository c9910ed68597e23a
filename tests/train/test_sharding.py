"""Sharded training on any mesh: partition rules, equal results across meshes and hosts, accumulation,
checkpoints moved between meshes, and the errors for meshes that do not fit."""

import dataclasses
import functools
import logging
import os
import socket
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import helpers
from vit_jax import sharding, tasks
from vit_jax.checkpoints import checkpoint, saved_state
from vit_jax.train import setup as train_setup, state as train_state, step as train_step

sys.path.insert(0, os.path.join(helpers.REPO, 'benchmarks'))
import local
import sharding_memory  # pylint: disable=wrong-import-position


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.mark.devices(8)
def test_partition_rules_combine_tensor_and_fsdp():
  mesh = sharding.make_mesh((('fsdp', 4), ('tensor', 2)))
  spec = functools.partial(sharding.partition_spec, mesh=mesh)
  block = 'Transformer/encoderblock_3'
  assert spec(f'{block}/MultiHeadDotProductAttention_1/query/kernel', (768, 12, 64)) == P(
      'fsdp', 'tensor', None
  )
  assert spec(f'{block}/MultiHeadDotProductAttention_1/out/kernel', (12, 64, 768)) == P(
      'tensor', None, 'fsdp'
  )
  assert spec(f'{block}/MlpBlock_3/Dense_0/kernel', (768, 3072)) == P('fsdp', 'tensor')
  assert spec(f'{block}/MlpBlock_3/Dense_1/kernel', (3072, 768)) == P('tensor', 'fsdp')
  assert spec(f'{block}/LayerNorm_0/scale', (768,)) == P('fsdp')
  assert spec('head/bias', (10,)) == P(None)  # 10 is not divisible by 4: replicated.
  # Optimizer-state paths end with the parameter path and get the same spec.
  assert spec(f'opt_state/1/0/mu/{block}/MlpBlock_3/Dense_0/kernel', (768, 3072)) == P(
      'fsdp', 'tensor'
  )
  # A scanned model's stacked blocks: the layer axis stays whole, the rules apply to the rest.
  stacked = 'opt_state/1/0/mu/Transformer/encoderblock'
  assert spec(f'{stacked}/MlpBlock_3/Dense_0/kernel', (12, 768, 3072)) == P(None, 'fsdp', 'tensor')
  assert spec(f'{stacked}/LayerNorm_0/scale', (12, 768)) == P(None, 'fsdp')
  assert spec(f'{stacked}/LayerNorm_0/scale', (8, 6)) == P(None, None)  # Never split over layers.
  data_only = sharding.make_mesh((('data', -1),))
  assert sharding.partition_spec('embedding/kernel', (16, 16, 3, 768), data_only) == P(
      None, None, None, None
  )


@pytest.mark.devices(8)
def test_fsdp_cuts_per_device_state_of_vit_b16_at_least_6x():
  config = helpers.load_config('vit_b16_i1k', {'mesh': (('data', -1),)})
  replicated = sharding_memory.per_device_bytes(config)
  config.mesh = (('fsdp', 8),)
  assert sharding_memory.per_device_bytes(config) <= replicated / 6
  assert replicated > 3 * 86_567_656 * 4  # Parameters plus two AdamW moments, float32.


def _tiny_setup(tmp_path, data_dir, **overrides):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, **overrides})
  return train_setup.prepare(config, str(tmp_path))


def _state_and_step(setup, accum_steps):
  tx, schedule = (setup.tx, setup.schedule)
  manager = checkpoint.make_manager(setup.workdir, keep=1)
  state, _, _ = train_state.create_state(setup, manager)
  step = jax.jit(
      functools.partial(
          train_step.train_step,
          tx=tx,
          schedule=schedule,
          loss_fn=tasks.get(setup.config.task).make_loss(setup.config, setup.model),
          dropout_key=jax.random.key(0),
          accum_steps=accum_steps,
          micro_batch_sharding=sharding.micro_batch_sharding(setup.mesh),
      )
  )
  return state, step


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_gradient_accumulation_matches_one_big_batch(tmp_path, data_dir):
  # SGD: Adam's first step is about lr * sign(grad), which would turn float noise in near-zero
  # gradients into differences of 2 * lr.
  setup = _tiny_setup(
      tmp_path,
      data_dir,
      batch_size=64,
      accum_steps=4,
      mesh=(('data', 2), ('fsdp', 4)),
      **{
          'lr.warmup_steps': 0,
          'lr.decay': 'constant',
          'lr.base': 0.5,
          'optim.name': 'sgd',
          'optim.weight_decay': 0.0,
          'model.dropout_rate': 0.0,  # Micro-batches draw their own dropout masks.
          'model.head_dropout_rate': 0.0,
      },
  )
  rng = np.random.default_rng(0)
  batch = sharding.global_batch(
      {
          'image': rng.uniform(-1, 1, (64, 8, 8, 3)).astype(np.float32),
          'label': rng.integers(0, 10, 64).astype(np.int32),
      },
      setup.mesh,
  )
  results = []
  for accum_steps in (1, 4):
    state, step = _state_and_step(setup, accum_steps)
    state, metrics = step(state, batch)
    results.append((state.params, metrics))
  chex.assert_trees_all_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(results[0][1]['train_loss'], results[1][1]['train_loss'], rtol=1e-5)
  assert not np.allclose(results[0][0]['head']['kernel'], 0)  # The step did move the parameters.


@pytest.mark.devices(8)
def test_checkpoint_moves_between_meshes(tmp_path, data_dir):
  fsdp = _tiny_setup(tmp_path, data_dir, mesh=(('fsdp', 8),))
  manager = checkpoint.make_manager(fsdp.workdir, keep=1)
  state, _, _ = train_state.create_state(fsdp, manager)
  kernel = state.params['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_0']['kernel']
  assert kernel.sharding.spec == P(None, 'fsdp')
  checkpoint.save(manager, 0, state)
  manager.wait_until_finished()

  abstract = jax.eval_shape(lambda: state)
  for mesh in (
      sharding.make_mesh((('data', 1),), devices=jax.devices()[:1]),
      sharding.make_mesh((('data', 2), ('tensor', 4))),
  ):
    shardings = sharding.state_shardings(abstract, mesh)
    restored = checkpoint.restore(manager, checkpoint.abstract_with_shardings(abstract, shardings))
    chex.assert_trees_all_equal(jax.device_get(state), jax.device_get(restored))
    moved = restored.params['Transformer']['encoderblock_0']['MlpBlock_3']['Dense_0']['kernel']
    assert moved.sharding.mesh.shape == mesh.shape
    assert moved.sharding.spec == (P(None, None) if mesh.size == 1 else P(None, 'tensor'))


def test_one_process_saves_replicated_arrays_without_slicing_them(tmp_path, monkeypatch, caplog):
  # Orbax's replica-parallel save would cut each replicated array into one slice per device.
  slices = []
  slice_in_dim = jax.lax.slice_in_dim
  monkeypatch.setattr(
      jax.lax, 'slice_in_dim', lambda *a, **k: slices.append(1) or slice_in_dim(*a, **k)
  )
  replicated = jax.sharding.NamedSharding(sharding.make_mesh((('data', -1),)), P())
  params = {
      'kernel': jax.device_put(np.arange(64 * 32, dtype=np.float32).reshape(64, 32), replicated),
      'bias': jax.device_put(np.ones(64, np.float32), replicated),
  }
  manager = checkpoint.make_manager(str(tmp_path), keep=1)
  checkpoint.save(manager, 0, {'params': params})
  manager.wait_until_finished()
  assert not slices
  assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
  restored, _ = saved_state.restore_params(os.path.join(str(tmp_path), 'checkpoints', '0'))
  chex.assert_trees_all_equal(restored, jax.device_get(params))


@pytest.mark.parametrize(
    'overrides,message',
    [
        pytest.param(
            {'mesh': (('data', 2), ('tensor', 4))},
            'tensor=4 does not divide the model.s num_heads=2',
            marks=pytest.mark.devices(8),
        ),
        pytest.param(  # A multiple of 3 alone would not split over the 4 batch shards.
            {'mesh': (('data', 4), ('tensor', 2)), 'data_shards': 3, 'batch_size': 16},
            r'config.data_shards=3 equal parts: use a multiple of 12, e.g. --config.batch_size=12$',
            marks=pytest.mark.devices(8),
        ),
        # What else it splits would be kept whole on every device.
        pytest.param(
            {'mesh': (('data', 4), ('tensor', 2)), 'model.num_kv_heads': 1},
            r'tensor=2 does not divide the model.s num_kv_heads=1: .*a divisor of 1\)',
            marks=pytest.mark.devices(8),
        ),
        pytest.param(
            {'mesh': (('data', 4), ('tensor', 2)), 'model.classifier': 'map', 'model.map_heads': 1},
            'tensor=2 does not divide the model.s map_heads=1',
            marks=pytest.mark.devices(8),
        ),
        pytest.param(
            {'mesh': (('data', 4), ('fsdp', 4))},
            'multiply to 16, but there are 8 devices',
            marks=pytest.mark.devices(8),
        ),
        (
            {'mesh': (('model', 8),)},
            "Unknown config.mesh axis 'model': the axes are data, fsdp, tensor",
        ),
        ({'mesh': (('data', 2), ('data', 4))}, r"names an axis twice \(\['data', 'data'\]\)"),
        ({'mesh': ('data', 8)}, r'must be \(name, size\) pairs'),
        pytest.param(
            {'batch_size': 16, 'accum_steps': 4},
            r'not divisible by the 8 devices.*x accum_steps=4',
            marks=pytest.mark.devices(8),
        ),
    ],
)
def test_meshes_that_do_not_fit_are_clear_errors(tmp_path, data_dir, overrides, message):
  with pytest.raises(ValueError, match=message):
    _tiny_setup(tmp_path, data_dir, **overrides)


@dataclasses.dataclass(frozen=True)
class _Device:
  id: int
  process_index: int


_TWO_HOSTS = [_Device(i, process_index=i // 4) for i in range(8)]


@pytest.mark.parametrize(
    'axes',
    [
        (('tensor', 2), ('data', 4)),
        (('fsdp', 4), ('data', 2)),
        (('tensor', 2), ('fsdp', 2), ('data', 2)),
        (('data', 2), ('tensor', 4)),
    ],
)
def test_each_host_holds_one_block_of_the_batch_in_any_axis_order(axes):
  """Batch shard s (data-major, as batch_sharding splits the rows) lies on host s // (shards / 2),
  and a tensor group inside one host."""
  mesh = sharding.make_mesh(axes, _TWO_HOSTS)
  shards = sharding.num_batch_shards(mesh)
  for index, device in np.ndenumerate(mesh.devices):
    coords = dict(zip(mesh.axis_names, index))
    shard = coords.get('data', 0) * sharding.axis_size(mesh, 'fsdp') + coords.get('fsdp', 0)
    assert device.process_index == shard // (shards // 2), (axes, index, device)


def test_a_mesh_whose_batch_shards_are_fewer_than_the_hosts_is_one_line():
  with pytest.raises(
      ValueError,
      match=r"^config.mesh \{'data': 1, 'tensor': 8\} cuts the batch into 1 shards for 2 processes, "
      r"each of which loads rows of its own: make the 'data' x 'fsdp' size a multiple of 2$",
  ):
    sharding.make_mesh((('data', 1), ('tensor', 8)), _TWO_HOSTS)


def test_unreachable_coordinator_fails_within_the_timeout(tmp_path):
  # A port bound and never listened on refuses connections, and no other process can take it (a
  # free port could become another run's coordinator, which the probe would reach).
  with socket.socket() as reserved:
    reserved.bind(('127.0.0.1', 0))
    cmd = helpers.main_args('configs/demo.py', str(tmp_path), {}) + [
        f'--coordinator_address=127.0.0.1:{reserved.getsockname()[1]}',
        '--num_processes=2',
        '--process_id=1',
        '--distributed_timeout=5',
    ]
    run = subprocess.run(cmd, cwd=helpers.REPO, capture_output=True, text=True, timeout=120)
  assert run.returncode == 2, run.stderr[-2000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'could not reach the coordinator' in errors[0], run.stderr[-2000:]


# Same data, same seed, any mesh: the same 20 losses (dropout included). data_shards=2 fixes the data
# streams, so one process and two processes see the same batches.
_TRAJECTORY = {
    **helpers.TINY,
    'total_steps': 20,
    'log_every_steps': 1,
    'eval_every_steps': 20,
    'checkpoint_every_steps': 20,
    'model.dropout_rate': 0.1,
    'model.patch_dropout': 0.25,  # Its draws too are the same on every mesh.
    'data_shards': 2,
}


def _losses(workdir):
  losses = helpers.read_scalars(workdir)['train_loss']
  assert sorted(losses) == list(range(1, 21))
  return np.array([losses[s] for s in sorted(losses)])


@pytest.mark.slow
@pytest.mark.devices(8)
def test_loss_trajectory_is_the_same_on_every_mesh_and_across_hosts(tmp_path, data_dir):
  overrides = {**_TRAJECTORY, 'data_dir': data_dir}
  run = subprocess.run(
      helpers.main_args('configs/demo.py', str(tmp_path / 'one'), overrides),
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      env=helpers.on_devices(1),
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  reference = _losses(str(tmp_path / 'one'))

  for name, mesh in [
      ('data8', "(('data', 8),)"),
      ('data2_fsdp4', "(('data', 2), ('fsdp', 4))"),
      ('tensor2_data4', "(('tensor', 2), ('data', 4))"),
  ]:
    run = helpers.run_main(
        'configs/demo.py', str(tmp_path / name), {**overrides, 'mesh': mesh}, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    np.testing.assert_allclose(_losses(str(tmp_path / name)), reference, rtol=1e-5, err_msg=name)

  # Whatever order config.mesh lists the axes in, each host's devices hold its own block of the batch:
  # tensor first would split it inside each host and take the hosts' rows for copies of each other,
  # fsdp first would interleave them.
  for name, mesh in [
      ('two_hosts', "(('data', -1),)"),
      ('two_hosts_tensor2_data4', "(('tensor', 2), ('data', 4))"),
      ('two_hosts_fsdp4_data2', "(('fsdp', 4), ('data', 2))"),
  ]:
    workdir = str(tmp_path / name)
    code = local.launch(
        helpers.main_args('configs/demo.py', workdir, {**overrides, 'mesh': mesh})[3:],
        num_processes=2,
        devices_per_process=4,
        timeout=600,
    )
    assert code == 0, name
    np.testing.assert_allclose(_losses(workdir), reference, rtol=1e-5, err_msg=name)
