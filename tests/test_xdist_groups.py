"""`make test`'s `--dist loadgroup` keeps the tests marked with one `xdist_group` in one worker, as
the tests of the SLURM cluster and of the VTAB and scaling runs rely on (each would else start its
own cluster or train its runs again): pytest 9.2 broke it silently (pyproject.toml's pin)."""

import collections
import subprocess
import sys

GROUPED_TESTS = 6

TESTS = f"""
import os
import pytest

@pytest.fixture(scope='module')
def shared():
  with open('setups', 'a') as f:
    f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')

@pytest.mark.xdist_group('shared')
@pytest.mark.parametrize('i', range({GROUPED_TESTS}))
def test_grouped(shared, i):
  with open('workers', 'a') as f:
    f.write(os.environ['PYTEST_XDIST_WORKER'] + '\\n')

@pytest.mark.parametrize('i', range({GROUPED_TESTS}))
def test_free(i):
  pass
"""


def test_tests_of_one_group_run_in_one_worker_which_sets_up_their_fixture_once(tmp_path):
  (tmp_path / 'test_groups.py').write_text(TESTS)
  run = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', '-n', '2']
      + ['--dist', 'loadgroup', 'test_groups.py'],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert run.returncode == 0, run.stdout[-3000:]
  workers = collections.Counter((tmp_path / 'workers').read_text().split())
  assert list(workers.values()) == [GROUPED_TESTS], workers
  assert (tmp_path / 'setups').read_text().split() == list(workers)
