"""The training loop end to end on the bundled digits: metrics, checkpoints, exact resume, bad input."""

import os
import shutil
import subprocess
import sys
import time

import chex
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P
from PIL import Image

import helpers
from vit_jax import data, sharding
from vit_jax.checkpoints import checkpoint, npz_files, run_dir, saved_state
from vit_jax.train import loop, pace, setup as train_setup, state as train_state


def _checkpoint_steps(workdir):
  return sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())


def test_loop_writes_metrics_and_keeps_the_last_checkpoints(tmp_path, data_dir):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'keep_checkpoints': 2, 'lr.decay': 'linear'}
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert set(metrics) == {'eval_top1', 'eval_top5', 'eval_loss'}
  assert 0.0 <= metrics['eval_top1'] <= metrics['eval_top5'] <= 1.0
  assert _checkpoint_steps(tmp_path) == [8, 12]
  scalars = helpers.read_scalars(str(tmp_path))
  for tag in ('train_loss', 'grad_norm', 'learning_rate', 'images_per_sec'):
    assert sorted(scalars[tag]) == [4, 8, 12], tag
  assert scalars['eval_top1'] == {12: pytest.approx(metrics['eval_top1'])}
  for tag in ('steps_per_sec', 'uptime'):  # vit_jax/train/pace.py.
    assert sorted(scalars[tag]) == [4, 8, 12], tag
  assert 0 < scalars['uptime'][4] < scalars['uptime'][8] < scalars['uptime'][12]
  saved_config, saved_info = run_dir.load_run_info(str(tmp_path))
  assert saved_config.variant == 'ViT-testing_4' and saved_config.lr.decay == 'linear'
  assert saved_info.class_names == tuple('0123456789') and saved_info.num_train == 1437
  # Warmup over 2 steps then linear decay to 0 at step 12: the rate of step 12's update (the
  # schedule at 11), not the window's mean, as train_loss is.
  for step in (4, 8, 12):
    assert scalars['learning_rate'][step] == pytest.approx(1e-3 * (1 - (step - 3) / 10), rel=1e-5)


def test_the_loop_reports_the_time_it_waits_for_a_slow_input_pipeline(
    tmp_path, data_dir, monkeypatch
):
  """Batches that come 0.5 s apart hold the tiny model's steps back: the `input_wait` scalars say
  so, and on an accelerator the log warns once (on CPU the pipeline and the steps share the cores:
  it only says the share). No checkpoint before the last step: its writing is time not spent
  waiting, which on a loaded machine took more than half of steps 5-8."""
  train_iterator = loop.data.train_iterator

  def slow(*args, **kwargs):
    batches = train_iterator(*args, **kwargs)
    try:
      for batch in batches:
        time.sleep(0.5)
        yield batch
    finally:
      batches.close()

  monkeypatch.setattr(loop.data, 'train_iterator', slow)
  monkeypatch.setattr(pace, 'on_accelerator', lambda: True)
  warnings = []
  monkeypatch.setattr(pace.logging, 'warning', lambda *args: warnings.append(args[0] % args[1:]))
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'checkpoint_every_steps': 12}
  )
  loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  waits = helpers.read_scalars(str(tmp_path))['input_wait']
  assert sorted(waits) == [4, 8, 12]
  assert waits[4] > 0.5 and waits[8] > 0.5, waits
  assert len([w for w in warnings if w.startswith('The train steps waited for input')]) == 1


def test_loop_learns_the_digits(tmp_path, data_dir):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'total_steps': 150,
          'batch_size': 64,
          'lr.base': 3e-3,
          'lr.warmup_steps': 10,
          'eval_every_steps': 150,
          'log_every_steps': 50,
          'checkpoint_every_steps': 150,
      },
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert metrics['eval_top1'] > 0.6  # Chance is 0.1.


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_polyak_average_is_kept_and_evaluated(tmp_path, data_dir):
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 8, 'eval_every_steps': 8}
  runs = {}
  for decay in (None, 0.0, 0.5):
    workdir = str(tmp_path / str(decay))
    config = helpers.load_config('demo', {**overrides, 'polyak_decay': decay})
    metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
    state = ocp.StandardCheckpointer().restore(os.path.join(workdir, 'checkpoints', '8', 'default'))
    runs[decay] = metrics, state
  assert 'eval_polyak_top1' not in runs[None][0] and runs[None][1]['ema_params'] is None
  # Decay 0 averages nothing: the average is the parameters, and so are its metrics.
  chex.assert_trees_all_equal(runs[0.0][1]['ema_params'], runs[0.0][1]['params'])
  assert runs[0.0][0]['eval_polyak_loss'] == pytest.approx(runs[0.0][0]['eval_loss'], rel=1e-6)
  # Decay 0.5 lags behind: a different model with different metrics.
  ema, params = runs[0.5][1]['ema_params'], runs[0.5][1]['params']
  assert not np.allclose(ema['head']['kernel'], params['head']['kernel'])
  assert runs[0.5][0]['eval_polyak_loss'] != runs[0.5][0]['eval_loss']
  chex.assert_trees_all_equal(params, runs[None][1]['params'])


@pytest.mark.parametrize('name', ['vit_b16_i1k', 'vit_l16_i21k'])
def test_pretraining_configs_run_a_step(tmp_path, data_dir, name):
  config = helpers.load_config(
      name,
      {
          'dataset': 'digits',
          'data_dir': data_dir,
          'train_split': 'train',
          'eval_split': 'test',
          'variant': 'ViT-testing_8',
          'model.representation_size': 16,
          'image_size': 16,
          'batch_size': 8,
          'eval_batch_size': 120,
          'total_steps': 1,
          'num_epochs': None,
      },
  )
  metrics = loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert np.isfinite(metrics['eval_loss'])
  assert _checkpoint_steps(tmp_path) == [1]


# Bad input: a one-line error naming the fix, raised before anything is compiled or written.
@pytest.mark.parametrize(
    'overrides,message',
    [
        ({'variant': 'ViT-Q_16'}, 'Unknown model variant'),
        ({'dataset': 'no_such_dataset'}, "Unknown dataset 'no_such_dataset'"),
        pytest.param(
            {'batch_size': 12},
            r'batch_size=12 is not divisible by the 8 devices.*--config.batch_size=8',
            marks=pytest.mark.devices(8),
        ),
        pytest.param(
            {'eval_batch_size': 20},
            r'eval_batch_size=20 is not divisible',
            marks=pytest.mark.devices(8),
        ),
        (
            {'image_size': 10},
            r'image_size=10 is not divisible by the patch size 4.*--config.image_size=8',
        ),
        pytest.param(
            {'mesh': (('data', 3),)},
            'multiply to 3, but there are 8 devices',
            marks=pytest.mark.devices(8),
        ),
        ({'optim.name': 'lamb'}, "Unknown optim.name 'lamb'"),
        ({'total_steps': None}, 'Set exactly one of config.total_steps and config.num_epochs'),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, data_dir, overrides, message):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, **overrides})
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(config, str(tmp_path / 'workdir'))
  assert '\n' not in str(error.value)
  assert not os.path.exists(tmp_path / 'workdir')


@pytest.mark.parametrize(
    'epochs, examples, batch, steps',
    [(0.56, 1400, 16, 49), (0.5, 1437, 32, 23), (90, 1281167, 4096, 28151)],
)
def test_epochs_are_the_steps_of_the_decimal_given_rounded_up(epochs, examples, batch, steps):
  """ceil(epochs x examples / batch) of the number as written: 0.56 x 1400 / 16 is 49, which float
  arithmetic makes 49.00000000000001 (50 steps)."""
  config = helpers.load_config(
      'demo', {'total_steps': None, 'num_epochs': epochs, 'batch_size': batch}
  )
  info = data.DatasetInfo(
      num_classes=10, num_train=examples, num_eval=1, class_names=tuple('0123456789')
  )
  assert train_setup.total_steps(config, info) == steps


def test_unwritable_workdir_is_a_clear_error(tmp_path, data_dir):
  (tmp_path / 'a_file').write_text('')
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  with pytest.raises(ValueError, match='is not writable.*--workdir'):
    train_setup.prepare(config, str(tmp_path / 'a_file' / 'workdir'))
  with pytest.raises(
      ValueError,
      match=r"--workdir='.*a_file' is not writable \(it is a file, not a " r'directory\)',
  ):
    train_setup.prepare(config, str(tmp_path / 'a_file'))


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--config.batch_sise=8'],
            'the config has no field batch_sise.*Did you mean "batch_size"',
        ),
        pytest.param(
            ['--config.batch_size=12'],
            'batch_size=12 is not divisible',
            marks=pytest.mark.devices(8),
        ),
        (['--config.batch_size=many'], 'error: '),
    ],
)
def test_command_line_errors_are_one_line(tmp_path, data_dir, args, message):
  cmd = helpers.main_args('configs/demo.py', str(tmp_path / 'w'), {'data_dir': data_dir}) + args
  run = subprocess.run(cmd, cwd=helpers.REPO, capture_output=True, text=True, timeout=300)
  assert run.returncode == 2
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert __import__('re').search(message, errors[0]), errors[0]


def test_a_config_file_that_does_not_exist_is_one_line(tmp_path):
  # config_flags raised the missing file's error at first use: a traceback of 40 lines.
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'vit_jax.main',
          '--config=configs/no_such_file.py',
          f'--workdir={tmp_path / "w"}',
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
  assert not (tmp_path / 'w').exists()


# Fine-tuning from a checkpoint: config.init_from.
@pytest.fixture(scope='module')
def pretrained_workdir(tmp_path_factory, data_dir):
  workdir = str(tmp_path_factory.mktemp('pretrained'))
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 4})
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  return workdir


def test_finetune_at_a_new_resolution_resizes_posemb_and_replaces_head(
    tmp_path, data_dir, pretrained_workdir, caplog
):
  config = helpers.load_config(
      'demo_finetune',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'init_from': pretrained_workdir,
          'image_size': 16,
          'total_steps': 2,
          'polyak_decay': 0.9,
      },
  )
  with caplog.at_level('INFO'):
    setup = train_setup.prepare(config, str(tmp_path))
  assert 'resized pos_embedding 2x2 -> 4x4 (bilinear)' in caplog.text
  assert 'replaced head (32, 10) with zeros (32, 10)' in caplog.text
  np.testing.assert_array_equal(setup.init_params['head']['kernel'], 0.0)
  pretrained = ocp.StandardCheckpointer().restore(
      os.path.join(pretrained_workdir, 'checkpoints', '4', 'default')
  )['params']
  np.testing.assert_array_equal(
      setup.init_params['embedding']['kernel'], pretrained['embedding']['kernel']
  )
  # The loop starts from those parameters (and so does the Polyak average).
  state, _, _ = train_state.create_state(setup, checkpoint.make_manager(str(tmp_path), keep=1))
  chex.assert_trees_all_equal(jax.device_get(state.params), setup.init_params)
  chex.assert_trees_all_equal(jax.device_get(state.ema_params), setup.init_params)
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_top1'])


def test_zero_steps_evaluate_init_from_as_it_is_and_train_and_save_nothing(
    tmp_path, data_dir, pretrained_workdir, caplog, monkeypatch
):
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'init_from': pretrained_workdir,
          'keep_head': True,
          'total_steps': 0,
          'knn.every_steps': 1,
          'knn.ks': (5,),
          'polyak_decay': 0.999,  # The average is the parameters at step 0: measured once.
      },
  )
  workdir = str(tmp_path / 'evaluated')
  with caplog.at_level('INFO'):
    metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert f'Evaluating config.init_from={pretrained_workdir} (total_steps=0' in caplog.text
  # The pretrained run's own last evaluation: the same parameters on the same images.
  pretrained = helpers.read_scalars(pretrained_workdir)
  for name in ('eval_top1', 'eval_loss'):
    assert metrics[name] == pytest.approx(pretrained[name][4], rel=1e-6), name
  scalars = helpers.read_scalars(workdir)
  assert list(scalars['eval_top1']) == list(scalars['knn_5nn']) == [0]  # Once, at step 0.
  assert 'train_loss' not in scalars and not saved_state.saved_steps(workdir)
  assert not [name for name in scalars if '_polyak_' in name], sorted(scalars)
  # A new head of zeros would measure nothing: the run says so.
  config.keep_head = False
  prepared = []  # What the set-up makes for the input streams (a Parquet split's copy): no train's.
  monkeypatch.setattr(train_setup.data, 'prepare', lambda *args, **kw: prepared.append(kw))
  with caplog.at_level('WARNING'):
    train_setup.prepare(config, str(tmp_path / 'new_head'))
  assert "with a new head (zeros) for this dataset's classes: the task's metrics" in caplog.text
  assert prepared == [{'train': False}]


@pytest.mark.parametrize('steps', [{'total_steps': 0}, {'total_steps': None, 'num_epochs': 0.0}])
def test_zero_steps_without_init_from_is_a_one_line_error(tmp_path, data_dir, steps):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, **steps})
  with pytest.raises(
      ValueError, match=r'^The run has 0 steps, which evaluates the parameters of config.init_from '
  ) as raised:
    train_setup.prepare(config, str(tmp_path / 'run'))
  assert '\n' not in str(raised.value) and not (tmp_path / 'run').exists()


def _three_class_folder(root):
  for split in ('train', 'test'):
    for label in 'abc':
      os.makedirs(root / split / label)
      Image.new('RGB', (8, 8)).save(root / split / label / '0.png')
  return str(root)


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
@pytest.mark.devices(8)
def test_scanned_training_keeps_per_block_checkpoints_that_resume_either_way(tmp_path, data_dir):
  """Scan trains on stacked blocks (sharded over fsdp and tensor), but writes the original layout."""
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'total_steps': 8,
      'log_every_steps': 1,
      'eval_every_steps': 8,
      'mesh': (('fsdp', 4), ('tensor', 2)),
      'polyak_decay': 0.5,
      'model.dropout_rate': 0.0,  # Scanned blocks draw other dropout masks than a loop.
      # SGD: Adam's first steps are about lr * sign(grad), which turns float noise in
      # near-zero gradients into differences of 2 * lr.
      'optim.name': 'sgd',
      'optim.weight_decay': 0.0,
      'lr.base': 0.1,
  }
  setup = train_setup.prepare(
      helpers.load_config('demo', {**overrides, 'model.scan': True}), str(tmp_path / 'state')
  )
  state, _, to_checkpoint = train_state.create_state(
      setup, checkpoint.make_manager(setup.workdir, 1)
  )
  kernels = [
      leaf
      for path, leaf in jax.tree_util.tree_leaves_with_path(state)
      if jax.tree_util.keystr(path).endswith("['encoderblock']['MlpBlock_3']['Dense_0']['kernel']")
  ]
  assert len(kernels) == 3  # Parameters, SGD momentum, Polyak average.
  assert all(
      k.shape == (2, 32, 64) and k.sharding.spec == P(None, 'fsdp', 'tensor') for k in kernels
  )
  assert sorted(to_checkpoint(state).ema_params['Transformer']) == [
      'encoder_norm',
      'encoderblock_0',
      'encoderblock_1',
      'posembed_input',
  ]

  losses, params = {}, {}
  for scan in (False, True):
    workdir = str(tmp_path / f'scan={scan}')
    loop.train_and_evaluate(
        train_setup.prepare(helpers.load_config('demo', {**overrides, 'model.scan': scan}), workdir)
    )
    scalars = helpers.read_scalars(workdir)['train_loss']
    losses[scan] = [scalars[step] for step in range(1, 9)]
    params[scan], _ = saved_state.restore_params(os.path.join(workdir, 'checkpoints', '8'))
  np.testing.assert_allclose(losses[True], losses[False], rtol=1e-5)
  assert (
      'encoderblock_1' in params[True]['Transformer']
      and 'encoderblock' not in params[True]['Transformer']
  )
  jax.tree.map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
      params[True],
      params[False],
  )

  # The scanned run's step-4 checkpoint resumes without scan (and an unscanned one with it).
  for scan in (True, False):
    resumed = str(tmp_path / f'resumed_from_scan={scan}')
    shutil.copytree(str(tmp_path / f'scan={scan}'), resumed)
    shutil.rmtree(os.path.join(resumed, 'checkpoints', '8'))
    loop.train_and_evaluate(
        train_setup.prepare(
            helpers.load_config('demo', {**overrides, 'model.scan': not scan}), resumed
        )
    )
    final, _ = saved_state.restore_params(os.path.join(resumed, 'checkpoints', '8'))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), final, params[scan]
    )


@pytest.mark.parametrize(
    'overrides,message',
    [
        (
            {'init_from': '/nonexistent/ViT-B_16.npz'},
            "no checkpoint file at '/nonexistent/ViT-B_16.npz'",
        ),
        (  # Another patch size is resampled (tests/models/test_patch_embedding.py); another MLP is not.
            {'model.mlp_dim': 32},
            r'encoderblock_0/MlpBlock_3/Dense_0/bias: checkpoint \(64,\) vs model \(32,\)',
        ),
        (
            {'keep_head': True, 'dataset': 'folder'},
            r'head/kernel: checkpoint \(32, 10\) vs model \(32, 3\).*--config.keep_head=False',
        ),
    ],
)
def test_bad_checkpoints_are_clear_errors(
    tmp_path, data_dir, pretrained_workdir, overrides, message
):
  overrides = {**helpers.TINY, 'data_dir': data_dir, 'init_from': pretrained_workdir, **overrides}
  if overrides.get('dataset') == 'folder':
    overrides['data_dir'] = _three_class_folder(tmp_path / 'images')
  config = helpers.load_config('demo_finetune', overrides)
  with pytest.raises(ValueError, match=message) as error:
    train_setup.prepare(config, str(tmp_path / 'workdir'))
  assert '\n' not in str(error.value)
  assert not os.path.exists(tmp_path / 'workdir')


@pytest.mark.parametrize(
    'name,dataset,resolution,steps',
    [
        ('vit_b16_finetune', 'cifar10', 384, 10_000),
        ('vit_b16_finetune', 'oxford_iiit_pet', 384, 500),
        ('vit_b16_finetune', 'imagenet2012', 384, 20_000),
        ('vit_l16_finetune', 'imagenet2012', 512, 20_000),
    ],
)
def test_finetune_configs_follow_the_paper(name, dataset, resolution, steps):
  config = __import__(f'configs.{name}', fromlist=['get_config']).get_config(dataset)
  assert (config.image_size, config.total_steps, config.batch_size) == (resolution, steps, 512)
  assert (config.optim.name, config.optim.momentum, config.optim.weight_decay) == ('sgd', 0.9, 0.0)
  assert (config.lr.decay, config.grad_clip_norm, config.keep_head) == ('cosine', 1.0, False)
  assert config.model.representation_size is None


def test_finetune_config_runs_from_an_npz(tmp_path, data_dir, pretrained_workdir):
  params, _ = run_dir.load_params(pretrained_workdir)
  npz_files.save_npz(params, str(tmp_path / 'tiny.npz'))
  config = helpers.load_config(
      'vit_b16_finetune',
      {
          **helpers.TINY,
          'dataset': 'digits',
          'data_dir': data_dir,
          'train_split': 'train',
          'eval_split': 'test',
          'init_from': str(tmp_path / 'tiny.npz'),
          'image_size': 12,
          'total_steps': 1,
          'lr.warmup_steps': 0,
          'dtype': 'float32',
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'workdir'))
  assert setup.init_params['Transformer']['posembed_input']['pos_embedding'].shape == (1, 10, 32)
  assert np.isfinite(loop.train_and_evaluate(setup)['eval_loss'])


def test_device_batches_go_to_the_devices_ahead_in_order():
  taken = []

  def local_batches(n):
    for i in range(n):
      taken.append(i)
      yield {'image': np.full((8, 2), i, np.float32), 'label': np.full((8,), i, np.int32)}

  mesh = sharding.make_mesh((('data', -1),))
  for ahead in (0, 2):
    taken.clear()
    batches = loop.device_batches(local_batches(5), mesh, ahead)
    first = next(batches)
    assert taken == list(range(ahead + 1))  # The next `ahead` are on their way.
    assert isinstance(first['image'], jax.Array) and first['image'].sharding.spec == P('data')
    rest = list(batches)
    assert [int(b['label'][0]) for b in [first, *rest]] == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(rest[-1]['image'], np.full((8, 2), 4))


def test_device_prefetch_changes_no_result(tmp_path, data_dir):
  params = {}
  for ahead in (0, 2):
    workdir = str(tmp_path / str(ahead))
    overrides = {**helpers.TINY, 'data_dir': data_dir, 'device_prefetch': ahead}
    loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), workdir))
    params[ahead] = helpers.checkpoint_params(workdir, 12)
  chex.assert_trees_all_equal(params[0], params[2])
