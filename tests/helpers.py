"""Shared by the tests: tiny configs and reading what a run wrote."""

import dataclasses
import importlib
import io
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import time
from typing import Any, Sequence

import collections

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from vit_jax import data
from vit_jax import defaults
from vit_jax import evaluators
from vit_jax import sharding
from vit_jax import tasks
from vit_jax.checkpoints import run_dir, saved_state
from vit_jax.data import digits
from vit_jax.models import variants
from vit_jax.runtime import workdir_files
from vit_jax.tasks import classification
from vit_jax.train import events

TESTS = os.path.dirname(os.path.abspath(__file__))  # Its helper modules: helpers, faulty_main, ...
REPO = os.path.dirname(TESTS)
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count='


def tensorflow():
  """TensorFlow, which some tests take as their reference (the original resize and crop boxes, event
  files as clu writes them, TFRecord files to convert): the test extra pins it; where it is absent (the
  GPU machines' image) those tests are skipped, saying so, rather than failed."""
  return pytest.importorskip('tensorflow', reason='needs TensorFlow, which the test extra pins')


def without_tensorflow() -> dict[str, str]:
  """The environment of a subprocess where TensorFlow is not installed, as on the accelerator
  machines (tests/without_tensorflow/sitecustomize.py)."""
  hide = os.path.join(REPO, 'tests', 'without_tensorflow')
  return dict(os.environ, PYTHONPATH=os.pathsep.join([hide, os.environ.get('PYTHONPATH', '')]))


def on_devices(count: int) -> dict[str, str]:
  """The environment of a subprocess that sees `count` CPU devices instead of the tests' 8: one, as
  on the laptop a user runs the demo on (it trains faster there than split over 8 fake devices)."""
  flags = [
      f for f in os.environ.get('XLA_FLAGS', '').split() if not f.startswith(DEVICE_COUNT_FLAG)
  ]
  return dict(os.environ, XLA_FLAGS=' '.join([*flags, f'{DEVICE_COUNT_FLAG}{count}']))


def _state_and_group(pid: int) -> tuple[str, int] | None:
  """Process `pid`'s state letter and process group from Linux's /proc/<pid>/stat; None if gone."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      state, _, group = f.read().rsplit(')', 1)[1].split()[:3]
  except OSError:  # It ended (meanwhile).
    return None
  return state, int(group)


def running(pid: int) -> bool:
  """Whether process `pid` runs (Linux's /proc): not gone, nor a zombie that no one has reaped (a
  container's first process may never reap the orphans it inherits)."""
  found = _state_and_group(pid)
  return found is not None and found[0] != 'Z'


def running_in_group(pgid: int) -> list[int]:
  """The running processes of process group `pgid` (Linux's /proc)."""
  processes = {
      int(entry): _state_and_group(int(entry)) for entry in os.listdir('/proc') if entry.isdigit()
  }
  return [pid for pid, found in processes.items() if found and found[0] != 'Z' and found[1] == pgid]


# A model and run small enough for a few seconds on CPU, on the bundled digits.
TINY = {
    'variant': 'ViT-testing_4',
    'model.hidden_size': 32,
    'model.num_layers': 2,
    'model.num_heads': 2,
    'model.mlp_dim': 64,
    'image_size': 8,
    'batch_size': 16,
    'eval_batch_size': 64,
    'total_steps': 12,
    'log_every_steps': 4,
    'eval_every_steps': 12,
    'checkpoint_every_steps': 4,
    'lr.warmup_steps': 2,
}


# A run that goes on until it is signalled; its learning rate does not depend on total_steps, so a run
# resumed with fewer steps to go can be compared with an uninterrupted one.
LONG = {
    **TINY,
    'total_steps': 100_000,
    'log_every_steps': 2,
    'eval_every_steps': 100_000,
    'lr.decay': 'constant',
}


def fake_hub(monkeypatch, listing: list[str], snapshot: str) -> dict:
  """huggingface_hub as if online: every repository lists `listing` and downloads to `snapshot`.
  Returns the arguments of the last download, filled in when it is asked for."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top

  from vit_jax.runtime import hf_hub  # pylint: disable=g-import-not-at-top

  asked = {}

  def snapshot_download(repo, **kwargs):
    asked.update(repo=repo, **kwargs)
    return snapshot

  monkeypatch.setattr(huggingface_hub, 'list_repo_files', lambda repo, **_: listing)
  monkeypatch.setattr(huggingface_hub, 'snapshot_download', snapshot_download)
  hf_hub.snapshot.cache_clear()
  return asked


def offline_datasets(monkeypatch, cache: str) -> None:
  """`datasets` and huggingface_hub read local files only; `datasets` caches into `cache`. Both read
  the environment once, when imported: their settings are set too (else `datasets` cached into the
  user's folder, where a dataset written again at another path could come back as the first one's
  cached copy: its key is not the files' paths)."""
  import datasets  # pylint: disable=g-import-not-at-top

  for name, value in (
      ('HF_DATASETS_OFFLINE', '1'),
      ('HF_HUB_OFFLINE', '1'),
      ('HF_DATASETS_CACHE', cache),
  ):
    monkeypatch.setenv(name, value)
  monkeypatch.setattr(datasets.config, 'HF_HUB_OFFLINE', True)
  monkeypatch.setattr(datasets.config, 'HF_DATASETS_OFFLINE', True)
  monkeypatch.setattr(datasets.config, 'HF_DATASETS_CACHE', pathlib.Path(cache))


def hf_dataset_card(root, features, configs: dict) -> None:
  """README.md with the YAML header push_to_hub writes: dataset_info (`features` for each config)
  and configs."""
  from datasets.info import DatasetInfo, DatasetInfosDict  # pylint: disable=g-import-not-at-top
  from datasets.utils.metadata import MetadataConfigs  # pylint: disable=g-import-not-at-top
  from huggingface_hub import DatasetCardData  # pylint: disable=g-import-not-at-top

  card = DatasetCardData()
  infos = {name: DatasetInfo(features=features, config_name=name) for name in configs}
  DatasetInfosDict(infos).to_dataset_card_data(card)
  MetadataConfigs(configs).to_dataset_card_data(card)
  (root / 'README.md').write_text(f'---\n{card}\n---\n# A dataset\n')


def encoded(
    pixels: np.ndarray, image_format: str = 'JPEG', orientation: int | None = None
) -> bytes:
  """`pixels` as a file of `image_format`, as PIL writes it, with an EXIF Orientation tag (1-8: how
  to turn the image upright) where one is given."""
  from PIL import ExifTags, Image  # pylint: disable=g-import-not-at-top

  out = io.BytesIO()
  tags = {}
  if orientation is not None:
    tags['exif'] = Image.Exif()
    tags['exif'][ExifTags.Base.Orientation] = orientation
  Image.fromarray(pixels).save(out, format=image_format, quality=90, **tags)
  return out.getvalue()


def webdataset_tar(path, samples, tar_format=tarfile.GNU_FORMAT, extra=()) -> None:
  """A tar of `samples` ((key, {column: bytes}), a file each) after `extra` (name, bytes) files."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tarfile.open(path, 'w', format=tar_format) as tar:
    files = [*extra, *((f'{key}.{c}', v) for key, columns in samples for c, v in columns.items())]
    for name, content in files:
      info = tarfile.TarInfo(name)
      info.size = len(content)
      tar.addfile(info, io.BytesIO(content))


def digits_shards(root: str, tars_per_split: int, examples: int | None = None) -> None:
  """The bundled digits (each split's first `examples`, all where None, in order) as WebDataset tar
  files of a PNG and a `cls` a sample, `tars_per_split` a split: digits-<split>-<k>.tar in `root`.
  """
  os.makedirs(root, exist_ok=True)
  for split, (pixels, labels) in digits.split_arrays().items():
    bounds = np.linspace(0, len(labels) if examples is None else examples, tars_per_split + 1)
    for shard, (start, stop) in enumerate(zip(bounds[:-1].astype(int), bounds[1:].astype(int))):
      samples = [
          (f'{split}_{k:05d}', {'png': encoded(pixels[k][..., 0], 'PNG'), 'cls': b'%d' % labels[k]})
          for k in range(start, stop)
      ]
      path = os.path.join(root, f'digits-{split}-{shard:04d}.tar')
      webdataset_tar(path, samples, tarfile.PAX_FORMAT)  # tarfile.open's default.


def digits_parquet(root: str, files_per_split: int) -> None:
  """The bundled digits (in order) as Parquet files of PNG images and integer labels (no features:
  as pyarrow writes them), `files_per_split` a split: data/<split>-NNNNN-of-NNNNN.parquet in `root`,
  row groups of 64 rows."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top

  os.makedirs(os.path.join(root, 'data'), exist_ok=True)
  for split, (pixels, labels) in digits.split_arrays().items():
    bounds = np.linspace(0, len(labels), files_per_split + 1).astype(int)
    for k, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
      images = [
          {'bytes': encoded(pixels[i][..., 0], 'PNG'), 'path': None} for i in range(start, stop)
      ]
      table = pa.table({'image': images, 'label': labels[start:stop].astype(np.int64)})
      name = f'{split}-{k:05d}-of-{files_per_split:05d}.parquet'
      pq.write_table(table, os.path.join(root, 'data', name), row_group_size=64)


# Label sets of the digits (multi-label): the digit, 'even' (0, 2, ...) and 'large' (5..9).
LABEL_SET_NAMES = [*(str(d) for d in range(10)), 'even', 'large']


def digit_label_set(key: int, digit: int, split: str) -> list[int]:
  """Example `key`'s set: its digit, 'even', 'large', in an order of their own; every 9th test image
  has none."""
  if split == 'test' and key % 9 == 0:
    return []
  return [*([11] if digit >= 5 else []), digit, *([10] if digit % 2 == 0 else [])]


def label_set_digits_parquet(root) -> dict[str, Any]:
  """The digits with their label sets (`digit_label_set`) in a list column 'tags' of ClassLabel
  LABEL_SET_NAMES, written by `datasets` as the hub's data/<split>-00000-of-00001.parquet; the config
  overrides of a TINY run on them."""
  import datasets  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  features = datasets.Features(
      {
          'image': datasets.Image(),
          'tags': datasets.List(datasets.ClassLabel(names=LABEL_SET_NAMES)),
      }
  )
  for split, (pixels, labels) in digits.split_arrays().items():
    datasets.Dataset.from_dict(
        {
            'image': [Image.fromarray(p[..., 0]) for p in pixels],
            'tags': [digit_label_set(k, int(label), split) for k, label in enumerate(labels)],
        },
        features=features,
    ).to_parquet(os.path.join(root, 'data', f'{split}-00000-of-00001.parquet'))
  return {
      **TINY,
      'dataset': 'huggingface',
      'data_dir': str(root),
      'label_feature': 'tags',
      'loss': 'sigmoid_xent',
      'data_workers': 0,
  }


def arrow_rows(cache) -> list[int]:
  """The rows of each Arrow file in dataset cache folder `cache` (a pathlib.Path): its copies of
  Parquet rows, sorted."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top

  return sorted(
      pa.ipc.open_stream(pa.memory_map(str(p))).read_all().num_rows for p in cache.glob('*.arrow')
  )


def data_error(data_dir: str, **overrides) -> str:
  """The one-line error data.get_info raises for the data config of `data_dir` with `overrides`."""
  with pytest.raises(ValueError) as raised:
    data.get_info(data_config(data_dir, **overrides))
  message = str(raised.value)
  assert '\n' not in message
  return message


def assert_reads_as_the_digits(written: ml_collections.ConfigDict, workers: bool = False) -> None:
  """`written`, a data config of the bundled digits written in another layout (in the splits' order,
  two data shards), gives the digits' info, train batches (from worker processes too where
  `workers`), eval batches and few-shot labels, to the bit."""
  bundled = data_config(None, data_shards=2)
  assert data.get_info(written) == data.get_info(bundled)
  for config in (bundled, written):
    config.pp.update(flip=True, crop='inception')
  expected = take(data.train_iterator(bundled, local_batch_size=64, start_step=20), 3)
  for count in (0, 2) if workers else (0,):
    written.data_workers = count
    batches = data.train_iterator(written, local_batch_size=64, start_step=20)
    try:
      assert_same_batches(take(batches, 3), expected)
    finally:
      if count:
        batches.close()
  written.data_workers = 0
  assert_same_batches(
      list(data.eval_iterator(written, 'test', local_batch_size=100)),
      list(data.eval_iterator(bundled, 'test', local_batch_size=100)),
  )
  np.testing.assert_array_equal(
      data.listed_labels(written, 'train[:90%]'), data.listed_labels(bundled, 'train[:90%]')
  )


def two_processes(args: list[str], devices: int = 4, **env: str) -> list[subprocess.Popen]:
  """Command `args` started as the two processes of one run (with --coordinator_address,
  --num_processes and --process_id, as vit_jax.main takes them), `devices` CPU devices each."""
  import local  # pylint: disable=g-import-not-at-top  # launch/, on the tests' path.

  env = dict(
      os.environ,
      JAX_PLATFORMS='cpu',
      XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}',
      **env,
  )
  address = f'127.0.0.1:{local.free_port()}'
  return [
      subprocess.Popen(
          [*args, f'--coordinator_address={address}', '--num_processes=2', f'--process_id={i}'],
          cwd=REPO,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for i in range(2)
  ]


def wait_for_checkpoint(workdir: str, procs: list[subprocess.Popen], step: int = 4) -> None:
  """Waits until the runs of `procs` have saved checkpoint `step` in `workdir` (at most 300 s)."""
  deadline = time.time() + 300
  while step not in saved_state.saved_steps(workdir):
    assert all(p.poll() is None for p in procs), 'a process ended before it was signalled'
    assert time.time() < deadline, 'no checkpoint within 300 s'
    time.sleep(0.2)


def random_params(model, image_size: int, seed: int = 0):
  """Every parameter of `model` random (numpy): a zero head, bias, class token or probe would hide a
  layout bug."""
  from vit_jax.checkpoints import adapting  # pylint: disable=g-import-not-at-top

  rng = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: 0.3 * rng.randn(*x.shape).astype(np.float32),
      adapting.param_shapes(model, image_size),
  )


def load_config(name: str, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """`configs/<name>.py:get_config()` (`<name>:<arg>`: get_config(arg)) with dotted-name overrides, as
  the command line would apply."""
  name, _, arg = name.partition(':')
  config = importlib.import_module(f'configs.{name}').get_config(*([arg] if arg else []))
  for key, value in (overrides or {}).items():
    *parents, field = key.split('.')
    node = config
    for parent in parents:
      node = node[parent]
    node[field] = value
  return config


# configs/demo.py's size fields, unset: config.variant='checkpoint' fills them from the checkpoint.
UNSET_SIZES = {
    f'model.{name}': None for name in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')
}


def main_args(config_file: str, workdir: str, overrides: dict) -> list[str]:
  return [
      sys.executable,
      '-m',
      'vit_jax.main',
      f'--config={config_file}',
      f'--workdir={workdir}',
      *(f'--config.{k}={v}' for k, v in overrides.items()),
  ]


def run_piped_into_a_reader_that_stops(command: Sequence[str]) -> tuple[int, str]:
  """The exit status and stderr of `command` run from the repository with its stdout closed at once,
  as `| head` closes it once it has its lines: every write finds the pipe broken."""
  run = subprocess.Popen(
      command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )
  run.stdout.close()
  stderr = run.stderr.read()
  return run.wait(timeout=300), stderr


def run_main(
    config_file: str, workdir: str, overrides: dict, extra_args: Sequence[str] = (), **kwargs
) -> subprocess.CompletedProcess:
  """vit_jax.main as a user starts it, with `extra_args` (e.g. '--verbosity=1') after the overrides."""
  return subprocess.run(
      [*main_args(config_file, workdir, overrides), *extra_args],
      cwd=REPO,
      capture_output=True,
      text=True,
      **kwargs,
  )


def read_scalars(workdir: str) -> dict[str, dict[int, float]]:
  """tag -> step -> value from every TensorBoard event file in `workdir` (later files win)."""
  return events.read_scalars(workdir)


# The data pipeline's tests.


def data_config(data_dir: str | None, **overrides) -> ml_collections.ConfigDict:
  """The data fields of a config (the digits, unaugmented, at their native 8x8) with overrides. No
  worker processes (each costs seconds to start, and names unreadable files in its own log): tests of
  them set data_workers."""
  pp, pp_eval = (
      defaults.get_config().pp,
      defaults.get_config().pp_eval,
  )  # Every op off but the crop.
  pp.update(dict(crop='resize', flip=False))
  config = ml_collections.ConfigDict(
      dict(
          dataset='digits',
          data_dir=data_dir,
          train_split='train',
          eval_split='test',
          label_feature='label',
          image_size=8,
          seed=0,
          data_shards=None,
          data_workers=0,
          aug_repeats=1,
          pp=pp,
          pp_eval=pp_eval,
      )
  )
  pp = overrides.pop('pp', {})
  config.update(overrides)
  config.pp.update(pp)
  return config


def as_uint8(images: np.ndarray) -> np.ndarray:
  """A batch's images of an un-augmented native-size image as exact uint8 pixels: uint8 batches as
  they are, [-1, 1] floats back to their levels."""
  if images.dtype == np.uint8:
    return images
  return np.round((images + 1) * 127.5).astype(np.uint8)


def multiset(images: np.ndarray, labels: np.ndarray) -> collections.Counter:
  return collections.Counter((image.tobytes(), int(label)) for image, label in zip(images, labels))


def take(iterator, n: int) -> list:
  return [next(iterator) for _ in range(n)]


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key])


def train_losses(setup, batches: list[dict]) -> tuple[np.ndarray, object]:
  """The losses of the run's jitted train step on `batches`, from a fresh state, and its last state."""
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax.train import state as train_state, step as train_step  # pylint: disable=g-import-not-at-top

  state, shardings, _ = train_state.create_state(setup, checkpoint.make_manager(setup.workdir, 1))
  step = train_step.jit_train_step(setup, shardings)
  losses = []
  for batch in batches:
    state, metrics = step(state, sharding.global_batch(batch, setup.mesh))
    losses.append(float(metrics['train_loss']))
  return np.array(losses), state


def jitted_step(tmp_path, overrides: dict) -> tuple:
  """(the jitted train step, a fresh state, a random batch of 32 digit-sized images on the mesh) of
  the tiny demo run with `overrides`, no warmup."""
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax.train import setup as train_setup, state as train_state, step as train_step  # pylint: disable=g-import-not-at-top

  config = load_config(
      'demo',
      {
          **TINY,
          'data_dir': str(tmp_path / 'tfds'),
          'batch_size': 32,
          'lr.warmup_steps': 0,
          **overrides,
      },
  )
  setup = train_setup.prepare(config, str(tmp_path / 'run'))
  state, shardings, _ = train_state.create_state(
      setup, checkpoint.make_manager(str(tmp_path / 'run'), 1)
  )
  rng = np.random.default_rng(0)
  batch = {
      'image': rng.integers(0, 256, (32, 8, 8, 3), np.uint8),
      'label': rng.integers(0, 10, 32).astype(np.int32),
  }
  return (
      train_step.jit_train_step(setup, shardings),
      state,
      sharding.global_batch(batch, setup.mesh),
  )


def compiled_flops(step, state, batch) -> float:
  """XLA's FLOP count of the compiled `step` on (`state`, `batch`)."""
  costs = step.lower(state, batch).compile().cost_analysis()
  return (costs[0] if isinstance(costs, list) else costs)['flops']


def flat_params(params) -> dict[str, np.ndarray]:
  """'/'-joined path -> host array, of a (device) parameter tree."""
  return {
      jax.tree_util.keystr(path, simple=True, separator='/'): np.asarray(value)
      for path, value in jax.tree_util.tree_leaves_with_path(jax.device_get(params))
  }


def train_on_mesh_and_one_device(setup, one_workdir: str, steps: int = 3) -> tuple[tuple, tuple]:
  """Trains `steps` random batches (10 classes) with the run's jitted step on its mesh and again on one
  device (workdir `one_workdir`): (losses, final train state) of each."""
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top

  size, rng = setup.config.image_size, np.random.default_rng(0)
  batches = [
      {
          'image': rng.uniform(-1, 1, (setup.config.batch_size, size, size, 3)).astype(np.float32),
          'label': rng.integers(0, 10, setup.config.batch_size).astype(np.int32),
      }
      for _ in range(steps)
  ]
  one = sharding.make_mesh((('data', 1),), devices=jax.devices()[:1])
  one_setup = dataclasses.replace(setup, mesh=one, workdir=one_workdir)
  return train_losses(setup, batches), train_losses(one_setup, batches)


def train_as_on_one_device(setup, one_workdir: str, steps: int = 3) -> tuple[np.ndarray, object]:
  """`train_on_mesh_and_one_device`, asserting the same losses and parameters; returns the mesh's
  losses and final train state."""
  import chex  # pylint: disable=g-import-not-at-top

  (losses, state), (reference, one_state) = train_on_mesh_and_one_device(setup, one_workdir, steps)
  np.testing.assert_allclose(losses, reference, rtol=1e-5)
  chex.assert_trees_all_close(
      jax.device_get(state.params), jax.device_get(one_state.params), rtol=1e-5, atol=1e-6
  )
  return losses, state


def assert_resume_is_bit_exact(config: ml_collections.ConfigDict, full: str, resumed: str) -> None:
  """Copies the finished run `full` to `resumed` without its last checkpoint, resumes it from the one
  before with `config`, and asserts the last checkpoint's parameters equal the uninterrupted run's.
  """
  import shutil  # pylint: disable=g-import-not-at-top
  import chex  # pylint: disable=g-import-not-at-top
  from vit_jax.train import loop, setup as train_setup  # pylint: disable=g-import-not-at-top

  last = str(saved_state.saved_steps(full)[-1])
  shutil.copytree(full, resumed)
  shutil.rmtree(os.path.join(resumed, 'checkpoints', last))
  loop.train_and_evaluate(train_setup.prepare(config, resumed))
  chex.assert_trees_all_equal(
      saved_state.restore_params(os.path.join(resumed, 'checkpoints', last))[0],
      saved_state.restore_params(os.path.join(full, 'checkpoints', last))[0],
  )


def copy_of(run: str, tmp_path) -> str:
  """A copy of the workdir `run` in `tmp_path`, to resume or damage without touching a shared run."""
  workdir = str(tmp_path / 'run')
  shutil.copytree(run, workdir)
  return workdir


def files_of(workdir: str) -> dict[str, bytes]:
  """Every file under `workdir` by relative path, with its bytes: what a refusal must leave as it was
  (all but the lock's file, which names the process that last held it: vit_jax/train/workdir_lock.py).
  """
  files = {
      os.path.relpath(os.path.join(root, name), workdir): open(
          os.path.join(root, name), 'rb'
      ).read()
      for root, _, names in os.walk(workdir)
      for name in names
  }
  files.pop(workdir_files.LOCK, None)
  return files


def checkpoint_state(workdir: str, step: int) -> dict:
  """The train state of a checkpoint (numpy arrays), read with orbax directly."""
  path = os.path.join(workdir, 'checkpoints', str(step), 'default')
  return jax.tree.map(np.asarray, ocp.StandardCheckpointer().restore(path))


def checkpoint_params(workdir: str, step: int):
  """The raw parameters of a checkpoint, read with orbax directly."""
  return checkpoint_state(workdir, step)['params']


def model_logits(workdir: str, params, images: np.ndarray) -> np.ndarray:
  """The logits of the run's model in `workdir` with `params`."""
  config, info = run_dir.load_run_info(workdir)
  return np.asarray(
      classification.make_model(config, model_config(config), info.num_classes).apply(
          {'params': params}, images
      )
  )


def model_config(config: ml_collections.ConfigDict) -> dict:
  """The config's resolved model fields, as train/setup.prepare resolves them for the run."""
  return variants.get_model_config(config.variant, config.model.to_dict())


def evaluator(config: ml_collections.ConfigDict, name: str) -> tuple[Any, Any]:
  """The evaluator `name` of `config`'s run, as the run makes it, and the model it measures."""
  info = data.get_info(config)
  task = tasks.get(config.task)
  model = task.make_model(config, model_config(config), info.num_classes)
  context = evaluators.Context(
      config, info, task, model, sharding.make_mesh(config.mesh), model_config(config)
  )
  (found,) = [e for e in evaluators.make_evaluators(context) if e.name == name]
  return found, model
