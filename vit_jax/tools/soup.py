"""Model soups (Wortsman et al. 2022): one model whose parameters are the average of several runs'
fine-tuned from the same checkpoint (a sweep's runs), or of one run's checkpoints (timm's
avg_checkpoints.py), written as a run directory that every tool reads:

  python -m vit_jax.tools.soup --out=DIR [--recipe=uniform|greedy] [--split=SPLIT]
      [--report_split=SPLIT] [--step=N|best] RUN_OR_CHECKPOINT...

Each input is a run's workdir (its checkpoint `--step`, default the latest; its Polyak average if it
kept one, low-rank adapters folded into their kernels), a sweep's root (each run under it, soups
left out) or a checkpoint's directory (W/checkpoints/N, W/best/N). `uniform` averages them all; `greedy` (the
paper's greedy soup) ranks them by their score on `--split` (default: the eval split of the first
input), starts from the best and adds each next one only if the average with it scores at least as
well: top-1 accuracy, or the mAP of a run on label sets. With `--split`, the uniform soup and its
inputs are scored too. Pick the split that decides a greedy soup out of those you report:
`--report_split` (e.g. test, beside a held-out `--split='train[98%:]'`) scores each input and the
soup on another split too, which decides nothing.

DIR gets the first input's config.json (the best input's, greedy), its dataset info, the soup's
parameters as checkpoint DIR/checkpoints/<the latest input step> and soup.json (the inputs, their
scores, which are in; the report split's scores). The tools read it with --workdir=DIR, --config.init_from=DIR fine-tunes from
it; it has no train state to resume.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import dataclasses
import json
import sys
from typing import Any, Callable, Optional, Sequence, TYPE_CHECKING

from absl import flags, logging
from etils import epath
import jax
import numpy as np

from vit_jax.runtime import cli, workdir_files
from vit_jax.tools import classifiers, soup_ingredients

if TYPE_CHECKING:  # Loaded once the flags are checked.
  from vit_jax.checkpoints import run_dir

_USAGE = (
    '--out=DIR [--recipe=uniform|greedy] [--split=SPLIT] [--report_split=SPLIT] [--step=N|best] '
    'RUN_OR_CHECKPOINT RUN_OR_CHECKPOINT...'
)
RECIPES = ('uniform', 'greedy')


@dataclasses.dataclass
class Tasted:
  """A checkpoint as the soup read it: where from, its score (None: not scored), whether it is in."""

  checkpoint_dir: str
  step: int
  parameters: str  # 'polyak' | 'raw'
  score: Optional[float] = None
  in_soup: bool = False
  with_it: Optional[float] = None  # Greedy: the score of the soup so far with it added.
  reported: Optional[float] = None  # Its score on the report split (None: none given).


def load(checkpoint_dir: str) -> 'run_dir.TrainedModel':
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top

  return run_dir.load_trained(checkpoint_dir)


def _added(total: Any, params: Any) -> Any:
  """`total` (float64 sums; None: none yet) plus `params`."""
  if total is None:
    return jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  return jax.tree.map(lambda t, x: t + np.asarray(x, np.float64), total, params)


def _mean(total: Any, count: int, like: Any) -> Any:
  """`_added`'s sums of `count` trees as their mean, each leaf in the dtype of `like`'s."""
  return jax.tree.map(lambda t, x: (t / count).astype(np.asarray(x).dtype), total, like)


@dataclasses.dataclass(frozen=True)
class Soup:
  # The first ingredient's run (greedy: the best's) with the soup's parameters.
  model: 'run_dir.TrainedModel'
  ingredients: list[Tasted]
  split: Optional[str]  # The split scored; None: none was.
  score: Optional[float]
  warnings: list[str]  # For the user: ingredients that did not start from the same parameters.
  report_split: Optional[str] = None  # The split only reported on; None: none.
  reported: Optional[float] = None  # The soup's score on it.


def make_soup(
    checkpoint_dirs: Sequence[str],
    recipe: str,
    split: Optional[str] = None,
    report_split: Optional[str] = None,
) -> Soup:
  """The `recipe` soup of `checkpoint_dirs`, each read once more for each soup a greedy one tastes.
  Scored on `split` (default: the first's eval split) when given, and always for `greedy`; each input
  and the soup also on `report_split` where given, which decides nothing."""
  first, tasted, total, score, report, warnings = None, [], None, None, None, []
  for checkpoint_dir in checkpoint_dirs:  # One at a time: a sweep of ViT-Ls need not fit in memory.
    trained = load(checkpoint_dir)
    if first is None:
      first = trained
      if recipe == 'greedy' or split is not None:
        split = split or first.config.eval_split
        score = classifiers.split_scorer(first, split)
      if report_split is not None:
        if report_split == split:
          raise ValueError(
              f'--report_split={report_split} is the split the soup is scored on (--split): '
              'report on another one, e.g. test beside --split=train[98%:]'
          )
        report = classifiers.split_scorer(first, report_split)
    soup_ingredients.check_same_model(first, trained)
    if not soup_ingredients.same_start(first, trained):
      starts = (trained.config.init_from, first.config.init_from)
      how = (
          'two runs trained from scratch (no config.init_from)'
          if not any(starts)
          else f'runs of another config.init_from ({starts[0]!r}, {starts[1]!r})'
      )
      warnings.append(
          f'{trained.checkpoint_dir} and {first.checkpoint_dir} are {how}: the average of runs '
          'that did not start from the same parameters is rarely a model'
      )
    tasted.append(
        Tasted(
            trained.checkpoint_dir,
            trained.step,
            trained.parameters,
            score(trained.params) if score else None,
            in_soup=recipe == 'uniform',
            reported=report(trained.params) if report else None,
        )
    )
    if recipe == 'uniform':
      total = _added(total, trained.params)
  if recipe == 'greedy':
    first, total = _greedy(checkpoint_dirs, tasted, score)
  params = _mean(total, sum(t.in_soup for t in tasted), first.params)
  return Soup(
      dataclasses.replace(first, params=params),
      tasted,
      split,
      score(params) if score else None,
      warnings,
      report_split,
      report(params) if report else None,
  )


def _greedy(
    checkpoint_dirs: Sequence[str], tasted: list[Tasted], score: Callable[[Any], float]
) -> tuple['run_dir.TrainedModel', Any]:
  """The greedy soup of the scored `tasted`: the best first, then in order of their scores each one
  whose addition scores at least the soup's so far (marked `in_soup`). Returns the best and the sums.
  """
  order = sorted(range(len(tasted)), key=lambda k: -tasted[k].score)  # Ties: in the given order.
  best = load(checkpoint_dirs[order[0]])
  tasted[order[0]].in_soup = True
  total, count, soup_score = _added(None, best.params), 1, tasted[order[0]].score
  for k in order[1:]:
    candidate = _added(total, load(checkpoint_dirs[k]).params)
    tasted[k].with_it = score(_mean(candidate, count + 1, best.params))
    if tasted[k].with_it >= soup_score:
      total, count, soup_score, tasted[k].in_soup = candidate, count + 1, tasted[k].with_it, True
  return best, total


def write(out: str, soup: Soup, recipe: str) -> str:
  """Writes the soup to `out` as a run directory of the tools (see the module's docstring); returns
  its checkpoint's directory."""
  from vit_jax.checkpoints import checkpoint, run_dir  # pylint: disable=g-import-not-at-top

  trained = soup.model
  epath.Path(out).mkdir(parents=True, exist_ok=True)
  config = trained.config.copy_and_resolve_references()
  # Low-rank adapters are folded into the averaged kernels: the soup is the plain model.
  # Those a run without them leaves unset stay so: set, they would differ from the runs' in report.
  config.model.update(
      {
          k: v
          for k, v in trained.model_config.items()
          if k.startswith('lora_') and config.model.get(k) is not None
      }
  )
  run_dir.write_run_info(out, config, trained.info)
  step = max(t.step for t in soup.ingredients)
  manager = checkpoint.make_manager(out, keep=1)
  checkpoint.save(manager, step, {'params': trained.params})
  manager.wait_until_finished()
  manager.close()
  record = {
      'recipe': recipe,
      'split': soup.split,
      'metric': ('map' if trained.info.multi_label else 'top1') if soup.split else None,
      'score': soup.score,
      'report_split': soup.report_split,
      'reported': soup.reported,
      'ingredients': [dataclasses.asdict(t) for t in soup.ingredients],
  }
  (epath.Path(out) / workdir_files.SOUP).write_text(json.dumps(record, indent=2))
  return str(epath.Path(out) / 'checkpoints' / str(step))


def format_report(soup: Soup, recipe: str) -> str:
  metric = 'mAP' if soup.model.info.multi_label else 'top-1'
  lines = []
  for t in soup.ingredients:
    scored = f'  {metric} {t.score:.4f}' if t.score is not None else ''
    average = ' (Polyak average)' if t.parameters == 'polyak' else ''
    added = f' (the soup with it: {t.with_it:.4f})' if t.with_it is not None else ''
    reported = f'  {soup.report_split}: {t.reported:.4f}' if t.reported is not None else ''
    lines.append(
        f'{"in " if t.in_soup else "out"}  {t.checkpoint_dir}{average}{scored}{added}{reported}'
    )
  chosen = sum(t.in_soup for t in soup.ingredients)
  summary = f'{recipe} soup of {chosen} of {len(soup.ingredients)} checkpoints'
  if soup.score is not None:
    summary += f': {metric} {soup.score:.4f} on split {soup.split!r}'
  if soup.reported is not None:
    summary += f'{"," if soup.score is not None else ":"} {metric} {soup.reported:.4f} on split '
    summary += f'{soup.report_split!r} (reported)'
  return '\n'.join([*lines, summary])


def _define_flags() -> None:
  flags.DEFINE_string('out', None, 'Directory to write the soup to (new or empty).', required=True)
  flags.DEFINE_enum('recipe', 'uniform', RECIPES, 'uniform: all of them; greedy: those that help.')
  flags.DEFINE_string('split', None, 'Split to score on (greedy: default the eval split).')
  flags.DEFINE_string(
      'report_split', None, 'Another split to score each input and the soup on, deciding nothing.'
  )
  cli.define_step_flag(' of each run given')


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  args = flags.FLAGS
  if len(argv) < 2:
    cli.fail(f'no runs or checkpoints given: use {_USAGE}')
  try:
    out = epath.Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
      raise ValueError(f'--out={args.out} is not an empty directory: name a new one')
    checkpoint_dirs = soup_ingredients.find_ingredients(argv[1:], args.step)
    with cli.out_dir(args.out):  # Before the soup: scoring a greedy one can take long.
      soup = make_soup(checkpoint_dirs, args.recipe, args.split, args.report_split)
  except ValueError as e:
    cli.fail(str(e))
  written = write(args.out, soup, args.recipe)  # Before any print: `| head` loses nothing.
  for warning in soup.warnings:
    print(f'warning: {warning}', file=sys.stderr)
  print(format_report(soup, args.recipe))
  print(f'wrote {written}: read it with --workdir={args.out}')


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
