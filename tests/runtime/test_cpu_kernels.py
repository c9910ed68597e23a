"""On x86 CPUs with AVX2 the entry points keep matmuls off YNNPACK (vit_jax/runtime/cpu_kernels.py); its speed is measured
by benchmarks/train_step.py, not here."""

import os
import subprocess
import sys

import pytest

import helpers
from vit_jax.runtime import cpu_kernels

_AVX2 = 'fpu sse sse2 avx fma avx2 bmi2'
_AVX512 = _AVX2 + ' avx512f avx512dq avx512bw avx512vl'


def _cpuinfo(tmp_path, flags: str) -> str:
  path = tmp_path / 'cpuinfo'
  path.write_text(
      f'processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n'
      f'processor\t: 1\nflags\t\t: {flags}\n'
  )
  return str(path)


@pytest.mark.parametrize(
    'flags, expected', [(_AVX2, True), (_AVX512, True), ('fpu sse sse2', False)]
)
def test_the_routing_applies_to_x86_cpus_with_avx2(tmp_path, monkeypatch, flags, expected):
  monkeypatch.setattr(cpu_kernels.platform, 'machine', lambda: 'x86_64')
  assert cpu_kernels.applies(_cpuinfo(tmp_path, flags)) is expected


def test_the_routing_does_not_apply_off_x86(tmp_path, monkeypatch):
  monkeypatch.setattr(cpu_kernels.platform, 'machine', lambda: 'aarch64')
  assert not cpu_kernels.applies(_cpuinfo(tmp_path, _AVX2))


@pytest.fixture
def avx2_cpu(monkeypatch):
  monkeypatch.setattr(cpu_kernels, 'applies', lambda: True)
  monkeypatch.setattr(cpu_kernels.allocator, 'runs_on_cpu', lambda: True)
  monkeypatch.delenv(cpu_kernels.OPT_OUT, raising=False)


def test_route_ops_adds_the_option_once_beside_the_users_flags(avx2_cpu, monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_force_host_platform_device_count=2')
  cpu_kernels.route_ops()
  cpu_kernels.route_ops()
  assert os.environ['XLA_FLAGS'] == (
      '--xla_force_host_platform_device_count=2 '
      f'--{cpu_kernels.OPTION}={cpu_kernels.YNNPACK_OPS}'
  )
  assert cpu_kernels.in_effect() == cpu_kernels.YNNPACK_OPS


@pytest.mark.parametrize(
    'env',
    [
        {cpu_kernels.OPT_OUT: 'xla'},  # The opt-out.
        {'XLA_FLAGS': f'--{cpu_kernels.OPTION}=LIBRARY_FUSION_TYPE_DOT'},  # The user's own choice.
    ],
)
def test_route_ops_leaves_the_flags_alone(avx2_cpu, monkeypatch, env):
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  cpu_kernels.route_ops()
  assert os.environ.get('XLA_FLAGS') == env.get('XLA_FLAGS')


def test_route_ops_does_nothing_for_accelerators(avx2_cpu, monkeypatch):
  monkeypatch.setattr(cpu_kernels.allocator, 'runs_on_cpu', lambda: False)
  monkeypatch.delenv('XLA_FLAGS', raising=False)
  cpu_kernels.route_ops()
  assert 'XLA_FLAGS' not in os.environ


# A process started as an entry point starts: prepare_process, then jax; it prints whether a compiled
# matmul and a compiled reduction run in YNNPACK.
_PROBE = """
from vit_jax.runtime import startup
startup.prepare_process()
import jax, jax.numpy as jnp
from vit_jax.runtime import cpu_kernels
x = jnp.ones((64, 64))
print('routing applies:', cpu_kernels.applies())
for name, fn in (('matmul', lambda a: a @ a), ('reduction', lambda a: a.sum(axis=1))):
  print(name, 'in YNNPACK:', '__ynn_fusion' in jax.jit(fn).lower(x).compile().as_text())
"""


@pytest.mark.parametrize('opt_out', [False, True])
def test_an_entry_point_process_runs_matmuls_where_the_routing_says(opt_out):
  env = {k: v for k, v in os.environ.items() if k not in ('XLA_FLAGS', cpu_kernels.OPT_OUT)}
  if opt_out:
    env[cpu_kernels.OPT_OUT] = 'xla'
  probe = subprocess.run(
      [sys.executable, '-c', _PROBE],
      cwd=helpers.REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=True,
  ).stdout
  routed = 'routing applies: True' in probe and not opt_out
  # XLA's default hands both to YNNPACK; routed, the matmul runs on XLA's own kernels, the reduction not.
  assert f'matmul in YNNPACK: {not routed}' in probe, probe
  assert 'reduction in YNNPACK: True' in probe, probe
