"""Entry points re-run themselves with mimalloc on CPU (vit_jax/runtime/allocator.py); its speed is measured by
benchmarks/train_step.py, not here."""

import os
import subprocess
import sys

import pytest

import helpers
from vit_jax.runtime import allocator


def _fresh_env(**extra) -> dict[str, str]:
  """The environment of a user's shell: nothing inherited from this (already re-executed) pytest."""
  env = {
      k: v
      for k, v in os.environ.items()
      if k not in ('LD_PRELOAD', 'VIT_JAX_ALLOCATOR_REEXECUTED', *allocator.MIMALLOC_OPTIONS)
  }
  return {**env, **extra}


@pytest.mark.parametrize(
    'env, expected', [({}, 'mimalloc'), ({allocator.OPT_OUT: 'system'}, 'system')]
)
def test_vit_jax_main_started_as_users_start_it_runs_with_mimalloc(
    tmp_path, data_dir, env, expected
):
  # A bad variant ends the run in setup, after the line that says which malloc the process has.
  run = helpers.run_main(
      'configs/demo.py',
      str(tmp_path / 'run'),
      {'data_dir': data_dir, 'variant': 'ViT-nope'},
      ['--verbosity=1'],
      env=_fresh_env(**env),
      timeout=300,
  )
  assert run.returncode == 2 and "Unknown model variant 'ViT-nope'" in run.stderr, run.stderr[
      -2000:
  ]
  assert f'malloc: {expected} ' in run.stderr


def test_this_test_process_runs_with_mimalloc():
  assert allocator.in_effect() == 'mimalloc'
  assert os.environ['MIMALLOC_PURGE_DELAY'] == '-1'


class _Exec(Exception):
  pass


@pytest.fixture
def exec_calls(monkeypatch):
  """Calls of os.execve by use_mimalloc, which raise instead of replacing this process."""
  calls = []

  def execve(path, argv, env):
    calls.append((path, argv, env))
    raise _Exec()

  monkeypatch.setattr(os, 'execve', execve)
  monkeypatch.setattr(allocator, 'in_effect', lambda: 'system')
  for name in ('LD_PRELOAD', 'VIT_JAX_ALLOCATOR_REEXECUTED', allocator.OPT_OUT, 'JAX_PLATFORMS'):
    monkeypatch.delenv(name, raising=False)
  return calls


def test_use_mimalloc_reruns_the_command_with_mimalloc_preloaded(exec_calls, monkeypatch):
  monkeypatch.setenv('LD_PRELOAD', '/some/other.so')
  monkeypatch.setattr(allocator, '_ACCELERATOR_PLUGINS', ())
  with pytest.raises(_Exec):
    allocator.use_mimalloc()
  ((path, argv, env),) = exec_calls
  assert path == sys.executable and argv[1:] == sys.orig_argv[1:]
  assert env['LD_PRELOAD'] == f'{allocator.library()} /some/other.so'
  assert env['MIMALLOC_PURGE_DELAY'] == '-1' and env['VIT_JAX_ALLOCATOR_REEXECUTED'] == '1'


@pytest.mark.parametrize(
    'env',
    [
        {allocator.OPT_OUT: 'system'},  # The opt-out.
        {'JAX_PLATFORMS': 'cuda'},  # Accelerators keep the step's memory on the device.
        {'JAX_PLATFORMS': 'tpu,cpu'},
        {'VIT_JAX_ALLOCATOR_REEXECUTED': '1'},  # The preload did not take: no loop.
    ],
)
def test_use_mimalloc_leaves_the_process_alone(exec_calls, monkeypatch, env):
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  allocator.use_mimalloc()
  assert not exec_calls


def test_an_installed_accelerator_plugin_keeps_the_system_malloc_unless_jax_is_told_cpu(
    exec_calls, monkeypatch
):
  monkeypatch.setattr(allocator, '_ACCELERATOR_PLUGINS', ('pytest',))  # An importable stand-in.
  allocator.use_mimalloc()
  assert not exec_calls
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  with pytest.raises(_Exec):
    allocator.use_mimalloc()


def test_a_child_started_with_the_system_malloc_env_keeps_the_c_librarys_malloc():
  # This pytest runs with mimalloc preloaded; the benchmarks' peers must not inherit it.
  code = 'from vit_jax.runtime import allocator; allocator.use_mimalloc(); print(allocator.in_effect())'
  child = subprocess.run(
      [sys.executable, '-c', code],
      cwd=helpers.REPO,
      env=allocator.system_malloc_env(),
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
  )
  assert child.stdout.strip() == 'system'
  assert 'LD_PRELOAD' not in allocator.system_malloc_env()
