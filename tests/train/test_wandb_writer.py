"""config.wandb (vit_jax/train/wandb_writer.py) against a stand-in `wandb` module that records the
calls: what a run logs, as what, and to which W&B run when it is started again; the one-line errors.
A real W&B run's files (offline) are read back in tests/e2e/test_wandb.py."""

import importlib.machinery
import importlib.util
import json
import shutil
import sys
import types

import pytest

import helpers
from vit_jax.train import loop, setup as train_setup, wandb_writer


class _Run:
  """W&B's run: `starting_step`, the step after the last one logged to the run of its id (W&B's
  server's on a resume)."""

  def __init__(self, calls: list, kwargs: dict, last_steps: dict):
    self.calls, self.kwargs, self._last_steps = calls, kwargs, last_steps
    self.starting_step = last_steps.get(kwargs['id'], -1) + 1
    calls.append(('init', kwargs))

  def log(self, data, step):
    self.calls.append(('log', step, dict(data)))
    self._last_steps[self.kwargs['id']] = max(step, self._last_steps.get(self.kwargs['id'], -1))

  def finish(self):
    self.calls.append(('finish',))


@pytest.fixture
def fake_wandb(monkeypatch) -> list:
  """A `wandb` module whose init, log and finish append to the list returned."""
  calls, last_steps = [], {}
  module = types.ModuleType('wandb')
  module.__spec__ = importlib.machinery.ModuleSpec('wandb', None)
  module.init = lambda **kwargs: _Run(calls, kwargs, last_steps)
  monkeypatch.setitem(sys.modules, 'wandb', module)
  return calls


def _config(data_dir, **overrides):
  return helpers.load_config(
      'demo',
      {
          **helpers.TINY,
          'data_dir': data_dir,
          'wandb.project': 'vit-digits',
          'wandb.tags': ('tiny', 'demo'),
          **overrides,
      },
  )


def test_a_run_logs_its_scalars_and_config_and_a_resumed_run_logs_to_the_same_run(
    tmp_path, data_dir, fake_wandb
):
  workdir = str(tmp_path / 'run_a')
  loop.train_and_evaluate(train_setup.prepare(_config(data_dir), workdir))
  (_, init), *logs, finish = fake_wandb
  run_id = json.loads((tmp_path / 'run_a' / wandb_writer.RUN_FILE).read_text())['id']
  assert {k: init[k] for k in ('project', 'entity', 'name', 'group', 'tags', 'id', 'resume')} == {
      'project': 'vit-digits',
      'entity': None,
      'name': 'run_a',  # The workdir's.
      'group': None,
      'tags': ['tiny', 'demo'],
      'id': run_id,
      'resume': 'allow',
  }
  assert init['config']['model']['hidden_size'] == 32 and init['config']['total_steps'] == 12
  assert finish == ('finish',)
  # Every scalar of the event files, at its step.
  logged = {}
  for _, step, data in logs:
    for name, value in data.items():
      logged.setdefault(name, {})[step] = value
  written = helpers.read_scalars(workdir)  # float32, which W&B's float64s round to.
  assert logged.keys() == written.keys()
  for name, values in written.items():
    assert logged[name] == pytest.approx(values, rel=1e-6), name

  fake_wandb.clear()
  longer = _config(data_dir, total_steps=16, **{'wandb.name': 'longer'})
  loop.train_and_evaluate(train_setup.prepare(longer, workdir))
  (_, init), *logs, _ = fake_wandb
  assert (init['id'], init['name']) == (run_id, 'longer')
  assert min(step for _, step, _ in logs) > 12


def test_a_run_resumed_from_before_its_last_logged_step_sends_only_later_steps(
    tmp_path, data_dir, fake_wandb
):
  """W&B refuses, with a warning, a step below the last one it holds: the steps a resumed run computes
  again (from its last checkpoint to where it stopped) are not sent; the later ones are."""
  workdir = tmp_path / 'run'
  loop.train_and_evaluate(train_setup.prepare(_config(data_dir), str(workdir)))
  for step in (8, 12):  # Stopped after logging step 12 with its last checkpoint at step 4.
    shutil.rmtree(workdir / 'checkpoints' / str(step))
  fake_wandb.clear()
  longer = _config(data_dir, total_steps=16)
  loop.train_and_evaluate(train_setup.prepare(longer, str(workdir)))
  logged = sorted({step for call in fake_wandb if call[0] == 'log' for step in [call[1]]})
  assert logged == [16]
  assert helpers.read_scalars(str(workdir))['train_loss'].keys() >= {8, 12, 16}  # Computed again.


def test_a_run_of_a_sweep_is_in_the_sweep_s_group_unless_the_config_names_one(
    tmp_path, data_dir, fake_wandb
):
  sweep_root = tmp_path / 'lr_sweep'
  sweep_root.mkdir()
  (sweep_root / wandb_writer.SWEEP_FILE).write_text(json.dumps({'runs': {'lr.base=0.1': []}}))
  for workdir, overrides, group in [
      (sweep_root / 'lr.base=0.1', {}, 'lr_sweep'),
      (sweep_root / 'lr.base=0.1', {'wandb.group': 'mine'}, 'mine'),
      (sweep_root / 'not_listed', {}, None),
      (tmp_path / 'alone', {}, None),
  ]:
    workdir.mkdir(exist_ok=True)
    wandb_writer.WandbWriter(str(workdir), _config(data_dir, **overrides))
    assert fake_wandb.pop()[1]['group'] == group, (workdir, overrides)


def test_a_run_that_w_and_b_cannot_start_is_one_line(tmp_path, data_dir, monkeypatch, fake_wandb):
  def refuse(**kwargs):
    raise RuntimeError(
        'api_key not configured (no-tty). call wandb.login(key=[your_api_key])\nmore'
    )

  monkeypatch.setattr(sys.modules['wandb'], 'init', refuse)
  with pytest.raises(ValueError) as error:
    loop.train_and_evaluate(train_setup.prepare(_config(data_dir), str(tmp_path)))
  assert str(error.value) == (
      "Weights & Biases could not start the run of config.wandb.project='vit-digits' (api_key not "
      'configured (no-tty). call wandb.login(key=[your_api_key])): log in with `wandb login` (or '
      'set WANDB_API_KEY), run offline with WANDB_MODE=offline, or unset config.wandb.project'
  )


def test_a_project_without_w_and_b_installed_is_one_line_before_the_workdir(
    tmp_path, data_dir, monkeypatch
):
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(
      importlib.util, 'find_spec', lambda name, *a: None if name == 'wandb' else find_spec(name, *a)
  )
  with pytest.raises(ValueError, match=r'^config\.wandb\.project=.vit-digits. logs to Weights & '):
    train_setup.prepare(_config(data_dir), str(tmp_path / 'w'))
  assert not (tmp_path / 'w').exists()
