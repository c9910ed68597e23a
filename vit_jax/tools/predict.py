"""Top-k labels of image files, from a run's checkpoint or from an exported model.

  python -m vit_jax.tools.predict --workdir=W [--step=N|best] [--top_k=5] IMAGES_OR_FOLDERS...
  python -m vit_jax.tools.predict --export=DIR [--top_k=5] IMAGES_OR_FOLDERS...

Of a model trained with a sigmoid loss (label sets), `--threshold=P` or `--thresholds=thresholds.csv`
(each class's, from the confusion tool) prints the set of classes at or above it instead of the top k.

Folders are searched recursively for the image folders' files (.jpg/.jpeg/.png/.bmp/.gif/.webp, in any
case); a file named on the command line is read whatever its name. Each image (any size; greyscale and
RGBA become RGB; decoded as in training, whatever its extension says) gets the eval preprocessing of
training, so the model sees what evaluation showed it; `--image_size` / `--patch_size` run the model at
another resolution or (a FlexiViT's) patch size, its position embeddings and patch kernels fitted as
`config.init_from` fits them. `--export=DIR` runs `DIR/model.jaxexport` (from
`vit_jax.tools.export`) and needs no model code. A file that cannot be read or decoded is reported on stderr
in one line and skipped. Exit status: 0 if at least one image was predicted, 1 if none, 2 on bad input.
"""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()

import itertools
import math
import os
import sys
from typing import Iterable, Iterator, Sequence

from etils import epath
import numpy as np
from absl import flags, logging

from vit_jax.runtime import cli
from vit_jax.tools import classifiers, label_set_report

BATCH_SIZE = 64

_USAGE = (
    '--workdir=W [--step=N|best] [--image_size=S] [--patch_size=P] (or --export=DIR) [--top_k=5 [--temperature=T] | --threshold=P | '
    '--thresholds=CSV] IMAGES_OR_FOLDERS...'
)

Prediction = tuple[str, list[tuple[str, float]]]  # (path, [(label, probability), ...] best first)


def find_images(inputs: Sequence[str]) -> list[str]:
  """The files named in `inputs`, with each folder replaced by the images under it as an image folder
  lists them (folder.image_files: sorted, symbolic links followed, hidden entries such as
  .ipynb_checkpoints and macOS's ._x.png left out); a one-line ValueError for a folder it cannot
  list."""
  from vit_jax.data import folder  # pylint: disable=g-import-not-at-top

  paths = []
  for path in inputs:
    if not epath.Path(path).is_dir():
      paths.append(path)  # Whatever its name: a missing or unreadable file is reported when read.
      continue
    paths += [os.path.join(path, name) for name in folder.image_files(path)]
  return paths


def _top_k(probs: np.ndarray, class_names: Sequence[str], k: int) -> list[tuple[str, float]]:
  order = np.argsort(-probs, kind='stable')[:k]
  return [(class_names[i], float(probs[i])) for i in order]


def _readable(
    paths: Sequence[str], classifier: classifiers.Classifier
) -> Iterator[tuple[str, np.ndarray]]:
  """(path, model input) of each file that reads; the others are reported on stderr and skipped."""
  for path in paths:
    try:
      yield path, classifiers.read_model_input(path, classifier)
    except ValueError as e:
      print(f'skipped: {e}', file=sys.stderr)


def _chunks(items: Iterable, size: int) -> Iterator[list]:
  items = iter(items)
  while chunk := list(itertools.islice(items, size)):
    yield chunk


def predict(
    paths: Sequence[str],
    classifier: classifiers.Classifier,
    *,
    top_k: int = 5,
    thresholds: np.ndarray | None = None,
    temperature: float = 1.0,
    batch_size: int = BATCH_SIZE,
) -> list[Prediction]:
  """(path, top-k (label, probability)) for each readable image, in order, or with `thresholds`
  [classes] the classes at or above theirs; the others are reported on stderr, one line each, and
  skipped. A softmax-trained model's probabilities are of its logits / `temperature`."""
  # Every batch is padded to one size, so the model compiles once.
  batch_size = max(1, min(batch_size, len(paths)))
  results = []
  for chunk in _chunks(_readable(paths, classifier), batch_size):
    images = np.zeros((batch_size, classifier.image_size, classifier.image_size, 3), np.float32)
    images[: len(chunk)] = [image for _, image in chunk]
    probs = classifiers.probabilities(
        np.asarray(classifier.logits_fn(images), np.float32), classifier.loss, temperature
    )
    results += [
        (
            path,
            _top_k(p, classifier.class_names, top_k)
            if thresholds is None
            else [
                (classifier.class_names[c], float(p[c]))
                for c in label_set_report.chosen(p, thresholds)
            ],
        )
        for (path, _), p in zip(chunk, probs)
    ]
  return results


def format_prediction(path: str, top: list[tuple[str, float]]) -> str:
  """The image's path, then a line of each (label, probability), or `no class` where none is over
  its threshold."""
  return '\n'.join([path, *([f'  {prob:.4f}  {label}' for label, prob in top] or ['  no class'])])


def _define_flags() -> None:
  # Defined only when run as a command: the library functions are imported beside other commands
  # whose flags have the same names (the tests import them all).
  flags.DEFINE_string('workdir', None, 'Workdir of the run to predict with.')
  cli.define_step_flag(' of --workdir')
  flags.DEFINE_string(
      'export', None, 'Directory written by vit_jax.tools.export, instead of --workdir.'
  )
  cli.define_size_flags('The model of --workdir')
  flags.DEFINE_integer('top_k', 5, 'Labels to print per image.')
  flags.DEFINE_float(
      'threshold',
      None,
      'Of a sigmoid-trained model: print the classes of at least this probability.',
  )
  flags.DEFINE_string(
      'thresholds', None, "Of a sigmoid-trained model: a thresholds.csv of each class's threshold."
  )
  flags.DEFINE_float(
      'temperature',
      1.0,
      'Of a softmax-trained model: divide the logits by it (the confusion tool fits it).',
  )


def main(argv: list[str]) -> None:
  logging.set_verbosity(logging.ERROR)  # stderr is for the files that could not be predicted.
  args = flags.FLAGS
  if (args.workdir is None) == (args.export is None):
    cli.fail(f'pass exactly one of --workdir and --export: use {_USAGE}')
  if args.export is not None and args.step is not None:
    cli.fail('--step chooses a checkpoint of --workdir; an export has one model: drop --step')
  if args.export is not None and (args.image_size is not None or args.patch_size is not None):
    cli.fail(
        'an export runs at the size it was exported at: export at that size '
        '(vit_jax.tools.export --image_size/--patch_size), or predict with --workdir'
    )
  if args.top_k < 1:
    cli.fail(f'--top_k={args.top_k} must be at least 1')
  if not 0 < args.temperature < math.inf:
    cli.fail(
        f'--temperature={args.temperature} must be positive and finite, e.g. 1.5 (1: the logits as '
        'they are)'
    )
  if len(argv) < 2:
    cli.fail(f'no images given: use {_USAGE}')
  try:
    classifier = (
        classifiers.load_export(args.export)
        if args.export is not None
        else classifiers.load_run(args.workdir, args.step, args.image_size, args.patch_size)
    )
  except ValueError as e:
    cli.fail(str(e))
  try:
    paths = find_images(argv[1:])
  except ValueError as e:
    cli.fail(str(e))
  if not paths:  # Empty folders, or folders of other files: "none of 0 predicted" would not say so.
    from vit_jax.data.images import IMAGE_EXTENSIONS  # pylint: disable=g-import-not-at-top

    cli.fail(
        f'the inputs hold no image files (folders are searched for '
        f'{"/".join(IMAGE_EXTENSIONS)} files; inputs: {" ".join(argv[1:])}): pass image files, '
        'or folders that hold them',
        status=1,
    )
  try:
    thresholds = label_set_report.prediction_thresholds(
        classifier.loss, classifier.class_names, args.threshold, args.thresholds
    )
  except ValueError as e:
    cli.fail(str(e))
  if thresholds is not None and args['top_k'].present:
    cli.fail('--threshold / --thresholds print the classes above them, not the top k: drop --top_k')
  if args['temperature'].present and not classifiers.softmax_trained(classifier.loss):
    cli.fail(
        f'--temperature calibrates a softmax, and this model was trained with loss '
        f'{classifier.loss!r} (a sigmoid a class): drop --temperature'
    )
  results = predict(
      paths, classifier, top_k=args.top_k, thresholds=thresholds, temperature=args.temperature
  )
  for path, top in results:
    print(format_prediction(path, top))
  if not results:
    print(
        f'error: none of {len(paths)} image files could be predicted (inputs: {" ".join(argv[1:])})',
        file=sys.stderr,
    )
    sys.exit(1)


if __name__ == '__main__':
  _define_flags()
  cli.run(main, flags_parser=cli.flags_parser(_USAGE))
