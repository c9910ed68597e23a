"""The commands' persistent compilation cache, one folder per machine (vit_jax/runtime/compile_cache.py)."""

import glob
import os

import pytest

import helpers
from vit_jax.runtime import compile_cache

_JAX_CACHE_VARIABLES = (
    'JAX_COMPILATION_CACHE_DIR',
    'JAX_COMPILATION_CACHE_MAX_SIZE',
    'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
    'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES',
)


@pytest.fixture
def users_env(monkeypatch, tmp_path):
  """A user's environment: no cache chosen (the suite sets its own), the cache home in tmp_path."""
  for name in (*_JAX_CACHE_VARIABLES, compile_cache.OPT_OUT):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  return tmp_path / 'cache'


@pytest.mark.slow  # Tens of seconds of training: make test-all's.
def test_vit_jax_main_started_as_users_start_it_keeps_its_programs_in_this_machines_folder(
    users_env, tmp_path, data_dir
):
  run = helpers.run_main(
      'configs/demo.py',
      str(tmp_path / 'run'),
      {'data_dir': data_dir, 'total_steps': 1},
      ['--verbosity=1'],
      env=dict(os.environ),
      timeout=600,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  folder = users_env / 'vit_jax' / 'xla' / compile_cache.machine_key()
  assert f'compilation cache: {folder} ' in run.stderr
  # The state's initialisation and the train step: each compiles for more than JAX's 1 s threshold.
  assert len(glob.glob(str(folder / 'jit_*-cache'))) >= 2, os.listdir(folder)


def test_the_users_choices_come_first(users_env, monkeypatch):
  compile_cache.use_persistent_cache()
  assert os.environ['JAX_COMPILATION_CACHE_DIR'] == compile_cache.default_dir()
  assert compile_cache.default_dir().startswith(str(users_env / 'vit_jax' / 'xla'))
  assert os.environ['JAX_COMPILATION_CACHE_MAX_SIZE'] == str(compile_cache.MAX_BYTES)
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/elsewhere')
  compile_cache.use_persistent_cache()
  assert os.environ['JAX_COMPILATION_CACHE_DIR'] == '/elsewhere'
  monkeypatch.delenv('JAX_COMPILATION_CACHE_DIR')
  monkeypatch.setenv(compile_cache.OPT_OUT, 'off')
  compile_cache.use_persistent_cache()
  assert 'JAX_COMPILATION_CACHE_DIR' not in os.environ


def test_machines_with_other_instruction_sets_get_other_folders(tmp_path):
  """XLA:CPU's entries are native code: a node without AVX-512 must not load a node's that has it."""

  def key(flags: str) -> str:
    path = tmp_path / 'cpuinfo'
    path.write_text(
        f'processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n\n'
        f'processor\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: {flags}\n'
    )
    return compile_cache.machine_key(str(path))

  assert key('fpu sse avx2') == key('fpu sse avx2')
  assert key('fpu sse avx2') != key('fpu sse avx2 avx512f')
  assert len(compile_cache.machine_key()) == 12
