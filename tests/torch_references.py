"""What the tests that compare with timm and transformers share: PyTorch models made fully random, their
outputs on our NHWC images, and ours from the same weights through config.init_from."""

import json

import numpy as np
import timm
import torch

import helpers
from vit_jax.checkpoints import timm_export, torch_files, warm_start
from vit_jax.tasks import classification
from vit_jax.train import setup

IMAGE_SIZE, NUM_CLASSES = 8, 10
# configs/demo.py's model, tiny, as the reference models are built.
MODEL = {
    'variant': 'ViT-testing_4',
    'model.hidden_size': 32,
    'model.num_layers': 2,
    'model.num_heads': 2,
    'model.mlp_dim': 64,
    'image_size': IMAGE_SIZE,
    'model.mlp_activation': 'gelu',
}
# The same shape for timm's models.
TIMM_TINY = dict(
    img_size=IMAGE_SIZE,
    patch_size=4,
    embed_dim=32,
    depth=2,
    num_heads=2,
    mlp_ratio=2.0,
    num_classes=NUM_CLASSES,
)
# transformers' ViTConfig's default layer_norm_eps (google/vit-*'s too), which its config.json says.
HF_EPSILON = {'model.layernorm_epsilon': 1e-12}
# The end of state_dicts.load's one-line error for a field without tensors.
OR_VARIANT = r', or --config.variant=checkpoint to take every field from the checkpoint$'


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
  """Every tensor random: a zero head, bias or class token (timm's and transformers' inits) would hide
  a layout bug. LayerNorm scales stay near 1."""
  generator = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for layer in module.modules():
      for name, p in layer.named_parameters(recurse=False):
        noise = 0.3 * torch.randn(p.shape, generator=generator)
        p.copy_(1 + noise if isinstance(layer, torch.nn.LayerNorm) and name == 'weight' else noise)
  return module.eval()


def transformers_vit_saved(directory, image_size: int, patch_size: int) -> torch.nn.Module:
  """A random tiny transformers ViTForImageClassification (2 blocks of width 32, an MLP of 48 units,
  NUM_CLASSES labels) saved by save_pretrained."""
  import transformers  # pylint: disable=g-import-not-at-top

  vit = randomize(
      transformers.ViTForImageClassification(
          transformers.ViTConfig(
              image_size=image_size,
              patch_size=patch_size,
              hidden_size=32,
              num_hidden_layers=2,
              num_attention_heads=2,
              intermediate_size=48,
              num_labels=NUM_CLASSES,
          )
      )
  )
  vit.save_pretrained(directory)
  return vit


def images(n: int = 5) -> np.ndarray:
  return np.random.RandomState(1).uniform(-1, 1, (n, IMAGE_SIZE, IMAGE_SIZE, 3)).astype(np.float32)


def torch_outputs(module: torch.nn.Module, inputs: np.ndarray, **kwargs) -> torch.Tensor:
  with torch.no_grad():
    return module(torch.from_numpy(inputs.transpose(0, 3, 1, 2)), **kwargs)  # PyTorch takes NCHW.


def prepared_from_checkpoint(workdir, init_from: str, image_size: int, **overrides) -> setup.Setup:
  """The demo's run set up with config.variant='checkpoint' on `init_from` at `image_size`, keeping
  its head: the model as setup builds it from the files."""
  config = helpers.load_config(
      'demo',
      {
          **helpers.UNSET_SIZES,
          'variant': 'checkpoint',
          'init_from': init_from,
          'image_size': image_size,
          'keep_head': True,
          **overrides,
      },
  )
  return setup.prepare(config, str(workdir))


def ours(init_from: str, num_classes=None, inputs=None, **overrides) -> np.ndarray:
  """Our model initialised from `init_from` through config.init_from, as a run would, on `inputs`
  (`images()`): its logits, or with `num_classes=None` its pre-logits features (pooled and
  normalised)."""
  config = helpers.load_config(
      'demo', {**MODEL, 'init_from': init_from, 'keep_head': num_classes is not None, **overrides}
  )
  model = classification.make_model(config, helpers.model_config(config), num_classes)
  params = warm_start.load_init_params(config, model)
  return np.asarray(model.apply({'params': params}, images() if inputs is None else inputs))


def timm_input(reference: torch.nn.Module, inputs: np.ndarray) -> np.ndarray:
  """Our images x = 2u - 1 of pixels u in [0, 1] as the timm model's data config normalises u: the
  same pixels through each model's own preprocessing (ours folds a checkpoint's into its patch
  embedding)."""
  cfg = reference.pretrained_cfg
  pixels = (inputs + 1) / 2
  return ((pixels - np.asarray(cfg['mean'])) / np.asarray(cfg['std'])).astype(np.float32)


def timm_saved(directory, architecture: str = 'vit_tiny_patch16_224', **kwargs) -> torch.nn.Module:
  """A random tiny timm model of `architecture` written by timm's own `save_for_hf` (model.safetensors
  and the config.json of a hub directory: its `global_pool` and `model_args`); `kwargs` replace
  TIMM_TINY's arguments."""
  reference = randomize(
      timm.create_model(architecture, pretrained=False, **{**TIMM_TINY, **kwargs})
  )
  timm.models.save_for_hf(reference, directory, safe_serialization=True)
  return reference


def assert_exported_tensors(
    exported: dict[str, np.ndarray], reference: torch.nn.Module, folded: tuple[str, ...] = ()
) -> None:
  """Our export's timm state dict `exported` names the `reference` model's tensors and holds their
  values, but those whose names start with `folded` (a checkpoint's input normalisation folded into
  them: the logits of timm's model rebuilt from them show it)."""
  theirs = {k: v.numpy() for k, v in reference.state_dict().items()}
  assert sorted(exported) == sorted(theirs)
  for name, tensor in theirs.items():
    if not name.startswith(folded):
      np.testing.assert_allclose(exported[name], tensor, atol=1e-6, err_msg=name)


def timm_rebuilt(
    params, model_config: dict, image_size: int, pp_eval: dict, directory
) -> torch.nn.Module:
  """timm's model from what export writes for `params`: timm's state dict and config.json."""
  directory.mkdir()
  tensors, config = timm_export.export(
      params, model_config, image_size, NUM_CLASSES, pp_eval=pp_eval
  )
  torch_files.write_safetensors(tensors, str(directory / torch_files.SAFETENSORS))
  (directory / 'config.json').write_text(json.dumps(config))
  for classes in (0, NUM_CLASSES + 1):  # Its head dropped, or a new one: as timm users fine-tune.
    other = timm.create_model(f'local-dir:{directory}', pretrained=True, num_classes=classes)
    assert other.num_classes == classes
  return timm.create_model(f'local-dir:{directory}', pretrained=True).eval()
