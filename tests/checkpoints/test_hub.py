"""config.init_from=hf-hub:<repo>: read from the Hugging Face cache (huggingface_hub's own layout,
models--<org>--<name>/snapshots/<commit>) offline; online, only the weights vit_jax reads (in
torch_files' order) and the JSON files beside them are downloaded; the hub's refusals are one line.
"""

import json

import httpx2
import huggingface_hub
import numpy as np
import pytest
from huggingface_hub import constants, errors

import helpers
from vit_jax.checkpoints import hub, timm_export, torch_files
from vit_jax.runtime import hf_hub
from vit_jax.tasks import classification
from vit_jax.train import setup

IMAGE_SIZE = 8
_COMMIT = '0123456789abcdef0123456789abcdef01234567'


@pytest.fixture(name='cache')
def _cache(tmp_path, monkeypatch):
  """An empty Hugging Face cache, offline; hub.py's memo of snapshots forgotten."""
  cache = tmp_path / 'hf_cache'
  cache.mkdir()
  for name, value in (('HF_HUB_CACHE', str(cache)), ('HF_HUB_OFFLINE', True)):
    monkeypatch.setattr(constants, name, value)
  hf_hub.snapshot.cache_clear()
  yield cache
  hf_hub.snapshot.cache_clear()


def _cached(cache, repo: str) -> str:
  """A timm checkpoint of a random tiny ViT (the demo's), cached as huggingface_hub caches `repo`:
  its snapshot directory."""
  config = helpers.load_config('demo', {'image_size': IMAGE_SIZE})
  model_config = helpers.model_config(config)
  model = classification.make_model(config, model_config, 10)
  tensors, timm_config = timm_export.export(
      helpers.random_params(model, IMAGE_SIZE),
      model_config,
      IMAGE_SIZE,
      10,
      pp_eval=config.pp_eval.to_dict(),
  )
  root = cache / f"models--{repo.replace('/', '--')}"
  (root / 'refs').mkdir(parents=True)
  (root / 'refs' / 'main').write_text(_COMMIT)
  snapshot = root / 'snapshots' / _COMMIT
  snapshot.mkdir(parents=True)
  torch_files.write_safetensors(tensors, str(snapshot / torch_files.SAFETENSORS))
  (snapshot / 'config.json').write_text(json.dumps(timm_config))
  return str(snapshot)


def _logits(workdir, init_from: str) -> np.ndarray:
  config = helpers.load_config(
      'demo',
      {
          **{f'model.{k}': None for k in ('hidden_size', 'num_layers', 'num_heads', 'mlp_dim')},
          'variant': 'checkpoint',
          'init_from': init_from,
          'image_size': IMAGE_SIZE,
          'keep_head': True,
      },
  )
  run = setup.prepare(config, str(workdir))
  images = np.random.RandomState(0).uniform(-1, 1, (2, IMAGE_SIZE, IMAGE_SIZE, 3))
  return np.asarray(run.model.apply({'params': run.init_params}, images.astype(np.float32)))


def test_a_cached_repository_loads_offline_as_its_directory(tmp_path, cache):
  snapshot = _cached(cache, 'org/tiny-vit')
  np.testing.assert_array_equal(
      _logits(tmp_path / 'hub', 'hf-hub:org/tiny-vit'), _logits(tmp_path / 'local', snapshot)
  )


def test_an_uncached_repository_offline_is_one_line(tmp_path, cache):
  del cache
  with pytest.raises(
      ValueError, match=r"^'hf-hub:org/absent': the Hugging Face hub cannot be"
  ) as e:
    _logits(tmp_path / 'w', 'hf-hub:org/absent')
  assert 'no copy is cached' in str(e.value) and '\n' not in str(e.value)
  assert not (tmp_path / 'w').exists()


@pytest.mark.parametrize(
    'files,downloaded',
    [
        # laion's: transformers' weights beside OpenCLIP's; only the first is downloaded.
        (
            ['config.json', 'model.safetensors', 'open_clip_model.safetensors', 'README.md'],
            ['model.safetensors'],
        ),
        (
            ['config.json', 'model.safetensors.index.json', 'model-00001-of-00002.safetensors'],
            ['model.safetensors.index.json', 'model-*.safetensors'],
        ),
        (
            ['open_clip_config.json', 'open_clip_pytorch_model.bin', 'open_clip_model.safetensors'],
            ['open_clip_model.safetensors'],
        ),
        (['open_clip_config.json', 'open_clip_pytorch_model.bin'], ['open_clip_pytorch_model.bin']),
        # An older transformers repository's pickled weights, whole or sharded.
        (['config.json', 'pytorch_model.bin', 'tf_model.h5'], ['pytorch_model.bin']),
        (
            ['config.json', 'pytorch_model.bin.index.json', 'pytorch_model-00001-of-00002.bin'],
            ['pytorch_model.bin.index.json', 'pytorch_model-*.bin'],
        ),
        # peft's LoRA adapters (their base is read from its own repository).
        (
            ['adapter_config.json', 'adapter_model.safetensors', 'README.md'],
            ['adapter_config.json', 'adapter_model.safetensors'],
        ),
    ],
)
def test_online_only_the_weights_read_and_their_configs_are_downloaded(
    cache, monkeypatch, files, downloaded
):
  asked = helpers.fake_hub(monkeypatch, files, str(cache))
  assert hub.local('hf-hub:org/model@v2') == str(cache)
  assert asked == {
      'repo': 'org/model',
      'revision': 'v2',
      'repo_type': 'model',
      'allow_patterns': [
          *downloaded,
          'config.json',
          'preprocessor_config.json',
          'open_clip_config.json',
      ],
  }


def _not_found(repo, **_):
  response = httpx2.Response(404, request=httpx2.Request('GET', 'https://huggingface.co/api'))
  raise errors.RepositoryNotFoundError('404', response=response)


@pytest.mark.parametrize(
    'listing,message',
    [
        (
            _not_found,
            r"^'hf-hub:org/model': no such model repository on the Hugging Face hub, or a",
        ),
        (
            lambda repo, **_: ['README.md', 'model.npz'],
            r"^'hf-hub:org/model' holds none of the",
        ),
    ],
    ids=['not_found', 'no_weights'],
)
def test_what_the_hub_refuses_is_one_line(cache, monkeypatch, listing, message):
  del cache
  monkeypatch.setattr(huggingface_hub, 'list_repo_files', listing)
  with pytest.raises(ValueError, match=message) as error:
    hub.local('hf-hub:org/model')
  assert '\n' not in str(error.value)


def test_a_path_that_names_no_repository_is_resolved_as_a_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert hub.local('checkpoints/vit') == str(tmp_path / 'checkpoints' / 'vit')
