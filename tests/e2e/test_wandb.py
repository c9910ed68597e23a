"""config.wandb with the real W&B client, offline: the run's files (WANDB_DIR/wandb/offline-run-*/
run-<id>.wandb, what `wandb sync` uploads) read back with W&B's own protobuf records hold every scalar
of the event files at its step, the config, and the run's name and tags; a run started again in its
workdir appends to the same W&B run; one W&B cannot start is the command's one error line."""

import glob
import json
import struct

import pytest

import helpers
from vit_jax.train import loop, setup as train_setup, wandb_writer

wandb_internal_pb2 = pytest.importorskip('wandb.proto.wandb_internal_pb2')

_BLOCK, _HEADER = 32768, struct.Struct('<IHB')  # A LevelDB log's: checksum, length, chunk type.


def _records(path: str):
  """The records of a .wandb file: a 7-byte header (':W&B', magic, version), then LevelDB-log chunks
  (FULL 1, FIRST 2, MIDDLE 3, LAST 4) in 32 KiB blocks, a block's tail under a header padded."""
  data = open(path, 'rb').read()
  assert data[:4] == b':W&B'
  pos, pending = 7, b''
  while pos + _HEADER.size <= len(data):
    if _BLOCK - pos % _BLOCK < _HEADER.size:
      pos += _BLOCK - pos % _BLOCK
      continue
    _, length, kind = _HEADER.unpack_from(data, pos)
    pending += data[pos + _HEADER.size : pos + _HEADER.size + length]
    pos += _HEADER.size + length
    if kind in (1, 4):
      record = wandb_internal_pb2.Record()
      record.ParseFromString(pending)
      yield record
      pending = b''


def _logged(wandb_dir: str, run_id: str) -> tuple[list, dict]:
  """(the run records, every history value by name and step) of the offline runs of `run_id`."""
  runs, history = [], {}
  for path in sorted(glob.glob(f'{wandb_dir}/wandb/offline-run-*-{run_id}/run-{run_id}.wandb')):
    for record in _records(path):
      kind = record.WhichOneof('record_type')
      if kind == 'run':
        runs.append(record.run)
      elif kind == 'history':
        items = {
            i.key or '/'.join(i.nested_key): json.loads(i.value_json) for i in record.history.item
        }
        for name, value in items.items():
          if not name.startswith('_'):  # W&B's own _step, _runtime, _timestamp.
            history.setdefault(name, {})[items['_step']] = value
  return runs, history


def test_an_offline_run_holds_the_scalars_config_and_names_and_a_resumed_run_appends(
    tmp_path, data_dir, monkeypatch
):
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path))
  monkeypatch.chdir(tmp_path)  # W&B's settings and caches of the run stay here.
  workdir = str(tmp_path / 'run')
  overrides = {
      **helpers.TINY,
      'data_dir': data_dir,
      'wandb.project': 'vit-digits',
      'wandb.group': 'tests',
      'wandb.tags': ('tiny',),
  }
  loop.train_and_evaluate(train_setup.prepare(helpers.load_config('demo', overrides), workdir))
  run_id = json.loads((tmp_path / 'run' / wandb_writer.RUN_FILE).read_text())['id']
  runs, history = _logged(str(tmp_path), run_id)
  [run] = runs
  assert (run.project, run.display_name, run.run_group, list(run.tags)) == (
      'vit-digits',
      'run',
      'tests',
      ['tiny'],
  )
  config = {i.key: json.loads(i.value_json) for i in run.config.update}
  assert config['model']['hidden_size'] == 32 and config['variant'] == 'ViT-testing_4'
  written = helpers.read_scalars(workdir)
  assert history.keys() == written.keys()
  for name, values in written.items():
    assert history[name] == pytest.approx(values, rel=1e-6), name

  longer = helpers.load_config('demo', {**overrides, 'total_steps': 16})
  loop.train_and_evaluate(train_setup.prepare(longer, workdir))
  runs, history = _logged(str(tmp_path), run_id)
  assert len(runs) == 2 and {r.run_id for r in runs} == {run_id}
  assert sorted(history['train_loss']) == [4, 8, 12, 16]


def test_the_command_says_a_w_and_b_that_cannot_start_in_one_line(tmp_path, data_dir):
  """The real wandb, logged in nowhere (a fresh HOME, no WANDB_API_KEY), online."""
  env = {k: v for k, v in helpers.on_devices(1).items() if k != 'WANDB_API_KEY'}
  env.update(HOME=str(tmp_path / 'home'), WANDB_MODE='online')
  run = helpers.run_main(
      'configs/demo.py',
      str(tmp_path / 'w'),
      {**helpers.TINY, 'data_dir': data_dir, 'wandb.project': 'vit-digits'},
      env=env,
      timeout=300,
  )
  assert run.returncode == 2, run.stderr[-3000:]
  assert 'Traceback' not in run.stderr, run.stderr[-3000:]
  assert (
      run.stderr.strip()
      .splitlines()[-1]
      .startswith(
          "error: Weights & Biases could not start the run of config.wandb.project='vit-digits' ("
      )
  )
