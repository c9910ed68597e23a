"""Out of memory as one line naming the fix (vit_jax/train/memory_fit.py)."""

import os

import jax
import pytest

import helpers
from vit_jax.checkpoints import saved_state
from vit_jax.train import loop, memory_fit, setup as train_setup


def test_a_cpu_devices_free_memory_is_the_hosts_available_memory_shared_by_its_devices():
  psutil = pytest.importorskip('psutil')  # The independent count: psutil reads /proc/meminfo too.
  cpus = [d for d in jax.local_devices() if d.platform == 'cpu']
  if not cpus or not os.path.exists('/proc/meminfo'):
    pytest.skip('no CPU devices on Linux')
  share = psutil.virtual_memory().available / len(cpus)
  assert memory_fit.free_bytes(cpus[0]) == pytest.approx(share, rel=0.05)


def _setup(tmp_path, data_dir, **overrides):
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, **overrides})
  return train_setup.prepare(config, str(tmp_path / 'run'))


def test_a_train_step_needing_more_memory_than_is_free_is_refused_before_it_runs(
    tmp_path, data_dir, monkeypatch
):
  """XLA's count of the compiled step's buffers, against what the device has free (here, made
  small): one line naming the fields, before any step runs or is saved."""
  run = _setup(tmp_path, data_dir, accum_steps=2)
  monkeypatch.setattr(memory_fit, 'free_bytes', lambda device: 4096)
  with pytest.raises(
      memory_fit.OutOfMemory,
      match=r'^the train step needs \d+\.\d MiB of memory a device beyond its state and batch '
      r"\(\d+\.\d MiB\), XLA's count, where cpu 0 has 0.0 MiB free: lower --config.batch_size "
      r'\(now 16\), or keep it and raise --config.accum_steps \(now 2; each step in that many '
      r'micro-batches\), set --config.model.remat=True .*\(--config.mesh.*\)$',
  ):
    loop.train_and_evaluate(run)
  assert not saved_state.saved_steps(run.workdir)


def test_a_device_that_runs_out_of_memory_mid_run_is_one_line_naming_the_phase(
    tmp_path, data_dir, monkeypatch
):
  """A device allocator's RESOURCE_EXHAUSTED (a GPU's or TPU's; XLA's count may miss what the
  allocator's fragments waste) in an evaluation names eval_batch_size."""
  run = _setup(tmp_path, data_dir, total_steps=4, eval_every_steps=4)

  def exhausted(evaluator, state):
    raise jax.errors.JaxRuntimeError(
        'RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123 bytes.\nmore lines'
    )

  monkeypatch.setattr(loop, 'evaluate', exhausted)
  with pytest.raises(
      memory_fit.OutOfMemory,
      match=r'^evaluation \w+ at step 4 ran out of device memory \(RESOURCE_EXHAUSTED: Out of '
      r'memory while trying to allocate 123 bytes.\): lower --config.eval_batch_size \(now 64\)$',
  ):
    loop.train_and_evaluate(run)
