"""Shared by the tests: tiny configs and reading what a run wrote."""
import importlib
import os
import subprocess
import sys

import collections

import jax
import ml_collections
import numpy as np

from vit_jax import defaults, events

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A model and run small enough for a few seconds on CPU, on the bundled digits.
TINY = {
    'variant': 'ViT-testing_4', 'model.hidden_size': 32, 'model.num_layers': 2, 'model.num_heads': 2,
    'model.mlp_dim': 64, 'image_size': 8, 'batch_size': 16, 'eval_batch_size': 64,
    'total_steps': 12, 'log_every_steps': 4, 'eval_every_steps': 12, 'checkpoint_every_steps': 4,
    'lr.warmup_steps': 2, 'shuffle_buffer': 256,
}


def random_params(model, image_size: int, seed: int = 0):
  """Every parameter of `model` random (numpy): a zero head, bias, class token or probe would hide a
  layout bug."""
  from vit_jax.models import loading  # pylint: disable=g-import-not-at-top
  rng = np.random.RandomState(seed)
  return jax.tree.map(lambda x: 0.3 * rng.randn(*x.shape).astype(np.float32),
                      loading.param_shapes(model, image_size))


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


def main_args(config_file: str, workdir: str, overrides: dict) -> list[str]:
  return [sys.executable, '-m', 'vit_jax.main', f'--config={config_file}', f'--workdir={workdir}',
          *(f'--config.{k}={v}' for k, v in overrides.items())]


def run_main(config_file: str, workdir: str, overrides: dict, **kwargs) -> subprocess.CompletedProcess:
  return subprocess.run(main_args(config_file, workdir, overrides), cwd=REPO, capture_output=True,
                        text=True, **kwargs)


def read_scalars(workdir: str) -> dict[str, dict[int, float]]:
  """tag -> step -> value from every TensorBoard event file in `workdir` (later files win)."""
  return events.read_scalars(workdir)


# The data pipeline's tests.

def data_config(data_dir: str | None, **overrides) -> ml_collections.ConfigDict:
  """The data fields of a config (the digits, unaugmented, at their native 8x8) with overrides."""
  pp, pp_eval = defaults.get_config().pp, defaults.get_config().pp_eval  # Every op off but the crop.
  pp.update(dict(crop='resize', flip=False))
  config = ml_collections.ConfigDict(dict(
      dataset='digits', data_dir=data_dir, train_split='train', eval_split='test', image_size=8,
      seed=0, shuffle_buffer=50_000, data_shards=None, pp=pp, pp_eval=pp_eval))
  pp = overrides.pop('pp', {})
  config.update(overrides)
  config.pp.update(pp)
  return config


def as_uint8(images: np.ndarray) -> np.ndarray:
  """[-1, 1] floats of an un-augmented native-size image back to exact uint8 pixels."""
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
