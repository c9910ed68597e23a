"""Exports a run's parameters for serving and for other code.

  python -m vit_jax.tools.export --workdir=W --out=DIR [--step=N|best] [--overwrite]
      [--image_size=S] [--patch_size=P]

writes, from checkpoint N of W (default: the latest), using the Polyak average when the run kept one,
at the run's image size and patch size or at `--image_size` / `--patch_size` (a FlexiViT deployed at
the patch size its speed allows; a ViT served at a higher resolution): the position embeddings
resized and the patch embedding resampled once, as config.init_from fits a checkpoint, by the run's
config.posemb_interpolation and config.patch_interpolation, so every file below is a plain model of
that size:
  DIR/model.npz        the parameters under flat '/'-joined keys: the original ViT layout, which the
                       original code and, for a plain ViT, timm's ViT `load_pretrained` read (it
                       leaves registers, layer scale, qk-norm... at their initial values: timm/
                       below holds them); for a BiT the published BiT layout, which timm's resnetv2
                       `load_pretrained` reads;
  DIR/model.jaxexport  a serialized `jax.export` of the inference function, float32 images
                       [batch, H, W, 3] in [-1, 1] -> float32 logits [batch, classes], batch symbolic,
                       parameters inside; it needs only jax:
                         jax.export.deserialize(open(path, 'rb').read()).call(images);
  DIR/config.json      the model, resolution, classes and where the parameters came from;
  DIR/timm/            model.safetensors in timm's naming and the config.json that tells timm the
                       architecture: timm.create_model('local-dir:DIR/timm', pretrained=True) (not
                       written for what timm's ViT cannot hold, a BiT included: config.json's "timm"
                       says why);
  DIR/peft/            for a run with low-rank adapters that started from a timm or transformers
                       checkpoint: its adapters (and the head it trained) as Hugging Face peft's, over
                       that checkpoint: PeftModel.from_pretrained(timm.create_model(BASE,
                       pretrained=True, num_classes=N), 'DIR/peft'), or transformers'
                       AutoModelForImageClassification.from_pretrained(BASE, num_labels=N)
                       .load_adapter('DIR/peft') (config.json's "peft" says why where not written).
Of a self-supervised run (config.task mpp or mae) the files hold its encoder alone, as the hub's MAE
weights do: model.jaxexport returns its pooled features [batch, hidden_size], timm/ has num_classes 0,
and the task's own layers (MPP's head, MAE's decoder) are left out (the workdir keeps them).
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
from absl import flags, logging
from etils import epath

from vit_jax.runtime import cli, workdir_files
from vit_jax.models import variants
from vit_jax.tools import classifiers

# The artefact carries one lowering per platform, so a model trained on TPU also serves on CPU or GPU.
PLATFORMS = ('cpu', 'cuda', 'tpu')


def serialize_inference(model: Any, params: Any, image_size: int) -> bytes:
  """`jax.export` of images -> logits with `params` as constants, for any batch size.

  The attention is XLA's whatever the run trained with: `attention='dot_product_attention'` traced on a
  GPU is cuDNN's kernel, which no other platform of the artefact could run (same parameters)."""
  (batch,) = jax.export.symbolic_shape('b')
  if 'attention' in {field.name for field in dataclasses.fields(model)}:
    model = model.clone(attention='xla')

  def infer(images):
    return model.apply({'params': params}, images, train=False)

  images = jax.ShapeDtypeStruct((batch, image_size, image_size, 3), jnp.float32)
  return jax.export.export(jax.jit(infer), platforms=PLATFORMS)(images).serialize()


def _encoder_of(trained: Any) -> Any:
  """A self-supervised run's backbone (images -> pooled features), its task's own layers dropped (from
  its adapted parameters too: peft's adapters are the encoder's)."""
  from vit_jax import tasks  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import adapting  # pylint: disable=g-import-not-at-top

  config = trained.config
  adapted = trained.adapted and (
      trained.adapted[0],
      adapting.without_self_supervision(trained.adapted[1]),
  )
  return dataclasses.replace(
      trained,
      model=tasks.get(config.task).features_model(config, trained.model_config),
      params=adapting.without_self_supervision(trained.params),
      adapted=adapted,
  )


def export(
    workdir: str,
    out: str,
    step: int | str | None = None,
    *,
    overwrite: bool = False,
    image_size: int | None = None,
    patch_size: int | None = None,
) -> dict[str, Any]:
  """Writes the files for checkpoint `step` (default: latest) of `workdir`, at `image_size` and
  `patch_size` (None: the run's); returns config.json. Refuses an `out` that already holds a file
  it writes unless `overwrite`."""
  # Imported here so that bad flags are answered before TensorFlow (the input pipeline's) loads.
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import npz_files, peft_export, timm_export, torch_files  # pylint: disable=g-import-not-at-top

  trained = run_dir.load_trained(workdir, step)
  classifier = trained.config.task == 'classification'
  if (
      not classifier
  ):  # A self-supervised run's product is its encoder, as the hub's MAE weights are.
    trained = _encoder_of(trained)
  adapters = trained.adapted is not None
  if image_size is not None or patch_size is not None:
    trained = run_dir.at_size(trained, image_size, patch_size)
  cli.make_out_dir(out)
  # Checked after make_out_dir, which answers a cloud path that does not answer within a time limit.
  if run_dir.is_workdir(out):  # Its config.json is the run's: --overwrite would replace it.
    raise ValueError(f"--out={out!r} holds a run's workdir: export to another directory")
  written = (
      'model.npz',
      workdir_files.EXPORT,
      'config.json',
      f'timm/{torch_files.SAFETENSORS}',
      'timm/config.json',
      f'peft/{peft_export.WEIGHTS}',
      f'peft/{peft_export.CONFIG}',
  )  # Every file an export writes, or removes where this one has none of its kind.
  existing = [name for name in written if (epath.Path(out) / name).exists()]
  if existing and not overwrite:
    raise ValueError(
        f'--out={out!r} already holds files an export writes ({", ".join(existing)}): pass '
        '--overwrite to replace them, or another --out'
    )
  config, info = trained.config, trained.info

  out_dir = epath.Path(out)
  family = variants.FAMILIES[variants.family(config.variant)]
  npz_files.save_npz(family.to_npz(trained.params), str(out_dir / 'model.npz'))
  (out_dir / workdir_files.EXPORT).write_bytes(
      serialize_inference(trained.model, trained.params, config.image_size)
  )
  model = trained.model_config
  try:
    variants.require_vit(config.variant, "timm's VisionTransformer")
    # timm's transforms from this config prepare images as the run's evaluation did.
    timm_tensors, timm_config = timm_export.export(
        trained.params,
        model,
        config.image_size,
        info.num_classes if classifier else None,
        list(info.class_names) if classifier else None,
        pp_eval=config.pp_eval.to_dict(),
    )
  except ValueError as e:
    timm_files = f'not written: {e}'
  else:
    timm_dir = out_dir / 'timm'
    timm_dir.mkdir(exist_ok=True)
    torch_files.write_safetensors(timm_tensors, str(timm_dir / torch_files.SAFETENSORS))
    (timm_dir / 'config.json').write_text(json.dumps(timm_config, indent=2))
    timm_files = 'timm/model.safetensors, timm/config.json'
  if trained.adapted:
    peft_files = _write_peft(trained, out_dir)
  elif adapters:
    peft_files = "not written: the adapters are of the run's size; the files hold them folded in"
  else:
    peft_files = 'not written: no low-rank adapters'
  # What an earlier export wrote there (--overwrite) would pass for this run's.
  for written, folder, names in (
      (timm_files, 'timm', (torch_files.SAFETENSORS, 'config.json')),
      (peft_files, 'peft', (peft_export.WEIGHTS, peft_export.CONFIG)),
  ):
    if not written.startswith(f'{folder}/'):
      for name in names:
        (out_dir / folder / name).unlink(missing_ok=True)
  description = {
      'variant': config.variant,
      'model': model,
      'dtype': config.dtype,
      'image_size': config.image_size,
      'pp_eval': config.pp_eval.to_dict(),  # How to prepare an image: see vit_jax.tools.classifiers.model_input.
      # Whether an image is turned upright by its EXIF orientation first, as evaluation turned it.
      'exif_orientation': classifiers.exif_upright(config),
      'task': config.task,
      'num_classes': info.num_classes if classifier else 0,
      'loss': config.loss,  # softmax_xent, sigmoid_xent or asl: how logits become probabilities.
      'class_names': list(info.class_names) if classifier else [],
      'parameters': trained.parameters,
      'step': trained.step,
      'checkpoint': trained.checkpoint_dir,
      'input': 'float32 images [batch, image_size, image_size, 3] in [-1, 1]',
      'output': (
          'float32 logits [batch, num_classes]'
          if classifier
          else f"float32 features [batch, {model['hidden_size']}] (the encoder's, pooled)"
      ),
      'jax_export_platforms': list(PLATFORMS),
      'timm': timm_files,
      **({'peft': peft_files} if adapters else {}),  # Said only of a run with adapters.
  }
  (out_dir / 'config.json').write_text(json.dumps(description, indent=2))
  return description


def _write_peft(trained: Any, out_dir: epath.Path) -> str:
  """Writes peft's adapter files of the adapted run `trained` (run_dir.TrainedModel) to out_dir/peft;
  returns what config.json says of them (why not, where they are not written)."""
  from vit_jax.checkpoints import peft_export, torch_files  # pylint: disable=g-import-not-at-top
  from vit_jax.models import freezing, lora  # pylint: disable=g-import-not-at-top

  model_config, params = trained.adapted
  optim = trained.config.optim
  trained_regexes = freezing.trained_regexes(optim, params)
  trains = lambda path: not freezing.is_frozen(optim, trained_regexes, path)
  try:
    base = peft_export.base(trained.config.init_from)
    tensors, adapter_config = peft_export.export(
        params, lora.model_spec(model_config), trains, trained.model_config, base
    )
    peft_export.check_unfolded(base, params, model_config, trains)
  except (ValueError, OSError) as e:
    return f'not written: {e}'
  peft_dir = out_dir / 'peft'
  peft_dir.mkdir(exist_ok=True)
  torch_files.write_safetensors(tensors, str(peft_dir / peft_export.WEIGHTS))
  (peft_dir / peft_export.CONFIG).write_text(json.dumps(adapter_config, indent=2))
  return f'peft/{peft_export.WEIGHTS}, peft/{peft_export.CONFIG} over {base.name}'


_USAGE = '--workdir=W --out=DIR [--step=N|best] [--overwrite] [--image_size=S] [--patch_size=P]'


def main(argv: list[str]) -> None:
  # The one line below is the output: orbax's and jax's INFO and WARNING lines (checkpoint reading,
  # backends) are not the user's business here.
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  workdir, out = args.workdir, args.out
  try:
    description = export(
        workdir,
        out,
        args.step,
        overwrite=args.overwrite,
        image_size=args.image_size,
        patch_size=args.patch_size,
    )
  except ValueError as e:
    cli.fail(str(e))
  unwritten = [
      f'; {name}/ {description[name]}'
      for name in ('timm', 'peft')
      if description.get(name, '').startswith('not written')
  ]
  print(
      f'exported step {description["step"]} ({description["parameters"]} parameters) of '
      f'{workdir} to {out}' + ''.join(unwritten)
  )


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run to export.')
  flags.DEFINE_string(
      'out', None, 'Directory to write model.npz, model.jaxexport, config.json, timm/.'
  )
  cli.define_step_flag()
  flags.DEFINE_bool('overwrite', False, 'Replace the export that --out already holds.')
  cli.define_size_flags('The exported model')
  flags.mark_flags_as_required(['workdir', 'out'])


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
