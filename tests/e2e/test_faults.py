"""What goes wrong on long runs, made to happen: divergence, a changed config or a damaged checkpoint
on resume, preemption."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import chex
import numpy as np
import orbax.checkpoint as ocp
import pytest
from PIL import Image

import helpers
from vit_jax.checkpoints import checkpoint, label_order, run_dir, saved_state
from vit_jax.runtime import dispatch
from vit_jax.tools import export
from vit_jax.train import loop, preemption, setup as train_setup, state, watchdog
import local

# SGD at a learning rate no model survives, unclipped: the loss of this run is NaN at step 4.
DIVERGING = {
    **helpers.TINY,
    'optim.name': 'sgd',
    'lr.base': 1e3,
    'lr.warmup_steps': 0,
    'grad_clip_norm': 0.0,
    'log_every_steps': 1,
    'checkpoint_every_steps': 2,
}


def test_a_diverged_run_stops_at_that_step_and_keeps_its_good_checkpoints(tmp_path, data_dir):
  config = helpers.load_config('demo', {**DIVERGING, 'data_dir': data_dir})
  with pytest.raises(loop.DivergedError, match=r'^train_loss is nan at step 4: .*config.lr.base'):
    loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2']  # Nothing of step 4 or later.
  params, _ = saved_state.restore_params(str(tmp_path / 'checkpoints' / '2'))
  chex.assert_tree_all_finite(params)


def test_a_diverged_run_is_one_line_and_a_failure_status_on_the_command_line(tmp_path, data_dir):
  run = helpers.run_main(
      'configs/demo.py', str(tmp_path), {**DIVERGING, 'data_dir': data_dir}, timeout=300
  )
  assert run.returncode == 1, run.stderr[-2000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'train_loss is nan at step 4' in errors[0], run.stderr[-2000:]
  assert 'Traceback' not in run.stderr


def test_resuming_with_a_model_the_checkpoint_cannot_take_is_one_line_and_writes_nothing(
    trained_tiny_run, tmp_path
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  before = helpers.files_of(workdir)
  config, _ = run_dir.load_run_info(workdir)
  run = helpers.run_main(
      'configs/demo.py',
      workdir,
      {
          **helpers.TINY,
          'data_dir': config.data_dir,
          'lr.base': config.lr.base,
          'model.hidden_size': 64,
          'total_steps': 20,
      },
      timeout=300,
  )
  assert run.returncode == 2, run.stderr[-2000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'Traceback' not in run.stderr, run.stderr[-2000:]
  assert 'does not fit the model and optimizer of this config' in errors[0]
  assert 'model.hidden_size 32 -> 64)' in errors[0]  # total_steps may change: not to set back.
  assert helpers.files_of(workdir) == before  # config.json, checkpoints and metrics as they were.
  # So the tools still read the run.
  assert export.export(workdir, str(tmp_path / 'exported'))['step'] == 12


def test_resuming_on_other_classes_is_refused(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  folder = tmp_path / 'folder'
  for split in ('train', 'test'):
    for label in 'abc':
      (folder / split / label).mkdir(parents=True)
      Image.fromarray(np.full((8, 8, 3), 100, np.uint8)).save(folder / split / label / '0.png')
  config = helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'dataset': 'folder',
          'data_dir': str(folder),
          'batch_size': 8,
          'eval_batch_size': 8,
      },
  )
  with pytest.raises(
      state.ResumeError,
      match=r'holds a run on the 10 classes of other data than this '
      r"dataset's 3 \(10 classes gone \('0', '1', '2' and 7 more\), 3 classes new \('a', "
      r"'b', 'c'\); changed fields: .*dataset 'digits' -> 'folder'",
  ):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))


@pytest.mark.parametrize(
    'old,new,said',
    [
        (
            ('Blue', 'grün', 'red apple'),
            ('grün', 'red apple', 'zblue'),  # The audit's renamed class folder.
            "1 class gone ('Blue'), 1 class new ('zblue')",
        ),
        (('a', 'b'), ('a', 'b', 'c', 'd', 'e', 'f'), "4 classes new ('c', 'd', 'e' and 1 more)"),
        (
            ('a', 'b', 'c'),
            ('a', 'c', 'b'),
            "the same classes in another order: label 1 is 'c', was 'b'",
        ),
    ],
)
def test_refusing_other_classes_names_those_that_differ(old, new, said):
  assert label_order.class_changes(old, new) == said


def test_a_resume_on_other_data_shards_warns_that_its_batches_change(
    trained_tiny_run, tmp_path, caplog
):
  """A run's data shards (unset: one per process) are stored with it; resumed on another number of
  processes, its batches change: a warning names the flag that keeps them."""
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config_json = os.path.join(workdir, 'config.json')
  stored = json.loads(open(config_json).read())
  assert stored['data_shards'] == 1  # Resolved for the one process that trained it.
  with open(config_json, 'w') as f:
    json.dump({**stored, 'data_shards': 2}, f)  # As two processes would have stored it.
  config, _ = run_dir.load_run_info(workdir)
  config.data_shards, config.total_steps = None, 14
  with caplog.at_level('INFO'):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert any(
      'trained on 2 data shards and resumes on 1' in w and '--config.data_shards=2' in w
      for w in warnings
  ), warnings


def test_a_safe_change_resumes_and_keeps_the_config_history(trained_tiny_run, tmp_path, caplog):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  first = open(os.path.join(workdir, 'config.json')).read()
  config, _ = run_dir.load_run_info(workdir)
  config.total_steps, config.eval_every_steps = 16, 16
  with caplog.at_level('INFO'):
    metrics = loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert 'changed config fields: eval_every_steps 12 -> 16; total_steps 12 -> 16' in caplog.text
  assert np.isfinite(metrics['eval_top1'])
  assert open(os.path.join(workdir, 'config.json')).read() == first  # The model the tools rebuild.
  assert json.loads(open(os.path.join(workdir, 'config.resume_1.json')).read())['total_steps'] == 16
  assert (
      sorted(int(d) for d in os.listdir(os.path.join(workdir, 'checkpoints')) if d.isdigit())[-1]
      == 16
  )
  # Started again as it is (a requeued job): no copy of the same config; another one is kept.
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  config.total_steps = 18
  loop.train_and_evaluate(train_setup.prepare(config, workdir))
  resumes = sorted(f for f in os.listdir(workdir) if f.startswith('config.resume_'))
  assert resumes == ['config.resume_1.json', 'config.resume_2.json']
  assert json.loads(open(os.path.join(workdir, 'config.resume_2.json')).read())['total_steps'] == 18


def _damage(checkpoint_dir: str, how: str) -> None:
  """What a storage fault leaves: a checkpoint's metadata lost, or its array data cut short."""
  default = os.path.join(checkpoint_dir, 'default')
  if how == 'lost metadata':
    os.remove(os.path.join(default, '_METADATA'))
    return
  for root, _, names in os.walk(default):
    for name in names:
      if os.path.basename(root) == 'd':  # The array data (ocdbt), wherever orbax put it.
        with open(os.path.join(root, name), 'r+b') as f:
          f.truncate(os.path.getsize(os.path.join(root, name)) // 2)


@pytest.mark.parametrize('how', ['lost metadata', 'truncated data'])
def test_a_damaged_latest_checkpoint_is_reported_and_the_one_before_resumes(
    trained_tiny_run, tmp_path, caplog, how
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  _damage(os.path.join(workdir, 'checkpoints', '12'), how)
  config, _ = run_dir.load_run_info(workdir)
  config.total_steps = 16
  with caplog.at_level('INFO'):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))
  assert 'Checkpoint 12 in' in caplog.text and 'cannot be read' in caplog.text
  assert 'at step 8' in caplog.text  # Resumed from the one before.
  assert saved_state.saved_steps(workdir)[-1] == 16


@pytest.mark.parametrize('how', ['lost metadata', 'truncated data'])
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_same_command_saves_it_again(
    trained_tiny_run, tmp_path, how
):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  _damage(os.path.join(workdir, 'checkpoints', '12'), how)
  config, _ = run_dir.load_run_info(workdir)
  same = {**helpers.TINY, 'data_dir': config.data_dir, 'lr.base': config.lr.base}
  run = helpers.run_main('configs/demo.py', workdir, same, timeout=300)
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'Training 12 steps from step 8' in run.stderr
  moved = os.path.join(workdir, 'checkpoints', '12.unreadable')
  assert os.path.isdir(moved)  # Nothing written is deleted.
  assert saved_state.saved_steps(workdir) == [4, 8, 12]
  assert export.export(workdir, str(tmp_path / 'exported'))['step'] == 12  # Reads again.
  # The same command once more only evaluates the saved step.
  again = helpers.run_main('configs/demo.py', workdir, same, timeout=300)
  assert again.returncode == 0, again.stderr[-3000:]
  assert 'Run already at step 12 of 12: evaluating only' in again.stderr
  # One clean line more than that resume says what happened: no traceback (tensorstore's callbacks
  # to orbax's closed event loops), no orbax warning about the metadata it looked for.
  extra = [line for line in _warnings(run.stderr) if line not in _warnings(again.stderr)]
  assert len(extra) == 1 and 'Traceback' not in run.stderr, run.stderr[-3000:]
  assert re.match(
      rf'Checkpoint 12 in {re.escape(workdir)}/checkpoints cannot be read \([^\n]+\): moved '
      rf'it to {re.escape(moved)} so that its step is saved again; resuming from checkpoint '
      r'8$',
      extra[0],
  ), extra[0]
  assert 'TensorStore details' not in extra[0] and 'bound method' not in extra[0]


def _warnings(stderr: str) -> list[str]:
  """The messages of the warning lines of a run's output."""
  return [
      line.split('] ', 1)[-1] for line in stderr.splitlines() if re.match(r'W\d{4} |WARNING', line)
  ]


def test_a_save_orbax_declines_is_an_error_not_a_silent_skip(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  saver = checkpoint.Saver(checkpoint.make_manager(workdir, keep=3))
  with pytest.raises(
      checkpoint.SaveError,
      match=r'^orbax declined to save checkpoint 8 in '
      r'.*checkpoints, which holds steps \[4, 8, 12\]: move those from 8 on out of it',
  ):
    saver.save(8, {'x': np.zeros(2)})
  saver.close()


def test_an_unreadable_checkpoint_has_the_innermost_reason_without_tensorstore_spec():
  try:
    try:
      raise ValueError(
          'OUT_OF_RANGE: Error opening "cast" driver: Error opening "zarr" driver: Error '
          'reading "step/.zarray": Requested byte range [0, 8) is not valid for value of '
          'size 4 [tensorstore_spec=\'{"driver":"zarr"}\']'
      )
    except ValueError as e:
      raise Exception(
          'Encountered error while reading array index: (). See full TensorStore details: '
          '<bound method pybind11_detail_function_record_v1_system_libstdcpp>.'
      ) from e
  except Exception as e:  # pylint: disable=broad-except
    assert checkpoint._reason(e) == (
        'OUT_OF_RANGE: Error reading "step/.zarray": Requested byte range '
        '[0, 8) is not valid for value of size 4'
    )


def test_no_readable_checkpoint_is_one_line_naming_the_directory(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  for step in saved_state.saved_steps(workdir):
    _damage(os.path.join(workdir, 'checkpoints', str(step)), 'truncated data')
  config, _ = run_dir.load_run_info(workdir)
  with pytest.raises(
      ValueError, match=r'none of the checkpoints \[4, 8, 12\] in .*checkpoints can be ' 'read'
  ):
    loop.train_and_evaluate(train_setup.prepare(config, workdir))


# Preemption: long runs (helpers.LONG) stopped by SIGTERM once their step-4 checkpoint exists.


def test_sigterm_saves_the_current_step_and_exits_to_be_requeued(tmp_path, data_dir):
  workdir = str(tmp_path / 'run')
  proc = subprocess.Popen(
      helpers.main_args('configs/demo.py', workdir, {**helpers.LONG, 'data_dir': data_dir}),
      cwd=helpers.REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
  )
  helpers.wait_for_checkpoint(workdir, [proc])
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == preemption.REQUEUE_STATUS, stderr[-3000:]
  stopped = int(re.search(r'stopped on request at step (\d+) after saving', stderr)[1])
  assert stopped > 4 and saved_state.saved_steps(workdir)[-1] == stopped
  assert 'Traceback' not in stderr
  # The same command resumes there (here with fewer steps to go).
  run = helpers.run_main(
      'configs/demo.py',
      workdir,
      {**helpers.LONG, 'data_dir': data_dir, 'total_steps': stopped + 2},
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  assert f'Training {stopped + 2} steps from step {stopped}' in run.stderr
  # ... and ends bit-identical to a run that was never stopped.
  reference = helpers.load_config(
      'demo', {**helpers.LONG, 'data_dir': data_dir, 'total_steps': stopped + 2}
  )
  loop.train_and_evaluate(train_setup.prepare(reference, str(tmp_path / 'reference')))
  last = os.path.join('checkpoints', str(stopped + 2))
  chex.assert_trees_all_equal(
      saved_state.restore_params(os.path.join(workdir, last))[0],
      saved_state.restore_params(str(tmp_path / 'reference' / last))[0],
  )


@pytest.mark.skipif(not os.path.isdir('/proc'), reason='reads process groups from /proc')
def test_ctrl_c_at_a_terminal_saves_and_stops_the_run_and_its_data_workers(
    tmp_path, sorted_digits_folder
):
  """Ctrl-C signals every process of the terminal's foreground group: the run's grain workers too.
  They leave the stop to the run, which saves, stops them and exits to be requeued, with no
  traceback from any of them."""
  workdir = str(tmp_path / 'run')
  overrides = {
      **helpers.LONG,
      'dataset': 'folder',
      'data_dir': sorted_digits_folder,
      'data_workers': 2,
  }
  proc = subprocess.Popen(
      helpers.main_args('configs/demo.py', workdir, overrides),
      cwd=helpers.REPO,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      start_new_session=True,
  )  # Its own process group, as a terminal's job.
  helpers.wait_for_checkpoint(workdir, [proc])
  os.killpg(proc.pid, signal.SIGINT)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode == preemption.REQUEUE_STATUS, stderr[-3000:]
  assert re.search(r'stopped on request at step \d+ after saving', stderr), stderr[-3000:]
  assert 'Traceback' not in stderr and 'KeyboardInterrupt' not in stderr, stderr[-3000:]
  deadline = time.time() + 30  # multiprocessing's resource tracker ends once its pipe closes.
  while helpers.running_in_group(proc.pid) and time.time() < deadline:
    time.sleep(0.1)
  assert not helpers.running_in_group(proc.pid)  # No worker is left.


def test_sigterm_to_one_of_two_processes_saves_the_same_step_on_both(tmp_path, data_dir):
  workdir = str(tmp_path / 'run')
  procs = helpers.two_processes(
      helpers.main_args('configs/demo.py', workdir, {**helpers.LONG, 'data_dir': data_dir})
  )
  try:
    helpers.wait_for_checkpoint(workdir, procs)
    procs[1].send_signal(signal.SIGTERM)  # Only one host hears it.
    outputs = [p.communicate(timeout=300)[1] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [preemption.REQUEUE_STATUS] * 2, outputs[0][-3000:]
  steps = [int(re.search(r'stopped on request at step (\d+)', out)[1]) for out in outputs]
  assert steps[0] == steps[1] > 4
  assert saved_state.saved_steps(workdir)[-1] == steps[0]


def _fill_at(checkpoints_dir, trained_tiny_run, monkeypatch) -> str:
  """Makes `checkpoints_dir` fill up when the save of step 12 starts: a tmpfs where this process may
  mount one, filled with a ballast file once the saves before have finished (sizing a small tmpfs for
  "about three checkpoints" depends on how orbax stages its files, which differs between machines),
  else an injected ENOSPC on the files of that save. Returns which."""
  one = sum(
      os.path.getsize(os.path.join(root, f)) + 4096
      for root, _, files in os.walk(os.path.join(trained_tiny_run, 'checkpoints', '4'))
      for f in files
  )
  os.makedirs(checkpoints_dir)
  mounted = (
      subprocess.run(
          [
              'mount',
              '-t',
              'tmpfs',
              '-o',
              f'size={20 * one // 1024}k',
              'tmpfs',
              str(checkpoints_dir),
          ],
          capture_output=True,
      ).returncode
      == 0
  )
  if mounted:
    save = checkpoint.save

    def save_on_a_full_disk(manager, step, state, metrics=None):
      if step == 12:  # The Saver has waited for the saves before this one.
        _fill(os.path.join(checkpoints_dir, 'ballast'))
      return save(manager, step, state, metrics)

    monkeypatch.setattr(checkpoint, 'save', save_on_a_full_disk)
    return 'tmpfs'
  from orbax.checkpoint._src.path import async_path  # pylint: disable=g-import-not-at-top

  write_text = async_path.write_text

  async def full_disk(path, text, **kwargs):
    if f'{os.sep}12.' in str(path) or f'{os.sep}12{os.sep}' in str(path):
      raise OSError(28, 'No space left on device')
    return await write_text(path, text, **kwargs)

  monkeypatch.setattr(async_path, 'write_text', full_disk)
  return 'injected'


def _fill(path: str) -> None:
  with open(path, 'wb', buffering=0) as f:
    for chunk in (1 << 20, 1 << 12):
      try:
        while True:
          f.write(bytes(chunk))
      except OSError as e:
        assert e.errno == errno.ENOSPC, e


def test_a_full_disk_stops_the_run_in_one_line_and_the_earlier_checkpoints_stay(
    tmp_path, data_dir, trained_tiny_run, monkeypatch
):
  workdir = tmp_path / 'run'
  how = _fill_at(workdir / 'checkpoints', trained_tiny_run, monkeypatch)
  try:
    config = helpers.load_config(
        'demo', {**helpers.TINY, 'data_dir': data_dir, 'keep_checkpoints': 10, 'total_steps': 40}
    )
    with pytest.raises(checkpoint.SaveError) as error:
      loop.train_and_evaluate(train_setup.prepare(config, str(workdir)))
    message = str(error.value)
    assert '\n' not in message, how
    match = re.match(
        rf'^Saving checkpoint (\d+) in {re.escape(str(workdir))}/checkpoints failed '
        r'\(No space left on device, errno 28\): free space there .* of \[(.*)\]$',
        message,
    )
    assert match, (how, message)
    failed, intact = int(match[1]), [int(s) for s in match[2].split(', ')]
    # Every save before the failed one is finished and reads; nothing of it or after it is kept.
    assert intact == saved_state.saved_steps(str(workdir)) == list(range(4, failed, 4)), message
    for step in intact:
      chex.assert_tree_all_finite(
          saved_state.restore_params(str(workdir / 'checkpoints' / str(step)))[0]
      )
  finally:
    if how == 'tmpfs':
      subprocess.run(['umount', str(workdir / 'checkpoints')], check=True)


# vit_jax.main on a file system that refuses the save of step 16 (EROFS, as a read-only mount does).
READ_ONLY_AT_16 = """
import errno, os
from orbax.checkpoint._src.path import async_path
from vit_jax import main
from vit_jax.runtime import cli, config_files
mkdir = async_path.mkdir
async def read_only(path, *args, **kwargs):
  if os.path.basename(str(path)).startswith('16.'):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
  return await mkdir(path, *args, **kwargs)
async_path.mkdir = read_only
cli.run(main.main, flags_parser=config_files.flags_parser(main.USAGE))
"""


def test_a_failed_save_on_the_command_line_exits_promptly_in_one_line(trained_tiny_run, tmp_path):
  workdir = helpers.copy_of(trained_tiny_run, tmp_path)
  config, _ = run_dir.load_run_info(workdir)
  args = helpers.main_args(
      'configs/demo.py',
      workdir,
      {**helpers.TINY, 'data_dir': config.data_dir, 'lr.base': config.lr.base, 'total_steps': 20},
  )[3:]
  # Orbax's threads waiting for the signal of the save that never started kept the process alive.
  run = subprocess.run(
      [sys.executable, '-c', READ_ONLY_AT_16, *args],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=150,
  )
  assert run.returncode == 1, run.stderr[-3000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1 and 'Traceback' not in run.stderr, run.stderr[-3000:]
  assert re.match(
      rf'error: Saving checkpoint 16 in {re.escape(workdir)}/checkpoints failed \(Read-only '
      r'file system, errno 30\): .* of \[4, 8, 12\]$',
      errors[0],
  ), errors[0]


def test_profile_steps_writes_a_trace_of_those_steps_and_memory_is_logged(
    tmp_path, data_dir, caplog
):
  from jax._src.lib import _profile_data  # pylint: disable=g-import-not-at-top

  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'total_steps': 6, 'profile_steps': 2}
  )
  with caplog.at_level('INFO'):
    loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  traces = list((tmp_path / 'plugins' / 'profile').glob('*/*.xplane.pb'))
  assert len(traces) == 1
  steps = {
      dict(event.stats).get('step_num')
      for plane in _profile_data.ProfileData.from_file(str(traces[0])).planes
      for line in plane.lines
      for event in line.events
      if event.name == 'train'
  }
  assert steps == {3, 4}
  (memory,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Memory in use')]
  assert memory.startswith('Memory in use after step 1 (live arrays): '), memory
  per_device = re.findall(r'cpu:(\d) (\d+\.\d) MiB', memory)
  assert [int(d) for d, _ in per_device] == list(range(8)), memory
  assert all(float(mib) > 0 for _, mib in per_device), memory  # Each holds a replica of the state.


def test_skipped_non_finite_steps_within_the_budget_let_the_run_finish_and_are_counted(
    tmp_path, data_dir
):
  # The diverging run's updates from step 4 on are skipped: its parameters stay those of step 3.
  config = helpers.load_config(
      'demo',
      {**DIVERGING, 'data_dir': data_dir, 'skip_nonfinite_steps': 100, 'keep_checkpoints': 10},
  )
  loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  scalars = helpers.read_scalars(str(tmp_path))
  assert scalars['skipped_steps'] == {step: max(0, step - 3) for step in range(1, 13)}
  # A skipped update holds the optimizer's count, so every later update applies update 3's rate (the
  # decaying schedule's): the log shows that rate, not the train step's.
  rates = scalars['learning_rate']
  assert rates[4] < rates[3]
  assert all(rates[step] == rates[4] for step in range(5, 13)), rates
  final, _ = saved_state.restore_params(str(tmp_path / 'checkpoints' / '12'))
  chex.assert_tree_all_finite(final)
  chex.assert_trees_all_equal(
      final, saved_state.restore_params(str(tmp_path / 'checkpoints' / '4'))[0]
  )


def test_more_skipped_steps_than_the_budget_stop_the_run_before_the_next_save(tmp_path, data_dir):
  config = helpers.load_config(
      'demo', {**DIVERGING, 'data_dir': data_dir, 'skip_nonfinite_steps': 2}
  )
  with pytest.raises(
      loop.DivergedError,
      match=r'^3 steps had non-finite gradients by step 6, more '
      r'than config.skip_nonfinite_steps=2 allows: ',
  ):
    loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path)))
  assert saved_state.saved_steps(str(tmp_path)) == [2, 4]


def _faulty_main(workdir: str, overrides: dict) -> list[str]:
  """The command line of tests/faulty_main.py (the fault is the environment's FAULT)."""
  return [
      sys.executable,
      os.path.join(helpers.REPO, 'tests', 'faulty_main.py'),
      *helpers.main_args('configs/demo.py', workdir, overrides)[3:],
  ]


STUCK = """
import time
from vit_jax.train.watchdog import Watchdog
def stuck_in_a_collective():
  time.sleep(60)
with Watchdog({timeout}, process_index=3) as watchdog:
  for step in range({steps}):
    watchdog.phase(f'train step {{step}}')
    time.sleep(0.3)
  stuck_in_a_collective()
"""


def test_the_watchdog_ends_a_process_stuck_in_one_phase_with_every_threads_stack():
  start = time.time()
  run = subprocess.run(
      [sys.executable, '-c', STUCK.format(timeout=2, steps=10)],
      capture_output=True,
      text=True,
      timeout=60,
  )
  # Ten phases of 0.3 s each under the 2 s limit did not end it; the stuck one did, about 2 s later.
  assert run.returncode == watchdog.HUNG_STATUS, run.stderr
  assert 3 + 2 <= time.time() - start + 0.2 < 40
  assert run.stderr.startswith(
      'Watchdog: process 3 made no progress for 2 s in train step 9 ' '(config.hang_timeout_s)'
  ), run.stderr
  assert 'in stuck_in_a_collective' in run.stderr and 'Thread' in run.stderr, run.stderr


STUCK_IN_A_RUN = """
import sys, time
import jax
from vit_jax.train.watchdog import Watchdog
process = int(sys.argv[2])
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=process)
time.sleep(process)  # Process 0's watchdog fires first.
with Watchdog(4, process_index=process, process_count=2) as watchdog:
  time.sleep(60)
"""


def test_every_process_of_a_run_exits_through_its_watchdog_when_process_0_fires_first():
  # Process 0 hosts the coordination service: had it exited at once, process 1 would abort (SIGABRT)
  # before its own watchdog could end it with the status the scheduler requeues on.
  address = f'127.0.0.1:{local.free_port()}'
  procs = [
      subprocess.Popen(
          [sys.executable, '-c', STUCK_IN_A_RUN, address, str(i)],
          cwd=helpers.REPO,
          env=dict(os.environ, JAX_PLATFORMS='cpu'),
          stderr=subprocess.PIPE,
          text=True,
      )
      for i in range(2)
  ]
  try:
    outputs = [p.communicate(timeout=120)[1] for p in procs]
  finally:
    for p in procs:
      p.kill()
  assert [p.returncode for p in procs] == [watchdog.HUNG_STATUS] * 2, outputs
  for i, out in enumerate(outputs):
    assert f'Watchdog: process {i} made no progress for 4 s' in out, outputs


@pytest.mark.parametrize(
    'code',
    [
        'with Watchdog(1, 0) as watchdog:\n  watchdog.phase("train step 1")\ntime.sleep(3)',  # Closed.
        'with Watchdog(0, 0) as watchdog:\n  watchdog.phase("train step 1")\n  time.sleep(3)',  # Off.
    ],
    ids=['closed', 'off'],
)
def test_a_closed_or_disabled_watchdog_does_not_end_the_process(code):
  run = subprocess.run(
      [sys.executable, '-c', f'import time\nfrom vit_jax.train.watchdog import Watchdog\n{code}'],
      capture_output=True,
      text=True,
      timeout=60,
  )
  assert run.returncode == 0 and not run.stderr, run.stderr


@pytest.mark.slow
def test_a_process_that_blocks_ends_every_process_of_the_run_through_the_watchdog(
    tmp_path, data_dir
):
  # Process 0 blocks: it hosts the coordination service, whose end would abort process 1 (SIGABRT)
  # if process 0 exited first, and the two watchdogs fire within one poll of each other.
  workdir = str(tmp_path / 'run')
  procs = helpers.two_processes(
      _faulty_main(workdir, {**helpers.LONG, 'data_dir': data_dir, 'hang_timeout_s': 45}),
      FAULT='block:0:5',
  )
  try:
    outputs = [p.communicate(timeout=400)[1] for p in procs]
  finally:
    for p in procs:
      p.kill()
  tails = '\n'.join(f'--- process {i}:\n{out[-2500:]}' for i, out in enumerate(outputs))
  assert [p.returncode for p in procs] == [watchdog.HUNG_STATUS] * 2, tails
  for i, out in enumerate(outputs):
    assert re.search(
        rf'^Watchdog: process {i} made no progress for 45 s in train step \d+', out, re.M
    ), tails
  # The blocked process shows where it is; its peer waits in a collective of a step it dispatched.
  assert 'in sleep' in outputs[0] and 'faulty_main.py' in outputs[0], tails
  assert 'Current thread' in outputs[1] or 'Thread 0x' in outputs[1], tails


# The image-folder run has every recipe knob on, on a mesh that shards the parameters: their
# randomness (augmentation, mixing, drop path, dropout) must be a function of (seed, step) as the rest.
RECIPE_KNOBS = {
    'pp.randaug_layers': 2,
    'pp.erase_prob': 0.5,
    'pp.three_augment': True,
    'pp.color_jitter': 0.3,
    'mix.mixup_alpha': 0.8,
    'mix.cutmix_alpha': 1.0,
    'model.drop_path_rate': 0.2,
    'optim.layer_decay': 0.75,
    'mesh': (('fsdp', -1),),
    'model.dropout_rate': 0.1,
    'model.attention_dropout_rate': 0.1,
    'polyak_decay': 0.9,
}
# Eight SIGKILLs spread over one 60-step run (checkpoints every 10 steps, evaluations every 20), each
# at an exact point: before any step, between checkpoints, inside a save with its files half written,
# when a written save waits for its rename, inside an evaluation. (Each start costs half a minute in
# the suite: one kill between checkpoints stands for any other there.)
KILLS = [
    'kill_before_step:1',
    'kill_in_save:10',
    'kill_before_step:14',
    'kill_before_commit:20',
    'kill_in_eval:20',
    'kill_in_save:40',
    'kill_in_eval:60',
    'kill_before_commit:60',
]


def _end_of(stderr: str) -> str:
  """What a failed run's stderr says of its end: from a native crash's report on (the crashing thread
  comes first in it, and a tail of the whole would show only the other threads), else its last lines.
  """
  crash = stderr.find('Fatal Python error')
  return stderr[crash : crash + 6000] if crash >= 0 else stderr[-3000:]


def test_the_end_of_a_crashed_run_starts_at_its_crash_report():
  crash = 'Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n'
  assert _end_of('training...\n' + crash + 'Thread 0x2:\n' * 2000).startswith(crash)
  assert _end_of('a' * 5000 + 'last line') == 'a' * 2991 + 'last line'


@pytest.mark.slow
def test_killed_at_eight_points_the_resumed_run_ends_bit_identical(tmp_path, sorted_digits_folder):
  overrides = {
      **helpers.TINY,
      'dataset': 'folder',
      'data_dir': sorted_digits_folder,
      **RECIPE_KNOBS,
      'total_steps': 60,
      'checkpoint_every_steps': 10,
      'log_every_steps': 10,
      'eval_every_steps': 20,
  }
  killed, reference = str(tmp_path / 'killed'), str(tmp_path / 'reference')
  for fault in KILLS + [None]:
    newest = (saved_state.saved_steps(killed) or [0])[-1]
    env = dict(os.environ, FAULT=fault) if fault else os.environ
    run = subprocess.run(
        _faulty_main(killed, overrides)
        if fault
        else helpers.main_args('configs/demo.py', killed, overrides),
        cwd=helpers.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == (-signal.SIGKILL if fault else 0), (
        fault,
        run.returncode,
        _end_of(run.stderr),
    )
    # Each start resumes from the newest committed checkpoint: a kill loses only the steps after it.
    assert f'Training 60 steps from step {newest}:' in run.stderr, (
        fault,
        newest,
        run.stderr[-3000:],
    )
    if fault and fault.startswith(
        ('kill_in_save', 'kill_before_commit')
    ):  # Killed inside that save.
      step = fault.split(':')[1]
      assert os.path.isdir(
          os.path.join(killed, 'checkpoints', f'{step}.orbax-checkpoint-tmp')
      ), fault
  # A save waits for the one before it, so the kills in saves 40 and 60 leave 50 as the last start.
  assert newest == 50

  loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), reference))
  checkpointer = (
      ocp.StandardCheckpointer()
  )  # The whole train state: parameters, optimizer, average.
  final = [
      checkpointer.restore(os.path.join(w, 'checkpoints', '60', 'default'))
      for w in (reference, killed)
  ]
  chex.assert_trees_all_equal(final[0], final[1])
  assert final[0]['ema_params'] is not None
  scalars = [helpers.read_scalars(w) for w in (reference, killed)]
  for tag in ('eval_top1', 'eval_loss', 'eval_polyak_top1', 'eval_polyak_loss', 'train_loss'):
    assert scalars[0][tag][60] == scalars[1][tag][60], tag


class _Outputs:

  def __init__(self, i: int, waited: list[int]):
    self.i, self._waited = i, waited

  def block_until_ready(self):
    self._waited.append(self.i)
    return self


def test_the_host_waits_for_the_computation_dispatched_ahead_steps_before():
  waited, in_flight = [], dispatch.BoundedDispatch()
  for i in range(6):
    in_flight.add(_Outputs(i, waited))
    assert waited == list(range(i + 1 - dispatch.AHEAD)), (i, waited)


# The README's 2 processes x 4 devices with a short watchdog. Before the host was held to
# dispatch.AHEAD steps ahead, about one demo run in five of 300 steps deadlocked in gloo (the steps
# between two metric fetches could fill a device's 32 computations in flight). The bound itself is
# pinned by the test above; this run is the end-to-end check (one run: each costs ~2 min in the suite).
STRESS_RUNS = 1


@pytest.mark.slow
def test_two_processes_of_four_devices_run_without_a_hang(tmp_path, data_dir, capfd):
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'total_steps': 120,
      'log_every_steps': 60,
      'eval_every_steps': 60,
      'checkpoint_every_steps': 60,
      'hang_timeout_s': 120,
  }
  for run in range(STRESS_RUNS):
    args = helpers.main_args('configs/demo.py', str(tmp_path / str(run)), overrides)[3:]
    code = local.launch(args, num_processes=2, devices_per_process=4, timeout=600)
    assert code == 0, (run, code, capfd.readouterr().err[-5000:])


@pytest.mark.parametrize('data_workers', [0, 2])
def test_train_data_gone_mid_run_is_one_line_and_the_steps_so_far_are_saved(
    data_workers, sorted_digits_folder, tmp_path, data_dir
):
  """An image folder deleted (a mount lost) while a run trains: hundreds of lines of traceback
  ("check that the files are images"), and the steps since the last checkpoint were lost."""
  folder = str(tmp_path / 'digits')
  shutil.copytree(sorted_digits_folder, folder)
  workdir = str(tmp_path / 'run')
  overrides = {
      **helpers.LONG,
      'dataset': 'folder',
      'data_dir': folder,
      'data_workers': data_workers,
  }
  proc = subprocess.Popen(
      helpers.main_args('configs/demo.py', workdir, overrides) + ['--config.total_steps=100000'],
      cwd=helpers.REPO,
      stderr=subprocess.PIPE,
      text=True,
  )
  try:
    helpers.wait_for_checkpoint(workdir, [proc])
    shutil.rmtree(folder)
    _, stderr = proc.communicate(timeout=300)
  finally:
    proc.kill()
  errors = [line for line in stderr.splitlines() if line.startswith('error: ')]
  assert proc.returncode == 1 and 'Traceback' not in stderr, stderr[-3000:]
  (error,) = errors
  match = re.fullmatch(
      r'error: the train data could not be read for step (\d+) \(.*\): step (\d+) is saved, where '
      r'the same command resumes once the data is back',
      error,
  )
  assert match and int(match[2]) == int(match[1]) - 1 > 4, error
  assert saved_state.saved_steps(workdir)[-1] == int(match[2])
