"""Tests run on CPU with 8 fake devices, so sharding code paths run as on a real mesh; a test that
needs that many says so with `@pytest.mark.devices(8)`, and is skipped where there are fewer."""

import importlib.util
import os
import shutil
import sys
import tempfile

# VIT_JAX_TEST_DEVICES=1 runs the suite as on one GPU: the tests marked `devices(8)` are skipped.
_DEVICE_COUNT = '--xla_force_host_platform_device_count='
os.environ['XLA_FLAGS'] = ' '.join(
    [flag for flag in os.environ.get('XLA_FLAGS', '').split() if not flag.startswith(_DEVICE_COUNT)]
    + [_DEVICE_COUNT + os.environ.get('VIT_JAX_TEST_DEVICES', '8')]
)
# A JAX_PLATFORMS of the caller's is kept; an empty one is JAX's own choice: the accelerator where
# there is one (benchmarks/accelerator_check.sh's `tests` step).
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
# One persistent XLA compilation cache for the run, its xdist workers and the vit_jax processes tests
# start: the suite compiles the same tiny models over and over, in many processes.
# Hugging Face datasets' converted splits go to a folder of the run too, not the user's cache.
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
  os.environ.update(
      JAX_COMPILATION_CACHE_DIR=tempfile.mkdtemp(prefix='vit_jax_tests_xla_cache_'),
      VIT_JAX_DATASETS_CACHE=tempfile.mkdtemp(prefix='vit_jax_tests_datasets_'),
      VIT_JAX_TESTS_CACHE_OWNER=str(os.getpid()),
      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0',
      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES='0',
  )
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _REPO)
sys.path.insert(0, os.path.join(_REPO, 'launch'))  # The launchers (`import local`, `import sweep`).
from vit_jax.runtime import cpu_kernels, quiet  # pylint: disable=g-import-not-at-top,wrong-import-position

cpu_kernels.route_ops()  # As every entry point does (vit_jax/runtime/cpu_kernels.py).
# TensorFlow as the commands run it, also where a test imports it first: oneDNN's kernels would round
# the augmentations differently from a command's (vit_jax/runtime/quiet.py).
quiet.quiet_tensorflow()
# torch's optional triton segfaults when loaded after TensorFlow; the CPU tests never need it.
sys.modules.setdefault('triton', None)


import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position

from vit_jax.runtime import allocator  # pylint: disable=g-import-not-at-top,wrong-import-position


def pytest_configure(config):
  """The tests run as users run vit_jax: on CPU with mimalloc (vit_jax/runtime/allocator.py). pytest re-runs
  itself with it before any test allocates; xdist workers and test subprocesses inherit it."""
  capture = config.pluginmanager.getplugin('capturemanager')
  allocator.use_mimalloc(before_exec=capture.stop_global_capturing if capture else None)


@pytest.hookimpl(tryfirst=True)  # Before the test's fixtures are made.
def pytest_runtest_setup(item):
  marker = item.get_closest_marker('devices')
  if marker:
    import jax  # pylint: disable=g-import-not-at-top

    if jax.device_count() < marker.args[0]:
      pytest.skip(
          f'needs {marker.args[0]} devices of {jax.default_backend()}; '
          f'there are {jax.device_count()}'
      )


def pytest_unconfigure(config):
  del config
  if os.environ.get('VIT_JAX_TESTS_CACHE_OWNER') == str(
      os.getpid()
  ):  # pytest itself (exec keeps the pid).
    shutil.rmtree(os.environ['JAX_COMPILATION_CACHE_DIR'], ignore_errors=True)
    shutil.rmtree(os.environ['VIT_JAX_DATASETS_CACHE'], ignore_errors=True)


# The comparisons with the torch-based peers need `make test-all`'s extra; without it (`make test`'s
# environment) they are not collected.
collect_ignore_glob = [] if importlib.util.find_spec('torch') else ['*_vs_torch.py']
_SLOW_TIER = ('e2e',)  # Folders of end-to-end runs: each test minutes, several processes.


def pytest_collection_modifyitems(items):
  """Marks make test-all's tier slow (tests/e2e, the torch-based comparisons, besides the tests marked
  so), then puts the slow tests first, so that none of them is handed out last, to run alone while the
  other worker has nothing left."""
  for item in items:
    path = item.path
    if path.name.endswith('_vs_torch.py') or path.parent.name in _SLOW_TIER:
      item.add_marker(pytest.mark.slow)
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A tfds data_dir of the tests' own, so nothing lands in ~/tensorflow_datasets (the digits, served
  from memory, read nothing there)."""
  return str(tmp_path_factory.mktemp('tfds'))


@pytest.fixture(scope='session')
def trained_tiny_run(tmp_path_factory):
  """The workdir of a 12-step tiny run on the digits, trained once per session."""
  import helpers  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop, setup as train_setup  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.getbasetemp()
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': str(root / 'tiny_run_tfds'), 'lr.base': 1e-2}
  )
  loop.train_and_evaluate(train_setup.prepare(config, str(root / 'tiny_run')))
  return str(root / 'tiny_run')


@pytest.fixture(scope='session')
def exported_tiny_run(trained_tiny_run, tmp_path_factory):
  """What `vit_jax.tools.export` writes for the tiny run's last step."""
  from vit_jax.tools import export  # pylint: disable=g-import-not-at-top

  out = str(tmp_path_factory.mktemp('export'))
  export.export(trained_tiny_run, out)
  return out


@pytest.fixture(scope='session')
def sorted_digits_folder(tmp_path_factory):
  """The bundled digits as an image folder root/{train,test}/<digit>/NNNN.png: listed class by class,
  as every image folder is."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  root = tmp_path_factory.mktemp('sorted_digits_folder')
  for split, (images, labels) in digits.split_arrays().items():
    for i in np.argsort(labels, kind='stable'):
      folder = root / split / str(labels[i])
      folder.mkdir(parents=True, exist_ok=True)
      Image.fromarray(images[i]).save(folder / f'{i:04d}.png')
  return str(root)


@pytest.fixture
def jpeg_draft_scales(monkeypatch) -> list[int]:
  """The scale of each JPEG decoded reduced (libjpeg's 1/scale), as PIL's JPEG plugin records it."""
  from PIL import JpegImagePlugin  # pylint: disable=g-import-not-at-top

  scales = []
  draft = JpegImagePlugin.JpegImageFile.draft

  def recorded(image, mode, size):
    result = draft(image, mode, size)
    scales.append(image.decoderconfig[0])
    return result

  monkeypatch.setattr(JpegImagePlugin.JpegImageFile, 'draft', recorded)
  return scales
