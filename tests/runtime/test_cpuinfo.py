"""vit_jax/runtime/cpuinfo.py on a /proc/cpuinfo of two CPUs and a transparent-huge-page setting of our own."""

import datetime

from vit_jax.runtime import cpuinfo

_CPUINFO = (
    'processor\t: 0\nmodel name\t: Some CPU @ 2.60GHz\nflags\t\t: fpu avx2 avx512f avx512bw\n\n'
    'processor\t: 1\nmodel name\t: Another CPU\nflags\t\t: fpu sse2\n\n'
)


def test_the_first_cpus_fields_and_flags(tmp_path):
  path = tmp_path / 'cpuinfo'
  path.write_text(_CPUINFO)
  assert cpuinfo.entries(str(path))[:2] == [
      ('processor', '0'),
      ('model name', 'Some CPU @ 2.60GHz'),
  ]
  assert len(cpuinfo.entries(str(path))) == 6
  assert cpuinfo.first('model name', str(path)) == 'Some CPU @ 2.60GHz'
  assert cpuinfo.flags(str(path)) == {'fpu', 'avx2', 'avx512f', 'avx512bw'}
  assert cpuinfo.first('Features', str(path)) is None


def test_no_cpuinfo_is_no_entries_and_no_flags(tmp_path):
  assert cpuinfo.entries(str(tmp_path / 'missing')) is None
  assert cpuinfo.flags(str(tmp_path / 'missing')) == set()


def test_the_summary_names_model_avx512_cores_huge_pages_and_date(tmp_path, monkeypatch):
  path = tmp_path / 'cpuinfo'
  path.write_text(_CPUINFO)
  huge_pages = tmp_path / 'enabled'
  huge_pages.write_text('always [madvise] never\n')
  monkeypatch.setattr(cpuinfo, 'CPUINFO', str(path))
  monkeypatch.setattr(cpuinfo, '_TRANSPARENT_HUGE_PAGES', str(huge_pages))
  monkeypatch.setattr(cpuinfo.os, 'cpu_count', lambda: 4)
  monkeypatch.setattr(cpuinfo.os, 'sched_getaffinity', lambda pid: {0, 1})
  assert cpuinfo.summary() == (
      'Some CPU @ 2.60GHz, AVX-512: yes (avx512bw avx512f), 4 cores (2 usable), '
      f'transparent huge pages: madvise; {datetime.date.today().isoformat()}'
  )
  monkeypatch.setattr(cpuinfo, '_TRANSPARENT_HUGE_PAGES', str(tmp_path / 'missing'))
  assert 'transparent huge pages: unknown;' in cpuinfo.summary()
