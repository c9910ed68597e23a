"""Export of a trained run (model.npz, model.jaxexport, config.json) and loading a run's parameters.

A tiny run of the real loop, trained once, is the workdir every test reads.
"""

import json
import os
import shutil
import subprocess
import sys
from typing import Any

import flax
import chex
import jax
import numpy as np
import pytest

import helpers
from vit_jax.checkpoints import checkpoint, run_dir
from vit_jax.tools import export
from vit_jax.checkpoints import adapting, npz_files
from vit_jax.models import patch_embedding
from vit_jax.tasks import classification
from vit_jax.train import loop, setup as train_setup

EXPORT_CMD = [sys.executable, '-m', 'vit_jax.tools.export']

# Runs in a fresh interpreter with jax and numpy only: the artefact must not need vit_jax.
_CALL_ARTEFACT = """
import sys
import jax
import numpy as np
exported = jax.export.deserialize(open(sys.argv[1], 'rb').read())
images = np.load(sys.argv[2])
np.save(sys.argv[3], np.asarray(exported.call(images[:1])))
np.save(sys.argv[4], np.asarray(exported.call(images)))
assert not [m for m in sys.modules if m.startswith(('vit_jax', 'configs'))], 'vit_jax was imported'
print(exported.in_avals[0].shape, exported.out_avals[0].shape)
"""


@pytest.fixture(scope='session')
def workdir(trained_tiny_run):
  # Its high learning rate moves the zero-initialised head well away from zero in the 12 steps, so
  # that comparing logits with another implementation means something.
  return trained_tiny_run


@pytest.fixture(scope='session')
def exported(exported_tiny_run):
  return exported_tiny_run


def _assert_trees_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  chex.assert_trees_all_equal(a, b)


def _images(n, size):
  return np.random.RandomState(0).uniform(-1, 1, (n, size, size, 3)).astype(np.float32)


def test_export_writes_the_latest_parameters_in_the_original_layout(workdir, exported):
  _assert_trees_equal(
      npz_files.load_npz(os.path.join(exported, 'model.npz')),
      helpers.checkpoint_params(workdir, 12),
  )
  with open(os.path.join(exported, 'config.json')) as f:
    description = json.load(f)
  assert description['variant'] == 'ViT-testing_4'
  assert description['model'] == {
      'patch_size': 4,
      'hidden_size': 32,
      'num_layers': 2,
      'mlp_dim': 64,
      'num_heads': 2,
      'classifier': 'token',
      'map_heads': None,
      'map_mlp_dim': None,
      'map_include_prefix': False,
      'representation_size': None,
      'dropout_rate': 0.0,
      'attention_dropout_rate': 0.0,
      'head_dropout_rate': 0.1,
      'head_bias_init': 0.0,
      'patch_dropout': 0.0,
      'attention': 'xla',
      'matmul': 'default',
      'remat': None,
      'scan': False,
      'resnet_layers': None,
      'resnet_width_factor': 1.0,
      'fc_norm': False,
      'final_norm': True,
      'norm_layer': 'layernorm',
      'embed_norm': False,
      'posemb': 'learn',
      'posemb_where': 'input',
      'drop_path_rate': 0.0,
      'mlp_activation': 'gelu_tanh',
      'layer_scale': None,
      'layer_scale_mlp': True,
      'num_kv_heads': None,
      'parallel_block': False,
      'diff_attention': False,
      'layernorm_epsilon': 1e-6,
      'num_registers': 0,
      'qk_norm': False,
      'key_bias': True,
      'attn_norm': False,
      'mlp_gated': False,
      'mlp_norm': False,
      'res_post_norm': False,
      'rope': False,
      'rope_grid': None,
      'rope_style': 'eva02',
      'class_token': None,
      'distilled': False,
      'pre_norm': False,
      'weight_init': 'original',
      'block': 'standard',
      'lora_rank': None,  # A run's adapters are folded into its kernels: a plain ViT.
      'lora_alpha': None,
      'lora_targets': ['query', 'value'],
      'lora_dropout': 0.0,
  }
  assert (description['image_size'], description['num_classes']) == (8, 10)
  assert description['pp_eval'] == {
      'crop': 'resize',
      'crop_fraction': 0.875,
      'antialias': True,
      'reducing_gap': 0.0,
  }
  assert description['class_names'] == list('0123456789')
  assert (description['parameters'], description['step']) == ('raw', 12)
  assert 'peft' not in description  # No adapters.


def test_the_artefact_of_a_run_trained_with_fused_attention_holds_xlas_attention(monkeypatch):
  """On a GPU the fused path is cuDNN's kernel, which the artefact's CPU and TPU lowerings could not
  hold: export traces XLA's attention, on the same parameters."""
  from vit_jax.models import VisionTransformer, attention, variants  # pylint: disable=g-import-not-at-top

  def cudnn_only(*args, **kwargs):
    raise AssertionError('the fused attention was traced for the artefact')

  model = VisionTransformer(
      num_classes=3,
      **variants.get_model_config('ViT-testing_4', {'attention': 'dot_product_attention'}),
  )
  params = model.init(jax.random.key(0), np.zeros((1, 16, 16, 3), np.float32))['params']
  monkeypatch.setitem(attention.ATTENTION_FNS, 'dot_product_attention', cudnn_only)
  images = np.random.default_rng(0).uniform(-1, 1, (2, 16, 16, 3)).astype(np.float32)
  served = jax.export.deserialize(export.serialize_inference(model, params, 16)).call(images)
  reference = model.clone(attention='xla').apply({'params': params}, images)
  np.testing.assert_allclose(served, reference, rtol=1e-5, atol=1e-5)


def test_the_jaxexport_artefact_runs_without_vit_jax_for_any_batch(workdir, exported, tmp_path):
  images = _images(5, 8)
  np.save(tmp_path / 'images.npy', images)
  run = subprocess.run(
      [
          sys.executable,
          '-c',
          _CALL_ARTEFACT,
          os.path.join(exported, 'model.jaxexport'),
          'images.npy',
          'one.npy',
          'five.npy',
      ],
      cwd=tmp_path,
      capture_output=True,
      text=True,
      timeout=120,
      env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': ''},
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.split() == ['(b,', '8,', '8,', '3)', '(b,', '10)']  # A symbolic batch.
  expected = helpers.model_logits(workdir, helpers.checkpoint_params(workdir, 12), images)
  np.testing.assert_allclose(np.load(tmp_path / 'one.npy'), expected[:1], atol=1e-5)
  np.testing.assert_allclose(np.load(tmp_path / 'five.npy'), expected, atol=1e-5)
  assert np.load(tmp_path / 'five.npy').dtype == np.float32


@flax.struct.dataclass
class _PolyakState:
  """The train state of a run with Polyak averaging, as the loop saves it."""

  step: Any
  params: Any
  opt_state: Any
  ema_params: Any


@pytest.mark.parametrize('polyak', [True, False])
def test_export_takes_the_polyak_average_when_the_run_kept_one(workdir, tmp_path, polyak):
  for name in ('config.json', 'dataset_info.json'):
    shutil.copy(os.path.join(workdir, name), tmp_path / name)
  params = helpers.checkpoint_params(workdir, 12)
  average = jax.tree.map(lambda x: 0.5 * x, params)
  manager = checkpoint.make_manager(str(tmp_path), keep=1)
  checkpoint.save(
      manager,
      3,
      _PolyakState(
          step=np.int32(3), params=params, opt_state={}, ema_params=average if polyak else None
      ),
  )
  manager.wait_until_finished()
  description = export.export(str(tmp_path), str(tmp_path / 'out'))
  assert description['parameters'] == ('polyak' if polyak else 'raw')
  _assert_trees_equal(
      npz_files.load_npz(str(tmp_path / 'out' / 'model.npz')), average if polyak else params
  )


def test_command_line_exports_the_chosen_step(workdir, tmp_path):
  run = subprocess.run(
      [*EXPORT_CMD, f'--workdir={workdir}', f'--out={tmp_path}', '--step=8'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 0, run.stderr[-2000:]
  assert f'exported step 8 (raw parameters) of {workdir}' in run.stdout
  _assert_trees_equal(
      npz_files.load_npz(str(tmp_path / 'model.npz')), helpers.checkpoint_params(workdir, 8)
  )
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['step'] == 8
  assert os.path.getsize(tmp_path / 'model.jaxexport') > 0


@pytest.mark.parametrize(
    'args,message',
    [
        (
            ['--workdir={tmp}/nothing_here'],
            r"^error: '.*nothing_here' has no checkpoints/ directory",
        ),
        (
            ['--workdir={workdir}', '--step=5'],
            r'^error: .* has no checkpoint of step 5: use one of \[4, 8, 12\]',
        ),
        (
            ['--workdir={workdir}', '--step=many'],
            r'^error: flag --step=many: pass a checkpoint step \(a number\) or best: use ',
        ),
        ([], r'^error: --workdir is required: use --workdir=W --out=DIR'),
        (['--workdir={workdir}', 'extra'], r"^error: unexpected arguments \['extra'\]"),
        (
            ['--workdir={workdir}', '--patch_size=3'],
            r'^error: image_size=8 is not a multiple of the patch size 3 \(in input pixels\): use a '
            r'multiple, e.g. 6$',
        ),
        (  # It hung, building 625,000,000 patches' position embeddings.
            ['--workdir={workdir}', '--image_size=100000'],
            r'^error: image_size=100000 cuts each image into 625,000,000 tokens of 4 px, more than ',
        ),
        (
            ['--workdir={workdir}', '--image_size=0'],
            r'^error: flag --image_size=0: must be a positive number of pixels, or left out: the '
            r"run's: use ",
        ),
    ],
)
def test_command_line_bad_input_is_one_line(workdir, tmp_path, args, message):
  args = [a.format(tmp=tmp_path, workdir=workdir) for a in args]
  run = subprocess.run(
      [*EXPORT_CMD, *args, f'--out={tmp_path}/out'],
      cwd=helpers.REPO,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert run.returncode == 2
  assert len(run.stderr.strip().splitlines()) == 1, run.stderr[-2000:]
  assert __import__('re').search(message, run.stderr), run.stderr
  assert not os.path.exists(tmp_path / 'out')


@pytest.mark.parametrize('image_size,patch_size', [(None, 2), (16, 8), (16, None)])
def test_an_export_at_another_size_computes_what_the_run_computes_fitted_as_it_runs(
    workdir, tmp_path, image_size, patch_size
):
  """--image_size / --patch_size (a FlexiViT deployed at one patch size): the artefact and the .npz are
  a plain model of that size, fitted once on the host, whose logits are the run's model fitted to
  those images as it runs (what an evaluator at that size measures), and config.json says the sizes.
  """
  description = export.export(workdir, str(tmp_path), image_size=image_size, patch_size=patch_size)
  size, patch = image_size or 8, patch_size or 4
  assert (description['image_size'], description['model']['patch_size']) == (size, patch)
  trained = run_dir.load_trained(workdir)
  images = _images(3, size)
  fitted = patch_embedding.fitted_to_images(
      lambda params, x: trained.model.clone(patch_size=patch).apply(
          {'params': params}, x, train=False
      ),
      trained.config.posemb_interpolation,
      trained.config.patch_interpolation,
  )
  expected = fitted(trained.params, images)
  artefact = jax.export.deserialize((tmp_path / 'model.jaxexport').read_bytes())
  np.testing.assert_allclose(artefact.call(images), expected, atol=2e-5)
  npz = npz_files.load_npz(str(tmp_path / 'model.npz'))
  assert npz['embedding']['kernel'].shape[:2] == (patch, patch)
  np.testing.assert_allclose(
      trained.model.clone(patch_size=patch).apply({'params': npz}, images, train=False),
      expected,
      atol=2e-5,
  )


def test_an_adapted_run_exported_at_another_size_holds_its_adapters_folded_in(tmp_path):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'model.lora_rank': 2, 'total_steps': 2, 'lr.warmup_steps': 0}
  )
  loop.train_and_evaluate(train_setup.prepare(config, str(tmp_path / 'run')))
  description = export.export(str(tmp_path / 'run'), str(tmp_path / 'out'), patch_size=2)
  assert description['peft'] == (
      "not written: the adapters are of the run's size; the files hold them folded in"
  )
  npz = npz_files.load_npz(str(tmp_path / 'out' / 'model.npz'))
  assert not any('lora' in key for key in flax.traverse_util.flatten_dict(npz, sep='/'))


def test_export_of_a_directory_that_is_not_a_run_is_a_clear_error(workdir, tmp_path):
  shutil.copytree(os.path.join(workdir, 'checkpoints'), tmp_path / 'checkpoints')
  with pytest.raises(
      ValueError, match='config.json is missing: is .* the --workdir of a vit_jax run'
  ):
    export.export(str(tmp_path), str(tmp_path / 'out'))


def test_a_damaged_checkpoint_is_one_line_naming_the_others(workdir, tmp_path):
  """It was the bare error of the file (`Unterminated string starting at: line 1 column 27295`),
  naming neither the checkpoint nor the ones that can be read."""
  run = helpers.copy_of(workdir, tmp_path)
  metadata = os.path.join(run, 'checkpoints', '12', 'default', '_METADATA')
  with open(metadata, 'r+') as f:
    f.truncate(100)
  with pytest.raises(
      ValueError,
      match=r'^checkpoint .*/checkpoints/12 cannot be read \(.+\): read another of '
      r'.*/checkpoints \(\[4, 8\]: --step=N, or .*/checkpoints/N\), or restore it from a backup$',
  ):
    export.export(run, str(tmp_path / 'out'))
  assert export.export(run, str(tmp_path / 'out'), step=8)['step'] == 8


@pytest.mark.parametrize(
    'damage, message',
    [
        (
            {'model.jaxexport': b''},
            r'model\.jaxexport cannot be read \(\w+\): export the run again',
        ),
        ('cut', r'model\.jaxexport cannot be read \(\w+\): export the run again'),
        ({'config.json': b'{'}, r'config\.json is not JSON \(.*\): export the run again'),
        ({'config.json': b'{}'}, r'config\.json is not the description an export writes'),
    ],
)
def test_a_damaged_export_is_a_one_line_error_naming_its_file(exported, tmp_path, damage, message):
  """A copy cut short (an interrupted download), another file of the name."""
  out = tmp_path / 'export'
  shutil.copytree(exported, out)
  if damage == 'cut':
    data = (out / 'model.jaxexport').read_bytes()
    damage = {'model.jaxexport': data[: len(data) // 2]}
  for name, data in damage.items():
    (out / name).write_bytes(data)
  with pytest.raises(ValueError, match=message) as error:
    run_dir.load_export(str(out))
  assert '\n' not in str(error.value)


def test_export_to_an_unwritable_directory_is_a_clear_error(workdir, tmp_path):
  (tmp_path / 'a_file').write_text('')
  with pytest.raises(
      ValueError, match=r"--out='.*a_file/out' is not writable.*directory you can write to"
  ):
    export.export(workdir, str(tmp_path / 'a_file' / 'out'))


# `config.init_from`: a run's workdir, one of its step directories, or an .npz.


def test_load_params_reads_a_workdir_a_step_directory_and_an_npz(workdir, exported):
  params, note = run_dir.load_params(workdir)
  _assert_trees_equal(params, helpers.checkpoint_params(workdir, 12))
  assert note == f'loaded params of step 12 from {os.path.join(workdir, "checkpoints", "12")}'
  params, note = run_dir.load_params(os.path.join(workdir, 'checkpoints', '8'))
  _assert_trees_equal(params, helpers.checkpoint_params(workdir, 8))
  params, note = run_dir.load_params(os.path.join(exported, 'model.npz'))
  _assert_trees_equal(params, helpers.checkpoint_params(workdir, 12))
  assert note == f'loaded {os.path.join(exported, "model.npz")}'


def test_a_run_fine_tunes_at_another_resolution_from_its_loaded_parameters(workdir):
  config, _ = run_dir.load_run_info(workdir)
  config.image_size = 16  # 4x4 patches instead of 2x2.
  model = classification.make_model(config, helpers.model_config(config), 3)
  target = jax.eval_shape(model.init, jax.random.key(0), np.zeros((1, 16, 16, 3)))['params']
  params, notes = adapting.adapt_params(
      run_dir.load_params(workdir)[0], target, keep_head=False, keep_pre_logits=False
  )
  assert notes == [
      'replaced head (32, 10) with zeros (32, 3)',
      'resized pos_embedding 2x2 -> 4x4 (bilinear)',
  ]
  logits = model.apply({'params': params}, _images(2, 16))
  np.testing.assert_array_equal(logits, np.zeros((2, 3)))  # The zero head.
