"""What a new user meets at the console: each mistake is one `error:` line that names the fix (no
traceback), `--help` is a success and a plan piped into `head` ends quietly. Each error here is raised
while the flags are parsed, before anything compiles."""

import json
import os
import subprocess
import sys

import pytest

import helpers


def _errors(args: list[str]) -> list[str]:
  """The `error:` lines of `vit_jax.main` run with `args`, asserting status 2 and no traceback."""
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--workdir=unused', *args],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2 and 'Traceback' not in run.stderr, run.stderr[-3000:]
  errors = [line for line in run.stderr.splitlines() if line.startswith('error: ')]
  assert len(errors) == 1, run.stderr[-3000:]
  return errors


def test_a_config_file_with_a_syntax_error_names_its_line(tmp_path):
  (tmp_path / 'broken.py').write_text(
      'from vit_jax import defaults\n\n\ndef get_config():\n'
      '  config = defaults.get_config(\n  return config\n'
  )
  errors = _errors([f'--config={tmp_path / "broken.py"}'])
  assert errors[0].startswith(f'error: {tmp_path / "broken.py"}:5: SyntaxError: '), errors


@pytest.mark.parametrize(
    'body,line,error',
    [
        (
            "  raise ValueError('no such recipe')\n",
            5,
            'get_config raised ValueError: no such recipe',
        ),
        (
            '  return config.no_such_dict.size\n',
            5,
            "get_config raised AttributeError: 'no_such_dict'",
        ),
        ("  return {'a': 1}['b']\n", 5, "get_config raised KeyError: 'b'"),
        (  # ml_collections' own message, quoted once more: read as it says it.
            '  return config.lr.bse\n',
            5,
            'get_config raised AttributeError: \'bse\'. Did you mean "base" instead of "bse"?',
        ),
    ],
)
def test_a_config_file_whose_get_config_raises_names_its_line(tmp_path, body, line, error):
  (tmp_path / 'raises.py').write_text(
      'from vit_jax import defaults\n\ndef get_config():\n'
      f'  config = defaults.get_config()\n{body}'
  )
  errors = _errors([f'--config={tmp_path / "raises.py"}'])
  assert errors[0].startswith(f'error: {tmp_path / "raises.py"}:{line}: {error}'), errors


def test_a_config_file_that_is_no_config_says_what_it_is(tmp_path):
  (tmp_path / 'ViT-B_16.npz').write_bytes(b'PK\x03\x04\x00\x00')  # A checkpoint given as --config.
  checkpoint, sweep = tmp_path / 'ViT-B_16.npz', 'configs/sweeps/demo_lr_steps.py'
  one_arg = tmp_path / 'one_arg.py'
  one_arg.write_text('def get_config(dataset):\n  return None\n')
  for args, error in [
      (
          [f'--config={checkpoint}'],
          f'error: cannot load the --config file {checkpoint}: it is not a Python config file (a file '
          'such as configs/demo.py); a checkpoint to start from is --config.init_from=FILE',
      ),
      (
          [f'--config={sweep}'],
          f'error: --config file {sweep} has no get_config() (a sweep: run it with python '
          f'launch/sweep.py --sweep={sweep} --workdir=ROOT): pass a config file',
      ),
      (
          ['--config=configs/demo.py:B'],
          'error: --config=configs/demo.py:ARG: its get_config() takes no argument (get_config() '
          'takes 0 positional arguments but 1 was given): drop the :ARG',
      ),
      (
          [f'--config={one_arg}'],
          f'error: --config={one_arg}: its get_config() needs an argument (get_config() missing 1 '
          f"required positional argument: 'dataset'): pass --config={one_arg}:ARG",
      ),
      *(
          (
              [f'--config=configs/finetune.py{arg}'],
              'error: --config=configs/finetune.py: its get_config() needs more arguments than the '
              f'one :ARG gives (get_config() missing {missing}): it is a recipe other config files '
              'call (its docstring names them): pass one of those',
          )
          for arg, missing in [
              ('', "2 required positional arguments: 'variant' and 'dataset'"),
              (':cifar10', "1 required positional argument: 'dataset'"),
          ]
      ),
  ]:
    assert _errors(args) == [error]


@pytest.mark.parametrize('overrides', [[], ['--config.lr.base=0.1']])
def test_a_config_file_that_is_not_there_is_one_line_with_or_without_overrides(overrides):
  """An override reads the file in applying itself, a path of its own through config_flags."""
  assert _errors(['--config=configs/nonexistent.py', *overrides]) == [
      'error: cannot load the --config file: [Errno 2] No such file or directory: '
      "'configs/nonexistent.py'"
  ]


def test_a_flag_left_out_is_required_and_the_usage_shown():
  run = subprocess.run(
      [sys.executable, '-m', 'vit_jax.main', '--config=configs/demo.py'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2 and run.stderr.strip() == (
      'error: --workdir is required: use --config=FILE[:ARG] --workdir=DIR '
      '[--config.FIELD=VALUE ...], e.g. python -m vit_jax.main --config=configs/demo.py '
      '--workdir=workdirs/demo'
  ), run.stderr


def test_a_misspelt_override_suggests_the_field():
  errors = _errors(['--config=configs/demo.py', '--config.lr.warmup=10'])
  assert errors == [
      'error: bad config override --config.lr.warmup=10: the config has no field '
      'lr.warmup. Did you mean "lr.warmup_steps" (--config.lr.warmup_steps=10)?'
  ]
  assert 'add the field' not in errors[0]


def test_none_unsets_a_field_that_may_be_unset():
  # head_dropout_rate's default is unset: None is accepted, and the run goes on to the next check.
  errors = _errors(
      [
          '--config=configs/demo.py',
          '--config.model.head_dropout_rate=None',
          '--config.total_steps=-1',
      ]
  )
  assert errors == ['error: The run has -1 steps: raise config.total_steps or config.num_epochs']
  # A field whose default is a value cannot be unset: the error gives it one.
  errors = _errors(['--config=configs/demo.py', '--config.lr.base=None'])
  assert errors[0].startswith(
      'error: --config.lr.base=None: config.lr.base cannot be unset'
  ), errors
  assert errors[0].endswith('e.g. --config.lr.base=0.001'), errors
  # A group of fields: one line naming them (its printed ConfigDict was the error's lines).
  for value in ('None', '3'):
    errors = _errors(['--config=configs/demo.py', f'--config.lr={value}'])
    assert errors[0].endswith(
        'config.lr is a group of fields (base, decay, end, warmup_steps): set each, e.g. '
        '--config.lr.base=0.001'
    ), errors
  # A field that does not exist: one line naming the closest (it was a KeyError's traceback).
  errors = _errors(['--config=configs/demo.py', '--config.lr.bse=None'])
  assert errors == [
      'error: bad config override --config.lr.bse=None: the config has no field lr.bse. Did you '
      'mean "lr.base" (--config.lr.base=None)?'
  ]


def test_total_steps_over_a_file_with_num_epochs_says_how_to_clear_it():
  errors = _errors(['--config=configs/bit_i21k.py', '--config.total_steps=3'])
  assert errors == [
      'error: --config.total_steps=3 is given, but configs/bit_i21k.py sets '
      'config.num_epochs=90.0, and a run takes exactly one of them: add '
      "--config.num_epochs=None to clear the file's"
  ]
  # As told: the file's num_epochs cleared, the run goes on to the next check (bit_i21k's dataset).
  errors = _errors(
      ['--config=configs/bit_i21k.py', '--config.total_steps=3', '--config.num_epochs=None']
  )
  assert 'num_epochs' not in errors[0], errors


@pytest.mark.parametrize(
    'command,flag',
    [
        ('main', '--config'),
        ('tools.plan', '--config'),
        ('tools.predict', '--top_k'),
        ('tools.export', '--out'),
        ('tools.report', '--pivot'),
        ('tools.fewshot', '--shots'),
        ('tools.pictures', '--image'),
        ('tools.vtab', '--select'),
        ('tools.scaling', '--out'),
        ('tools.to_array_record', 'DATA_DIR'),
    ],
)
def test_help_exits_0(command, flag):
  run = subprocess.run(
      [sys.executable, '-m', f'vit_jax.{command}', '--help'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0 and flag in run.stdout, (
      run.returncode,
      run.stdout[-2000:],
      run.stderr[-2000:],
  )


def test_a_plan_piped_into_a_reader_that_stops_ends_quietly():
  status, stderr = helpers.run_piped_into_a_reader_that_stops(
      [
          sys.executable,
          '-m',
          'vit_jax.tools.plan',
          '--config=configs/vit_b16_i1k.py',
          '--devices=128',
          '--chip=tpu-v4',
          '--json',
      ]
  )
  assert status == 0 and stderr == '', stderr[-2000:]


# A command's flags as vit_jax.main defines them, parsed: the config that reaches the run.
_PARSED = """
import sys
from absl import flags
from ml_collections import config_flags
from vit_jax.runtime import config_files
config_flags.DEFINE_config_file('config', None, '', lock_config=True)
flags.DEFINE_string('workdir', None, '')
config_files.flags_parser('USAGE')(sys.argv)
print(flags.FLAGS.config.to_json())
"""


def _parsed(args: list[str]) -> dict:
  run = subprocess.run(
      [sys.executable, '-c', _PARSED, '--workdir=unused', *args],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout)


def test_a_value_after_a_space_is_the_fields_as_after_an_equals_sign():
  """absl takes `--config.FIELD VALUE`: None there was parsed as the field's type ("takes an
  integer, or None")."""
  config = _parsed(
      [
          '--config=configs/demo.py',
          '--config.total_steps',
          'None',
          '--config.num_epochs',
          '2',
          '--config.wandb.tags',
          'vit,i1k',
          '--config.evals.extra',
          "dict(type='classification', split='test', every_steps=3)",
      ]
  )
  assert (config['total_steps'], config['num_epochs']) == (None, 2)
  assert config['wandb']['tags'] == ['vit', 'i1k']
  assert config['evals']['extra']['every_steps'] == 3


def test_words_given_to_a_tuple_field_are_its_elements():
  config = _parsed(
      [
          '--config=configs/demo.py',
          '--config.wandb.tags=vit,i1k',  # config_flags kept them whole: ('vit,i1k',).
          '--config.optim.frozen=head, embedding',
          '--config.flexi.patch_sizes=2,4',
          "--config.fewshot.shots=('a,b',)",  # Quoted: one element, as written.
      ]
  )
  assert config['wandb']['tags'] == ['vit', 'i1k']
  assert config['optim']['frozen'] == ['head', 'embedding']
  assert config['flexi']['patch_sizes'] == [2, 4]
  assert config['fewshot']['shots'] == ['a,b']
  # A dict: config_flags took the tuple of its keys (every parameter named with an 'a' frozen).
  errors = _errors(['--config=configs/demo.py', "--config.optim.frozen={'a': 1}"])
  assert errors == [
      "error: bad config override --config.optim.frozen={'a': 1}: config.optim.frozen takes "
      'values separated by commas'
  ]


def test_an_evaluator_is_added_replaced_or_dropped_whole():
  flexi = '--config=configs/demo_flexi.py'
  config = _parsed(
      [
          flexi,
          "--config.evals.minival=dict(type='classification', split='train[:10%]', every_steps=2)",
          "--config.evals.p8={'type': 'classification', 'split': 'test', 'every_steps': 3}",
          '--config.evals.p2=None',
      ]
  )
  assert config['evals'] == {
      'p8': {'type': 'classification', 'split': 'test', 'every_steps': 3},
      'minival': {'type': 'classification', 'split': 'train[:10%]', 'every_steps': 2},
  }
  # Added, then dropped, on one line: it is not there (was "no evaluator 'minival' to drop").
  config = _parsed(
      [
          flexi,
          "--config.evals.minival=dict(type='classification', split='test', every_steps=2)",
          '--config.evals.minival=None',
      ]
  )
  assert sorted(config['evals']) == ['p2', 'p8']
  example = "--config.evals.NAME=\"dict(type='classification', split='test', every_steps=1000)\""
  for args, message in (
      (['--config.evals.m=3'], 'an evaluator is a dict of literals: ' + example),
      (
          ['--config.evals.zz=None'],
          "config.evals has no evaluator 'zz' to drop (the file's: p2, p8)",
      ),
      (
          ['--config.evals.m.type=classification'],
          "the file's evaluators are p2, p8; a new one is given whole: " + example,
      ),
  ):
    errors = _errors([flexi, *args])
    assert errors[0].endswith(message.replace('NAME', args[0].split('.')[2].split('=')[0])), errors


@pytest.mark.parametrize(
    'command,flag',
    [
        (['vit_jax.main', '--config=configs/demo.py', '--config.total_steps=2'], '--workdir='),
        (['vit_jax.tools.export', '--workdir=workdirs/demo'], '--out='),
    ],
)
def test_an_empty_directory_flag_is_one_line_and_writes_nothing(tmp_path, command, flag):
  # `--workdir=$WORKDIR` with WORKDIR unset would train into the current directory.
  env = {**os.environ, 'PYTHONPATH': str(helpers.REPO)}
  command = [
      sys.executable,
      '-m',
      command[0],
      *(a.replace('configs/', f'{helpers.REPO}/configs/') for a in command[1:]),
  ]
  run = subprocess.run(
      [*command, flag], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
  )
  assert run.returncode == 2 and run.stderr.strip().endswith(
      f'is empty (an unset shell variable?), which would be the current directory: pass the '
      f'directory, {flag}DIR'
  ), run.stderr[-2000:]
  assert not os.listdir(tmp_path)


def test_config_file_mistakes_are_one_line_naming_the_fix(tmp_path):
  (tmp_path / 'none.py').write_text('def get_config():\n  pass\n')
  assert _errors([f'--config={tmp_path / "none.py"}']) == [
      f'error: {tmp_path / "none.py"}: its get_config() returned None: return the config (a '
      'missing return?)'
  ]
  assert _errors(
      ['--config=configs/demo.py', '--config=configs/mpp_demo.py', '--config.seed=1']
  ) == [
      'error: --config is given 2 times (configs/demo.py, configs/mpp_demo.py): pass one config file'
  ]
  assert _errors(['--config=configs/demo.py', '--config.batch_size=32.0'])[0].endswith(
      ': config.batch_size takes an integer, e.g. --config.batch_size=4096'
  )
  assert _errors(['--config=configs/demo.py', '--config.total_steps=1e3'])[0].endswith(
      ': config.total_steps takes an integer, or None (unset)'
  )


def test_distributed_on_without_a_cluster_is_one_line(monkeypatch):
  """jax.distributed's ValueError was a traceback."""
  for name in ('SLURM_JOB_ID', 'SLURM_NTASKS', 'TPU_WORKER_HOSTNAMES'):
    monkeypatch.delenv(name, raising=False)
  errors = _errors(['--config=configs/demo.py', '--distributed=on'])
  assert errors[0].startswith('error: --distributed=on found no cluster to join ('), errors
  assert errors[0].endswith('or leave --distributed=auto'), errors
