"""A run's directory as the tools see it: the run info the loop writes beside its checkpoints, the
trained model of a workdir (a step, the Polyak average) or of an export, and the parameters that
config.init_from names. predict, export, fewshot and pictures read runs through it, never through the
training loop."""

import dataclasses
import json
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections
from etils import epath
from flax import traverse_util

from vit_jax import data, defaults, tasks
from vit_jax.checkpoints import adapting, npz_files, saved_state, state_dicts, torch_files
from vit_jax.models import lora, variants
from vit_jax.runtime import workdir_files


def write_run_info(
    workdir: str,
    config: ml_collections.ConfigDict,
    info: data.DatasetInfo,
    changes: Optional[Sequence[tuple[str, Any, Any]]] = None,
) -> None:
  """The config and dataset facts that export and inference need to rebuild the model.

  A resumed run keeps the config.json of its first start (the model the tools rebuild) and adds its
  own config as config.resume_<k>.json when it has `changes` (`config_changes` from the stored one),
  so a run's history is never overwritten. `changes=None`: a run that starts afresh (no checkpoint
  saved yet) writes its own config.json, whatever an earlier start that saved nothing wrote.
  """
  if jax.process_index() > 0:
    return
  root = epath.Path(workdir)
  if changes is None or not (root / 'config.json').exists():
    (root / 'config.json').write_text(config.to_json_best_effort(indent=2))
    (root / 'dataset_info.json').write_text(json.dumps(dataclasses.asdict(info), indent=2))
  elif changes:
    resumes = len(list(root.glob('config.resume_*.json')))
    text = config.to_json_best_effort(indent=2)
    latest = root / f'config.resume_{resumes}.json'
    # The same config started again (a requeued job): its history has it already.
    if not (resumes and latest.exists() and latest.read_text() == text):
      (root / f'config.resume_{resumes + 1}.json').write_text(text)


def resumed_config(workdir: str) -> Optional[ml_collections.ConfigDict]:
  """The config of the run that a start in `workdir`, which has saved checkpoints, resumes: its
  first start's (config.json); None where its run info does not read (the resume says why:
  train/state.check_resumable)."""
  try:
    return load_run_info(workdir)[0]
  except ValueError:
    return None


def check_trainable(workdir: str) -> None:
  """A one-line ValueError for a workdir that a run cannot train in: a model soup's, an export's."""
  if (epath.Path(workdir) / workdir_files.SOUP).exists():
    raise ValueError(
        f'--workdir={workdir} holds a model soup (vit_jax.tools.soup): its parameters without a '
        f'train state to resume; fine-tune from it with --config.init_from={workdir} and another '
        '--workdir'
    )
  if (epath.Path(workdir) / workdir_files.EXPORT).exists():
    raise ValueError(
        f'--workdir={workdir} holds an export (vit_jax.tools.export), whose config.json a run '
        f'would overwrite: train in another --workdir (--config.init_from={workdir}/model.npz '
        'fine-tunes from it)'
    )


def is_workdir(path: str) -> bool:
  """Whether `path` holds a run (its config and dataset facts), or a soup, as no export does."""
  root = epath.Path(path)
  return (
      all((root / name).exists() for name in workdir_files.RUN)
      or (root / workdir_files.SOUP).exists()
  )


def config_changes(
    old: ml_collections.ConfigDict, new: ml_collections.ConfigDict
) -> list[tuple[str, Any, Any]]:
  """(field, old value, new value) of every field that differs, dotted names, sorted."""
  flat_old, flat_new = (
      traverse_util.flatten_dict(json.loads(c.to_json_best_effort()), sep='.') for c in (old, new)
  )
  return [
      (key, flat_old.get(key), flat_new.get(key))
      for key in sorted(set(flat_old) | set(flat_new))
      if flat_old.get(key) != flat_new.get(key)
  ]


# Fields that a resumed run may change: how long it runs, how often it logs, evaluates and saves, and
# on what it runs. The train state does not depend on them, so a refused resume never asks to set
# them back (they are still among its `config_changes`, logged and stored in config.resume_<k>.json).
RESUMABLE_FIELDS = frozenset(
    {
        'total_steps',
        'num_epochs',
        'log_every_steps',
        'eval_every_steps',
        'checkpoint_every_steps',
        'keep_checkpoints',
        'best_checkpoint.metric',
        'best_checkpoint.mode',
        'best_checkpoint.patience',
        'profile_steps',
        'eval_batch_size',
        'data_workers',
        'data_shards',  # Unset, one per host: other hosts resume it (state.check_resumable warns).
        'mesh',
        'storage_timeout_s',
        'hang_timeout_s',
    }
)


def changes_to_set_back(changes: Sequence[tuple[str, Any, Any]]) -> list[tuple[str, Any, Any]]:
  """The `config_changes` that a refused resume names to set back: all but RESUMABLE_FIELDS'."""
  return [change for change in changes if change[0] not in RESUMABLE_FIELDS]


def load_run_info(workdir: str) -> tuple[ml_collections.ConfigDict, data.DatasetInfo]:
  """What `write_run_info` wrote: the run's config and dataset info."""
  files = {name: epath.Path(workdir) / name for name in workdir_files.RUN}
  for path in files.values():
    if not path.exists():
      raise ValueError(f'{path} is missing: is {workdir!r} the --workdir of a vit_jax run?')
  try:
    stored = {name: json.loads(path.read_text()) for name, path in files.items()}
  except json.JSONDecodeError as e:
    raise ValueError(
        f'the run info in {workdir} cannot be read ({e}): restore config.json and '
        'dataset_info.json from a backup, or use another --workdir'
    ) from None
  config = (
      defaults.get_config()
  )  # Today's defaults under it: runs saved before a field existed load.
  config.update(stored['config.json'])
  info = stored['dataset_info.json']
  return config, data.DatasetInfo(**{**info, 'class_names': tuple(info['class_names'])})


@dataclasses.dataclass(frozen=True)
class TrainedModel:
  config: ml_collections.ConfigDict
  # The variant's fields with config.model (variants.get_model_config).
  model_config: dict[str, Any]
  info: data.DatasetInfo
  model: nn.Module  # With features=True: the backbone, images -> pre-logits features.
  params: Any  # numpy arrays; the Polyak average if the run kept one.
  step: int
  checkpoint_dir: str  # Absolute.
  parameters: str  # 'polyak' | 'raw'
  # With low-rank adapters: the model config and parameters before lora.folded (else None).
  adapted: Optional[tuple[dict[str, Any], Any]] = None


def load_trained(
    workdir: str, step: int | str | None = None, *, features: bool = False
) -> TrainedModel:
  """The model of checkpoint `step` of a run (saved_state.find_checkpoint's: a number, 'best' or None,
  the latest; or `workdir` is a checkpoint's directory), as the run's task built it, or
  (`features=True`) its backbone, whatever the task; low-rank adapters folded into their kernels
  (lora.folded: a plain ViT of the same function); parameters a run keeps at other shapes than its
  model reads (a FlexiViT's flexi.kernel_size, posemb_grid) fitted to it once."""
  checkpoint_dir, step = saved_state.find_checkpoint(workdir, step)
  config, info = load_run_info(saved_state.workdir_of(checkpoint_dir))  # `workdir` may be a step's.
  task = tasks.get(config.task)
  adapted_params, name = saved_state.restore_params(checkpoint_dir)
  adapted_config = variants.get_model_config(config.variant, config.model.to_dict())
  model_config, params = lora.folded(adapted_config, adapted_params)
  model = (
      task.features_model(config, model_config)
      if features
      else task.make_model(config, model_config, info.num_classes)
  )
  trained = TrainedModel(
      config,
      model_config,
      info,
      model,
      params,
      step,
      checkpoint_dir,
      'polyak' if name == 'ema_params' else 'raw',
      (adapted_config, adapted_params) if lora.enabled(adapted_config) else None,
  )
  return at_size(trained, None, None) if adapting.keeps_own_shapes(config) else trained


def load_export(export_dir: str) -> tuple[dict[str, Any], Callable[[jax.Array], jax.Array]]:
  """What `vit_jax.tools.export` wrote to `export_dir`: its description (config.json) and the deserialized
  inference function, float32 images [b, H, W, 3] in [-1, 1] -> logits; no model code involved."""
  files = {name: epath.Path(export_dir) / name for name in ('config.json', workdir_files.EXPORT)}
  for path in files.values():
    if not path.is_file():
      raise ValueError(
          f'{path} is missing: is {export_dir!r} a directory written by '
          'python -m vit_jax.tools.export?'
      )
  again = 'export the run again (python -m vit_jax.tools.export), or copy the whole file'
  try:
    description = json.loads(files['config.json'].read_text())
  except ValueError as e:
    raise ValueError(f"{files['config.json']} is not JSON ({e}): {again}") from None
  if not isinstance(description, dict) or 'image_size' not in description:
    raise ValueError(
        f"{files['config.json']} is not the description an export writes (no image_size): {again}"
    )
  try:  # A copy cut short, or another file of the name: flatbuffers' own errors name no file.
    exported = jax.export.deserialize(bytearray(files[workdir_files.EXPORT].read_bytes()))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(
        f'{files[workdir_files.EXPORT]} cannot be read ({type(e).__name__}): {again}'
    ) from None
  return description, exported.call


def load_params(
    path: str, model: Optional[Mapping[str, Any]] = None, keep_head: bool = True
) -> tuple[dict[str, Any], str]:
  """Parameters to start from (`config.init_from`): an `.npz` file, a timm or Hugging Face
  transformers ViT (a .safetensors / .pth / .bin file or a model directory; these need the ViT's
  fields `model` (a resolved model config): its num_heads split the attention kernels, and the fields
  without tensors are checked against the checkpoint's, its pooling's only when `keep_head`), or a
  workdir / step directory (its Polyak average if kept). Also returns a line for the log saying what
  was loaded."""
  if torch_files.is_state_dict_path(path):
    if model is None or 'num_heads' not in model:
      raise ValueError(
          f'{path}: PyTorch-layout checkpoints are read for ViTs (timm or Hugging Face '
          'naming): for this model pass an .npz or a vit_jax workdir as --config.init_from'
      )
    params, notes = state_dicts.load(path, model, keep_head)
    return params, f'loaded {path}: ' + '; '.join(notes)
  if path.endswith('.npz') or epath.Path(path).is_file():
    return npz_files.load_npz(path), f'loaded {path}'
  checkpoint_dir, step = saved_state.find_checkpoint(path)
  params, name = saved_state.restore_params(checkpoint_dir)
  source = f'loaded {name} of step {step} from {checkpoint_dir}'
  if lora.has_adapters(params):  # Its run's scale folds them: the checkpoints/STEP dir's workdir.
    config, _ = load_run_info(saved_state.workdir_of(checkpoint_dir))
    _, params = lora.folded(
        variants.get_model_config(config.variant, config.model.to_dict()), params
    )
    source += ' (its low-rank adapters folded into their kernels)'
  return params, source


def run_model(path: str) -> tuple[str, dict[str, Any]]:
  """The variant and resolved model fields of the vit_jax run at `path` (its workdir or a checkpoint
  directory of it), its low-rank adapters folded in: the model `load_trained` and `load_params` give
  its parameters for."""
  checkpoint_dir, _ = saved_state.find_checkpoint(path)
  run, _ = load_run_info(saved_state.workdir_of(checkpoint_dir))
  return run.variant, lora.without_adapters(
      variants.get_model_config(run.variant, run.model.to_dict())
  )


def at_size(
    trained: TrainedModel, image_size: Optional[int], patch_size: Optional[int]
) -> TrainedModel:
  """`trained` as the model of `image_size` px images cut into `patch_size` px patches (None: the
  run's), its parameters fitted once on the host as config.init_from fits a checkpoint; a one-line
  ValueError for sizes its patches do not tile. Low-rank adapters stay folded into their kernels."""
  config = trained.config.copy_and_resolve_references()
  model_config, model = dict(trained.model_config), trained.model
  if patch_size is not None:
    if 'patch_size' not in model_config:
      raise ValueError(f'a patch size is for a ViT, and {config.variant} has no patches')
    model_config['patch_size'] = config.model.patch_size = patch_size
    model = model.clone(patch_size=patch_size)
  config.image_size = image_size or config.image_size
  stride = variants.stride_of(config.variant, model_config)
  if config.image_size % stride:
    raise ValueError(
        f'image_size={config.image_size} is not a multiple of the patch size {stride} (in input '
        f'pixels): use a multiple, e.g. {max(stride, config.image_size // stride * stride)}'
    )
  variants.check_tokens(config.image_size, stride, 'image_size')
  params, _ = adapting.adapt_params(
      trained.params,
      adapting.param_shapes(model, config.image_size),
      keep_head=True,
      keep_pre_logits=bool(model_config.get('representation_size')),  # The run's, if any.
      posemb_method=config.posemb_interpolation,
      patch_method=config.patch_interpolation,
  )
  return dataclasses.replace(
      trained, config=config, model_config=model_config, model=model, params=params, adapted=None
  )
