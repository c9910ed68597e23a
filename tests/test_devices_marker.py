"""The `devices(n)` marker (tests/conftest.py): with fewer devices than a test needs, as on one GPU,
the test is skipped, and the tests that need no more than there are still run."""

import os
import subprocess
import sys

import helpers


def test_a_test_that_needs_8_devices_is_skipped_on_one_and_the_rest_run():
  run = subprocess.run(
      [
          sys.executable,
          '-m',
          'pytest',
          '-q',
          '-rs',
          '-p',
          'no:cacheprovider',
          'tests/train/test_sharding.py::test_partition_rules_combine_tensor_and_fsdp',
          'tests/data/test_uint8_batches.py::test_the_device_normalises_every_level_to_the_hosts_bits',
      ],
      cwd=helpers.REPO,
      env={**os.environ, 'VIT_JAX_TEST_DEVICES': '1'},
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert run.returncode == 0, run.stdout[-3000:]
  assert '1 passed, 1 skipped' in run.stdout, run.stdout[-3000:]
  assert 'needs 8 devices of cpu; there are 1' in run.stdout, run.stdout[-3000:]
