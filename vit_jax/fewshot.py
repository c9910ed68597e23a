"""Few-shot linear accuracy of a saved run (the evaluator is vit_jax/evaluators/fewshot.py):

  python -m vit_jax.fewshot --workdir=W [--step=N] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4]

prints the accuracy per number of shots, for the run's ViT backbone (its Polyak average if kept) on
the run's unaugmented train and eval splits.
"""
if __name__ == '__main__':  # Before anything allocates or loads jax: see vit_jax/startup.py.
  from vit_jax import startup  # pylint: disable=g-import-not-at-top
  startup.prepare_process()

from typing import Optional, Sequence

from absl import flags, logging

from vit_jax import cli, defaults

_DEFAULTS = defaults.get_config().fewshot
_USAGE = '--workdir=W [--step=N] [--shots=1,5,10,25] [--seeds=3] [--l2_reg=4]'


def evaluate_checkpoint(workdir: str, step: Optional[int] = None, *,
                        shots: Sequence[int] = _DEFAULTS.shots, seeds: int = _DEFAULTS.seeds,
                        l2_reg: float = _DEFAULTS.l2_reg) -> tuple[dict[int, float], int]:
  """Few-shot accuracies of checkpoint `step` (default: the latest) of a run, and that step."""
  # Imported here so that bad flags are answered before TensorFlow (the input pipeline's) loads.
  import jax  # pylint: disable=g-import-not-at-top
  from vit_jax import run_dir, sharding  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import fewshot  # pylint: disable=g-import-not-at-top
  trained = run_dir.load_trained(workdir, step, features=True)
  config = trained.config
  mesh = sharding.make_mesh((('data', -1),))
  # Any batch that the devices divide: this machine may have other devices than the run had.
  devices = sharding.num_batch_shards(mesh)
  config.eval_batch_size = -(-config.eval_batch_size // devices) * devices
  evaluator = fewshot.FewShotEvaluator('fewshot', None, config=config, model=trained.model,
                                       mesh=mesh, num_classes=trained.info.num_classes,
                                       shots=shots, seeds=seeds, l2_reg=l2_reg)
  params = jax.device_put(trained.params, sharding.replicated(mesh))
  return evaluator.accuracies(params), trained.step


def format_table(accuracies: dict[int, float]) -> str:
  return '\n'.join(['shots  accuracy', *(f'{n:5d}  {a:.4f}' for n, a in accuracies.items())])


def _parse_shots(values: list[str]) -> tuple[int, ...]:
  try:
    shots = tuple(int(v) for v in values)
  except ValueError:
    shots = ()
  if not shots or min(shots) < 1:
    cli.fail(f'--shots={",".join(values)} must be positive integers, e.g. --shots=1,5,10,25')
  return shots


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run whose checkpoint is evaluated.')
  flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')
  flags.DEFINE_list('shots', [str(s) for s in _DEFAULTS.shots], 'Train images per class, e.g. 1,5,10,25.')
  flags.DEFINE_integer('seeds', _DEFAULTS.seeds, 'Random choices of the shots to average over.')
  flags.DEFINE_float('l2_reg', _DEFAULTS.l2_reg, 'L2 regularisation of the least-squares fit.')
  flags.mark_flags_as_required(['workdir'])


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  shots = _parse_shots(args.shots)
  if args.seeds < 1:
    cli.fail(f'--seeds={args.seeds} must be at least 1')
  if args.l2_reg <= 0:
    cli.fail(f'--l2_reg={args.l2_reg} must be positive, e.g. --l2_reg={_DEFAULTS.l2_reg:g}')
  try:
    accuracies, step = evaluate_checkpoint(args.workdir, args.step, shots=shots, seeds=args.seeds,
                                           l2_reg=args.l2_reg)
  except ValueError as e:
    cli.fail(str(e))
  print(f'few-shot linear accuracy of step {step} of {args.workdir} (mean of {args.seeds} seeds, '
        f'l2_reg={args.l2_reg:g}):')
  print(format_table(accuracies))


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
