"""Each class's results of a saved run on a split: precision, recall, F1 and support, the classes it
is taken for, and the most confident mistakes:

  python -m vit_jax.tools.confusion --workdir=W [--step=N|best] [--split=SPLIT] [--out=DIR] [--top=30]
      [--threshold=0.5] [--image_size=S] [--patch_size=P]

prints the classes worst recall first (`--top` of them), then the `--top` most confident mistakes
(the example as the run's warnings name it: an image folder's path), for the run's classifier (its
Polyak average if kept) on `--split` (default: the run's eval split), its images prepared as its
evaluation prepares them (at `--image_size`, with `--patch_size` patches: the run's by default;
run_dir.at_size fits the model). With `--out`, writes every class to DIR/per_class.csv, the confusion
matrix to DIR/confusion.csv (a row a true class, a column a predicted one) and, up to 100 classes,
DIR/confusion.png, and every mistake to DIR/mistakes.csv. A softmax-trained model's calibration
(calibration.py) is reported too, its bins written to DIR/calibration.csv. A run on label sets is
reported by label_set_report.py: each class's AP, and its precision, recall and F1 where it is
predicted at a probability of at least `--threshold`.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import csv
import dataclasses
import io
from typing import Optional

from absl import flags, logging
from etils import epath
import numpy as np

from vit_jax.runtime import cli
from vit_jax.tools import calibration, label_set_report

_USAGE = (
    '--workdir=W [--step=N|best] [--split=SPLIT] [--out=DIR] [--top=30] [--threshold=0.5] '
    '[--image_size=S] [--patch_size=P]'
)
_PICTURED_CLASSES = 100  # Beyond this many classes a confusion picture is unreadable.


@dataclasses.dataclass(frozen=True)
class Predictions:
  """A classifier's predictions on every readable example of a split, in the split's order."""

  labels: np.ndarray  # int [n], the true classes; of label sets, multi-hot bool [n, classes].
  probabilities: np.ndarray  # float32 [n, classes].
  examples: list[str]  # Each example as the run's warnings name it (an image folder's path).
  class_names: tuple[str, ...]
  # float32 [n, classes] of a softmax-trained model, whose calibration is reported; else None.
  logits: Optional[np.ndarray] = None
  # Those of a sigmoid-trained one: what its classes' AP ranks (label_set_report.per_class).
  sigmoid_logits: Optional[np.ndarray] = None


def predict_split(
    workdir: str,
    step: int | str | None,
    split: Optional[str],
    image_size: Optional[int] = None,
    patch_size: Optional[int] = None,
) -> tuple[Predictions, int, str]:
  """The predictions of checkpoint `step` (default: the latest) of a run on `split` (default: its
  eval split), the step and the split; the model at `image_size` and `patch_size` (None: the run's);
  a one-line ValueError for what cannot be evaluated so."""
  # Imported here so that bad flags are answered before the model and the input pipeline load.
  from vit_jax.checkpoints import run_dir, saved_state  # pylint: disable=g-import-not-at-top
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  from vit_jax.tools import classifiers  # pylint: disable=g-import-not-at-top

  _, step_number = saved_state.find_checkpoint(workdir, step)  # Fails here on a bad step.
  config, _ = run_dir.load_run_info(workdir)
  split = split or config.eval_split
  source = sources.checked_source(config)
  sources.check_split(source, split, '--split')
  records = source.examples(split)
  # The step as asked: 'best' is best/<n>, not checkpoints/<n> (which may hold the Polyak average).
  classifier = classifiers.load_run(workdir, step, image_size, patch_size)
  config.image_size = classifier.image_size
  logits, labels, kept = classifiers.split_logits(
      config, split, classifier.logits_fn, classifier.class_names
  )
  examples = [source.describe(records.read(k)) for k in kept]
  predictions = Predictions(
      labels if labels.dtype == bool else labels.astype(np.int64),
      classifiers.probabilities(logits, classifier.loss),
      examples,
      classifier.class_names,
      *((logits, None) if classifiers.softmax_trained(classifier.loss) else (None, logits)),
  )
  return predictions, step_number, split


def confusion_matrix(predictions: Predictions) -> np.ndarray:
  """int [classes, classes]: how many examples of class i (a row) were taken for class j."""
  classes = len(predictions.class_names)
  counts = np.zeros((classes, classes), np.int64)
  np.add.at(counts, (predictions.labels, predictions.probabilities.argmax(-1)), 1)
  return counts


def per_class(confusion: np.ndarray) -> dict[str, np.ndarray]:
  """Each class's precision, recall, F1 and support (label_set_report.scores_of_counts)."""
  return label_set_report.scores_of_counts(np.diag(confusion), confusion.sum(0), confusion.sum(1))


def macro_average(metrics: dict[str, np.ndarray], confusion: np.ndarray) -> dict[str, float]:
  """The unweighted means over the classes that are in the split or predicted (scikit-learn's
  classification_report's macro average), and the accuracy."""
  seen = (confusion.sum(0) + confusion.sum(1)) > 0
  averages = {name: float(metrics[name][seen].mean()) for name in ('precision', 'recall', 'f1')}
  return {**averages, 'accuracy': float(np.trace(confusion) / confusion.sum())}


def mistakes(predictions: Predictions) -> list[tuple[str, str, str, float]]:
  """(example, true class, predicted class, its probability) of each wrong prediction, the most
  confident first."""
  predicted = predictions.probabilities.argmax(-1)
  confidence = predictions.probabilities.max(-1)
  names = predictions.class_names
  wrong = np.flatnonzero(predicted != predictions.labels)
  return [
      (
          predictions.examples[i],
          names[predictions.labels[i]],
          names[predicted[i]],
          float(confidence[i]),
      )
      for i in wrong[np.argsort(-confidence[wrong], kind='stable')]
  ]


def is_label_sets(predictions: Predictions) -> bool:
  return predictions.labels.ndim == 2


def format_report(predictions: Predictions, top: int, threshold: float = 0.5) -> str:
  """The classes worst recall first (`top` of them) with the class each is most taken for, the
  macro average and the accuracy, then the `top` most confident mistakes; of label sets,
  label_set_report's at `threshold`."""
  if is_label_sets(predictions):
    p = predictions
    return label_set_report.format_report(
        p.labels, p.probabilities, p.examples, p.class_names, top, threshold, p.sigmoid_logits
    )
  confusion = confusion_matrix(predictions)
  metrics = per_class(confusion)
  names = predictions.class_names
  width = max(12, *(len(n) for n in names))
  lines = [f'{"class":{width}}  precision  recall  f1      support  most taken for']
  others = confusion - np.diag(np.diag(confusion))
  present = np.flatnonzero(metrics['support'] > 0)
  for c in present[np.argsort(metrics['recall'][present], kind='stable')][:top]:
    taken = f'{names[others[c].argmax()]} ({others[c].max()})' if others[c].any() else '-'
    lines.append(
        f'{names[c]:{width}}  {metrics["precision"][c]:.4f}     {metrics["recall"][c]:.4f}  '
        f'{metrics["f1"][c]:.4f}  {metrics["support"][c]:7d}  {taken}'
    )
  average = macro_average(metrics, confusion)
  lines.append(
      f'{"macro avg":{width}}  {average["precision"]:.4f}     {average["recall"]:.4f}  '
      f'{average["f1"]:.4f}  {int(confusion.sum()):7d}'
  )
  lines.append(f'accuracy {average["accuracy"]:.4f} ({np.trace(confusion)} of {confusion.sum()})')
  if predictions.logits is not None:
    lines.append(calibration.summary(predictions.logits, predictions.labels))
  wrong = mistakes(predictions)
  lines.append(f'{len(wrong)} mistakes, the most confident first:' if wrong else 'no mistakes')
  lines += [
      f'  {p:.4f}  {label} taken for {guess}: {example}' for example, label, guess, p in wrong[:top]
  ]
  return '\n'.join(lines)


def _write_csv(out: str, name: str, rows: list[list]) -> str:
  """`rows` as the CSV file `name` in `out`; its path."""
  text = io.StringIO()
  csv.writer(text, lineterminator='\n').writerows(rows)
  path = epath.Path(out) / name
  path.write_text(text.getvalue())
  return str(path)


def write_files(predictions: Predictions, out: str, threshold: float = 0.5) -> list[str]:
  """per_class.csv, confusion.csv, mistakes.csv and (up to _PICTURED_CLASSES classes)
  confusion.png in `out` (of label sets: label_set_report's tables at `threshold`); returns their
  paths."""
  if is_label_sets(predictions):
    p = predictions
    written = label_set_report.tables(
        p.labels, p.probabilities, p.examples, p.class_names, threshold, p.sigmoid_logits
    )
    return [_write_csv(out, name, rows) for name, rows in written.items()]
  confusion = confusion_matrix(predictions)
  metrics = per_class(confusion)
  names = list(predictions.class_names)
  tables = {
      'per_class.csv': [
          ['class', 'precision', 'recall', 'f1', 'support'],
          *(
              [
                  name,
                  *(f'{metrics[m][c]:.6f}' for m in ('precision', 'recall', 'f1')),
                  metrics['support'][c],
              ]
              for c, name in enumerate(names)
          ),
      ],
      'confusion.csv': [
          ['true \\ predicted', *names],
          *([n, *row] for n, row in zip(names, confusion)),
      ],
      'mistakes.csv': [
          ['example', 'class', 'predicted', 'probability'],
          *([e, t, p, f'{q:.6f}'] for e, t, p, q in mistakes(predictions)),
      ],
  }
  if predictions.logits is not None:
    tables['calibration.csv'] = calibration.table(predictions.logits, predictions.labels)
  paths = [_write_csv(out, name, rows) for name, rows in tables.items()]
  if len(names) <= _PICTURED_CLASSES:
    paths.append(str(epath.Path(out) / 'confusion.png'))
    epath.Path(paths[-1]).write_bytes(_picture(confusion, names))
  return paths


def _picture(confusion: np.ndarray, names: list[str]) -> bytes:
  """The confusion matrix, each row as shares of its class's examples, as a PNG."""
  # Here, not at the top: matplotlib is loaded only to draw.
  from vit_jax.tools import figures  # pylint: disable=g-import-not-at-top

  plt = figures.plt

  shares = confusion / np.maximum(confusion.sum(1, keepdims=True), 1)
  size = 3 + 0.25 * len(names)
  figure, axes = plt.subplots(figsize=(size + 1, size))
  image = axes.imshow(shares, cmap='Blues', vmin=0, vmax=1)
  axes.set_xticks(range(len(names)), names, rotation=90, fontsize=8)
  axes.set_yticks(range(len(names)), names, fontsize=8)
  axes.set_xlabel('predicted')
  axes.set_ylabel('true class')
  figure.colorbar(image, ax=axes, label="share of the class's examples")
  figure.tight_layout()
  return figures.png(figure)


def _define_flags() -> None:
  # Defined only when run as a command: other commands' modules have flags of the same names.
  flags.DEFINE_string('workdir', None, 'Workdir of the run whose checkpoint is evaluated.')
  cli.define_step_flag()
  flags.DEFINE_string('split', None, "Split to evaluate on (default: the run's eval split).")
  flags.DEFINE_string('out', None, 'Directory for the CSV files and the picture (default: none).')
  flags.DEFINE_integer('top', 30, 'Classes and mistakes to print.')
  flags.DEFINE_float(
      'threshold', 0.5, 'Of a run on label sets: the probability at which a class is predicted.'
  )
  cli.define_size_flags('The model')
  flags.mark_flags_as_required(['workdir'])


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: use {_USAGE}')
  args = flags.FLAGS
  if args.top < 1:
    cli.fail(f'--top={args.top} must be at least 1')
  if not 0 < args.threshold < 1:
    cli.fail(f'--threshold={args.threshold} must be a probability in (0, 1), e.g. 0.5')
  try:
    from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top

    if args['threshold'].present and not run_dir.load_run_info(args.workdir)[1].multi_label:
      raise ValueError(
          f'--threshold is for a run on label sets; {args.workdir} trained on one class an image: '
          'drop --threshold'
      )
    with cli.out_dir(args.out):
      predictions, step, split = predict_split(
          args.workdir, args.step, args.split, args.image_size, args.patch_size
      )
  except ValueError as e:
    cli.fail(str(e))
  # Written before anything is printed: a reader that stops reading (`| head`) loses no file.
  written = [] if args.out is None else write_files(predictions, args.out, args.threshold)
  print(f'per-class results of step {step} of {args.workdir} on split {split!r}:')
  print(format_report(predictions, args.top, args.threshold))
  for path in written:
    print(f'wrote {path}')


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
