"""Few-shot linear and k-NN accuracy of a saved run (the evaluators are vit_jax/evaluators/fewshot.py
and knn.py):

  python -m vit_jax.tools.fewshot --workdir=W [--step=N|best] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4]
      [--knn=10,20 [--temperature=0.07]] [--image_size=S] [--patch_size=P]

prints the accuracy per number of shots, for the run's ViT backbone (its Polyak average if kept) on
the run's unaugmented train and eval splits. A flag left out is the run's config.fewshot setting (its
splits too), so the numbers are those the run logged as fewshot_<n>shot at that step. `--knn` also
prints the weighted k-NN accuracy (DINO's) for each k, of the same features: the eval split's
examples classified by their nearest train examples; left out, the run's config.knn.ks where the run
measured them (config.knn.every_steps), at its config.knn.temperature unless `--temperature`.
`--image_size` / `--patch_size` measure the backbone at another resolution or patch size (a
FlexiViT's transfer at each patch size), its parameters fitted once as `export` fits them.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import math
from typing import Any, Optional, Sequence

from absl import flags, logging

from vit_jax.runtime import cli

_USAGE = (
    '--workdir=W [--step=N|best] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4] '
    '[--knn=10,20 [--temperature=0.07]] [--image_size=S] [--patch_size=P]'
)


def evaluate_checkpoint(
    workdir: str,
    step: int | str | None = None,
    *,
    shots: Optional[Sequence[int]] = None,
    seeds: Optional[int] = None,
    l2_reg: Optional[float] = None,
    knn: Optional[Sequence[int]] = None,
    temperature: Optional[float] = None,
    image_size: Optional[int] = None,
    patch_size: Optional[int] = None,
) -> tuple[dict[int, float], dict[str, Any]]:
  """Few-shot accuracies of checkpoint `step` (default: the latest) of a run, and the settings used:
  the step, and shots / seeds / l2_reg, each the run's config.fewshot one where None. With k-NN (`knn`
  or, where None, the run's config.knn.ks if it measured them) the settings also hold 'knn': the k-NN
  accuracy of each k at `temperature` (None: the run's), of the same features; the backbone at
  `image_size` and `patch_size` (None: the run's; run_dir.at_size)."""
  # Imported here so that bad flags are answered before TensorFlow (the input pipeline's) loads.
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import features, fewshot, knn as knn_lib  # pylint: disable=g-import-not-at-top

  trained = run_dir.load_trained(workdir, step, features=True)
  if image_size is not None or patch_size is not None:
    trained = run_dir.at_size(trained, image_size, patch_size)
  config = trained.config
  if trained.info.multi_label:
    raise ValueError(
        f'config.label_feature={config.label_feature!r} of the run is a set of classes an image: '
        'few-shot and k-NN classify into one class an image'
    )
  mesh = sharding.make_mesh((('data', -1),))
  # Any batch that the devices divide: this machine may have other devices than the run had.
  devices = sharding.num_batch_shards(mesh)
  config.eval_batch_size = -(-config.eval_batch_size // devices) * devices
  run = config.fewshot
  used = {
      'step': trained.step,
      'image_size': config.image_size,
      'shots': tuple(run.shots if shots is None else shots),
      'seeds': run.seeds if seeds is None else seeds,
      'l2_reg': run.l2_reg if l2_reg is None else l2_reg,
  }
  if knn is None:
    knn = config.knn.ks if config.knn.every_steps is not None else ()
  if not knn and temperature is not None:
    raise ValueError(
        '--temperature weighs the k-NN votes, and no k-NN is measured (the run measured none): add '
        '--knn=10,20, or drop --temperature'
    )
  # (train, eval) splits of each evaluation, the run's where its settings leave them unset.
  splits = {
      name: (
          settings.train_split or config.train_split,
          settings.eval_split or config.eval_split,
      )
      for name, settings in (('fewshot', run), ('knn', config.knn))
  }
  read = splits['fewshot'] + (splits['knn'] if knn else ())
  split_features = features.SplitFeatures(config, read, model=trained.model, mesh=mesh)
  params = jax.device_put(trained.params, sharding.replicated(mesh))
  try:
    of_split = {split: split_features(params, split) for split in dict.fromkeys(read)}
  finally:
    split_features.close()
  train, test = (of_split[split] for split in splits['fewshot'])
  accuracies = fewshot.linear_fewshot_accuracy(
      *train, *test, shots=used['shots'], seeds=used['seeds'], l2_reg=used['l2_reg']
  )
  if knn:
    used['temperature'] = config.knn.temperature if temperature is None else temperature
    train, test = (of_split[split] for split in splits['knn'])
    used['knn'] = knn_lib.knn_accuracy(
        *train, *test, ks=tuple(knn), temperature=used['temperature'], mesh=mesh
    )
  return accuracies, used


def format_table(accuracies: dict[int, float], what: str = 'shots') -> str:
  return '\n'.join([f'{what:>5}  accuracy', *(f'{n:5d}  {a:.4f}' for n, a in accuracies.items())])


def _parse_counts(flag: str, values: list[str], example: str) -> tuple[int, ...]:
  try:
    counts = tuple(int(v) for v in values)
  except ValueError:
    counts = ()
  if not counts or min(counts) < 1:
    cli.fail(f'--{flag}={",".join(values)} must be positive integers, e.g. --{flag}={example}')
  return counts


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run whose checkpoint is evaluated.')
  cli.define_step_flag()
  flags.DEFINE_list('shots', None, "Train images per class, e.g. 1,5,10,25 (default: the run's).")
  flags.DEFINE_integer(
      'seeds', None, 'Random choices of the shots to average over (default: the ' "run's)."
  )
  flags.DEFINE_float(
      'l2_reg', None, "L2 regularisation of the least-squares fit (default: the run's)."
  )
  flags.DEFINE_list(
      'knn', None, "Also the weighted k-NN accuracy for these k, e.g. 10,20 (default: the run's)."
  )
  flags.DEFINE_float(
      'temperature', None, "The k-NN votes' temperature (default: the run's, DINO's 0.07)."
  )
  cli.define_size_flags('The backbone')
  flags.mark_flags_as_required(['workdir'])


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  shots = None if args.shots is None else _parse_counts('shots', args.shots, '1,5,10,25')
  knn = None if args.knn is None else _parse_counts('knn', args.knn, '10,20')
  if args.seeds is not None and args.seeds < 1:
    cli.fail(f'--seeds={args.seeds} must be at least 1')
  if args.l2_reg is not None and not 0 < args.l2_reg < math.inf:
    cli.fail(f'--l2_reg={args.l2_reg} must be positive and finite, e.g. --l2_reg=4')
  if args.temperature is not None and not 0 < args.temperature < math.inf:
    cli.fail(
        f'--temperature={args.temperature} must be positive and finite, e.g. --temperature=0.07'
    )
  try:
    accuracies, used = evaluate_checkpoint(
        args.workdir,
        args.step,
        shots=shots,
        seeds=args.seeds,
        l2_reg=args.l2_reg,
        knn=knn,
        temperature=args.temperature,
        image_size=args.image_size,
        patch_size=args.patch_size,
    )
  except ValueError as e:
    cli.fail(str(e))
  print(
      f'few-shot linear accuracy of step {used["step"]} of {args.workdir} at {used["image_size"]} px '
      f'(mean of {used["seeds"]} seeds, l2_reg={used["l2_reg"]:g}):'
  )
  print(format_table(accuracies))
  if 'knn' in used:
    print(f'weighted k-NN accuracy (temperature {used["temperature"]:g}):')
    print(format_table(used['knn'], 'k'))


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
