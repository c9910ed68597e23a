"""What `config.init_from` gives a run: the model config.variant='checkpoint' reads from it
(`fill_from_checkpoint`) and the parameters to start from, fitted to the run's model
(`load_init_params`)."""

import dataclasses
import functools
import os
import re
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from etils import epath
from flax import traverse_util

from vit_jax.checkpoints import adapting, hub, input_normalization, label_order, run_dir
from vit_jax.checkpoints import saved_state, state_dicts, torch_files
from vit_jax.models import freezing, inits, lora, pooling, variants, vit_variants
from vit_jax.models.vit import has_class_token
from vit_jax.runtime import paths


def _missing_init_from(given: str, fix: str) -> str:
  """The one-line error for a `config.init_from` that does not exist: the path as given and as
  resolved, and `fix`, what to pass (a relative path's fix ends in how to pass it)."""
  resolved = paths.absolute(given)
  if given == resolved:
    return f'config.init_from={given!r} does not exist: {fix}'
  return (
      f'config.init_from={given!r} does not exist: a relative path is taken from the current '
      f'directory, here {os.getcwd()!r}, so it is {resolved!r}; {fix} by an absolute path, e.g. '
      '--config.init_from=/abs/path/to/it, or run from the directory it is relative to'
  )


def _run_architecture(path: str, model_fields: Sequence[str]) -> tuple[str, dict[str, Any]]:
  """The variant of the run at `path` and the fields among `model_fields` (config.model's) that fix
  the function its parameters compute: not how it was trained (variants.RESUMABLE_FIELDS: dropout,
  kernels, scanning), nor its adapters (a fine-tune chooses its own)."""
  variant, model = run_dir.run_model(path)
  if 'classifier' in model:  # A ViT's class token, where unset, is its pooling's.
    model['class_token'] = has_class_token(model['classifier'], model['class_token'])
  resumable = variants.RESUMABLE_FIELDS | set(lora.FIELDS)
  return variant, {f: v for f, v in model.items() if f in model_fields and f not in resumable}


def fill_from_checkpoint(config: ml_collections.ConfigDict) -> None:
  """config.variant='checkpoint' (vit_variants.FROM_CHECKPOINT): sets config.model's unset fields to
  the architecture of config.init_from, a timm, transformers or OpenCLIP ViT or an .npz ViT
  (state_dicts.fill), or a vit_jax run (its variant too, any family's), so that the config, and the
  run's config.json that export and predict rebuild the model from, hold it. Other variants are left
  as they are."""
  if config.variant != vit_variants.FROM_CHECKPOINT:
    return
  init_from = hub.local(config.init_from) if config.init_from else None
  if init_from and not paths.is_url(init_from) and not os.path.exists(init_from):
    raise ValueError(
        _missing_init_from(
            config.init_from,
            "download the checkpoint there (the config file's docstring says from where) or pass it",
        )
    )
  if init_from:
    paths.check_reachable(init_from, config.storage_timeout_s, 'config.init_from')
  if init_from and (torch_files.is_state_dict_path(init_from) or init_from.endswith('.npz')):
    filled = state_dicts.fill(config.model.to_dict(), init_from, config.keep_head)
    if config.flexi.kernel_size is not None:
      _flexi_patch_size(config, filled.pop('patch_size', None))
  elif init_from and (
      saved_state.is_step_dir(init_from) or (epath.Path(init_from) / 'config.json').exists()
  ):  # A run's workdir or checkpoint.
    config.variant, fixed = _run_architecture(init_from, list(config.model))
    filled = state_dicts.fill_fields(config.model.to_dict(), fixed, config.keep_head)
  else:
    given = f'not {config.init_from!r}' if config.init_from else 'unset'
    raise ValueError(
        f"config.variant='{vit_variants.FROM_CHECKPOINT}' builds the model of config.init_from, "
        'which must be a timm, Hugging Face transformers or OpenCLIP ViT (a .safetensors / .pth / '
        '.bin file, or a directory holding model.safetensors), an .npz ViT (original or '
        f'big_vision layout) or the workdir of a vit_jax run, {given}: set --config.init_from, or '
        'name a variant (e.g. --config.variant=ViT-B_16)'
    )
  if not config.keep_pre_logits:  # Dropped, as the paper's fine-tuning drops it.
    filled['representation_size'] = None
  for field, value in filled.items():
    if config.model[field] is None and value is not None:
      config.model[field] = value
  logging.info(
      'Model from %s: %s',
      config.init_from,
      ', '.join(
          [f'variant={config.variant}'] + [f'{k}={v}' for k, v in filled.items() if v is not None]
      ),
  )


def fill_from_resumed_run(
    config: ml_collections.ConfigDict, stored: Optional[ml_collections.ConfigDict]
) -> bool:
  """A resume of a variant='checkpoint' run from config.init_from: its variant, model fields and MAE
  targets as its first start filled them from that checkpoint (`stored`, its config:
  run_dir.resumed_config), which is not read again: it may be gone, or on a hub out of reach (a
  requeue on another node). The same unset fields as `fill_from_checkpoint`'s; fields the command
  sets are the resume's changes (state.py). Returns whether it filled them."""
  if (
      config.variant != vit_variants.FROM_CHECKPOINT
      or stored is None
      or stored.init_from != config.init_from
  ):
    return False
  config.variant = stored.variant
  for field, value in stored.model.items():
    if field in config.model and config.model[field] is None:
      config.model[field] = value
  if config.mae.target_mean is None:
    config.mae.target_mean, config.mae.target_std = stored.mae.target_mean, stored.mae.target_std
  logging.info("Model from the run's first start (config.init_from=%s)", config.init_from)
  return True


def fill_mae_targets(config: ml_collections.ConfigDict) -> None:
  """config.task='mae' continuing the pretraining of a checkpoint with MAE's pixel decoder: its
  targets are the pixels that decoder predicts, normalised as the checkpoint's images were
  (config.mae.target_mean / target_std, where unset), and config.mae.norm_pix_loss must be its."""
  path = hub.local(config.init_from) if config.init_from else None
  if config.task != 'mae' or not path or paths.is_url(path) or not os.path.exists(path):
    return
  if not torch_files.is_state_dict_path(path):
    return
  decoder = state_dicts.pixel_decoder(path)
  if decoder is None:
    return
  said = decoder['norm_pix_loss']
  if said is not None and said != config.mae.norm_pix_loss:
    raise ValueError(
        f'config.init_from={config.init_from!r}: its MAE decoder predicts pixels '
        f"{'standardised per patch' if said else 'as they are'} (norm_pix_loss={said}), and "
        f'config.mae.norm_pix_loss={config.mae.norm_pix_loss}: set '
        f'--config.mae.norm_pix_loss={said} to continue its pretraining'
    )
  if decoder['normalization'] is not None and config.mae.target_mean is None:
    config.mae.target_mean, config.mae.target_std = (tuple(v) for v in decoder['normalization'])
    logging.info(
        'MAE targets: the pixels normalised as %s normalised its images (mean %s, std %s), which '
        'its decoder predicts',
        config.init_from,
        config.mae.target_mean,
        config.mae.target_std,
    )


def _train_fresh_layers(config: ml_collections.ConfigDict, loaded: Any, params: Any) -> None:
  """Parameters the run starts afresh (config.init_from has none, or a new head) that would stay at
  their random or zero start, frozen: beside low-rank adapters with config.optim.trained unset, their
  layers train too (set here, once, as the adapters' own head does: a new MAP head's); frozen by
  config.optim.frozen or .trained, a one-line ValueError. A new normalisation layer starts as the
  identity's scale and bias: frozen, as peft freezes a base's (a LoRA run's new fc_norm), it
  computes a defined function."""
  had = traverse_util.flatten_dict(loaded, sep='/')
  flat = traverse_util.flatten_dict(params, sep='/')
  new_heads = () if config.keep_head else ('head/', 'head_dist/')
  trained = freezing.trained_regexes(config.optim, params)
  frozen = []
  for path in sorted(flat):
    *layers, name = path.split('/')
    normalisation = name in ('scale', 'bias') and bool(layers) and 'norm' in layers[-1].lower()
    fresh = path not in had or path.startswith(new_heads)
    if fresh and not normalisation and freezing.is_frozen(config.optim, trained, path):
      frozen.append(path)
  if not frozen:
    return
  adapters_alone = config.optim.trained is None and not any(
      re.search(regex, path) for regex in config.optim.frozen for path in frozen
  )
  if adapters_alone and lora.has_adapters(params):
    layers = sorted({f'^{path.split("/")[0]}/' for path in frozen})
    config.optim.trained = (*freezing.TRAINED_WITH_ADAPTERS, *layers)
    logging.info(
        'Low-rank adapters: %s train beside them, as the head does (config.init_from has none)',
        ', '.join(layers),
    )
    return
  sincos = (
      ', or --config.mae.decoder_posemb=sincos2d_mae for fixed ones'
      if frozen[0].startswith('decoder/') and 'posembed_input' in frozen[0]
      else ''
  )
  raise ValueError(
      f'{frozen[0]} starts afresh (config.init_from={config.init_from!r} has none to keep), and '
      f'config.optim.frozen={tuple(config.optim.frozen)!r} / trained={config.optim.trained!r} '
      f'freeze it at that start: let it train by narrowing them{sincos}'
  )


def _flexi_patch_size(config: ml_collections.ConfigDict, kernel: Optional[int]) -> None:
  """A FlexiViT file's kernel is the one flexi.kernel_size keeps (its 32 px), not the patches its
  evaluation cuts: model.patch_size, which the file cannot say, is the user's."""
  sizes = sorted(config.flexi.patch_sizes)  # Empty: flexi.check refuses the kept kernel.
  if config.model.patch_size is None and sizes:
    raise ValueError(
        f"config.flexi.kernel_size keeps config.init_from's {kernel} px patch kernel, which is not "
        'the patch size the run evaluates: set it, one of config.flexi.patch_sizes, e.g. '
        f'--config.model.patch_size={sizes[len(sizes) // 2]}'
    )


def load_init_params(
    config: ml_collections.ConfigDict,
    model: nn.Module,
    image_size: Optional[int] = None,
    class_names: Optional[Sequence[str]] = None,
) -> Any:
  """The parameters of `config.init_from`, with head and position embeddings fitted to `model` at
  `image_size` (None: config.image_size); a kept head's outputs in the order of the dataset's
  `class_names` where the checkpoint names the same classes in another (label_order.py)."""
  image_size = image_size or config.image_size
  init_from = hub.local(config.init_from)
  paths.check_reachable(init_from, config.storage_timeout_s, 'config.init_from')
  # A missing workdir: a config file's relative init_from (configs/demo_finetune.py's) read from
  # another directory would otherwise be "has no checkpoints/ directory", naming neither the field
  # nor the directory it was read from. Missing files say so when loaded, with a download hint.
  names_a_file = init_from.endswith('.npz') or torch_files.is_state_dict_path(init_from)
  if not paths.is_url(init_from) and not names_a_file and not os.path.exists(init_from):
    raise ValueError(_missing_init_from(config.init_from, 'pass the workdir of a vit_jax run'))
  # The module's fields: a ViT's are checked against a timm or transformers checkpoint (a BiT has no
  # heads: its checkpoints are .npz files and workdirs, which need none).
  fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
  loaded, source = run_dir.load_params(init_from, fields, config.keep_head)
  params, notes = adapting.adapt_params(
      loaded,
      adapting.param_shapes(model, image_size),
      keep_head=config.keep_head,
      keep_pre_logits=config.keep_pre_logits,
      posemb_method=config.posemb_interpolation,
      patch_method=config.patch_interpolation,
      seed=config.seed,
      # As the model draws its own from scratch (its width does not depend on the tokens).
      draw_map_head=lambda: pooling.map_head(model).init(
          jax.random.key(config.seed), jnp.zeros((1, 1, model.hidden_size))
      )['params'],
      # A run from scratch with this seed: a self-supervised task's layers (MAE's decoder) from it.
      draw_params=lambda: jax.device_get(
          jax.jit(functools.partial(inits.fresh_params, model, image_size))(
              jax.random.key(config.seed)
          )
      ),
  )
  # A ViT's (state_dicts.load folded its normalisation in) with its patch embedding resampled.
  if torch_files.is_state_dict_path(init_from) and (
      loaded['embedding']['kernel'].shape != params['embedding']['kernel'].shape
  ):
    params = input_normalization.refold(loaded, params, state_dicts.normalization(init_from))
  _train_fresh_layers(config, loaded, params)
  logging.info('Initialising from %s: %s', config.init_from, '; '.join([source, *notes]))
  if config.keep_head and class_names is not None and not paths.is_url(init_from):
    params = label_order.aligned(params, label_order.checkpoint_classes(init_from), class_names)
  return params
