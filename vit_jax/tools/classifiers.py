"""A trained classifier as the tools see it (predict, confusion, pictures, soup): a run's checkpoint or
an export, read into a function of images; an image file prepared as the run's evaluation prepared
its images; a model's score on a split with any parameters."""

import dataclasses
import functools
from typing import Any, Callable, Mapping, Sequence, TYPE_CHECKING

import jax
import ml_collections
import numpy as np

if TYPE_CHECKING:  # vit_jax.data imports its pipeline: loaded where an image is read.
  from vit_jax.checkpoints import run_dir
  from vit_jax.data import images


SPLIT_BATCH = 64  # Images a forward pass of `split_logits`: one compile for a whole split.
# config.pp_eval's default: what runs and exports made before the field prepared images with.
DEFAULT_PP_EVAL = {
    'crop': 'resize',
    'crop_fraction': 0.875,
    'antialias': False,
    'reducing_gap': 0.0,
}


@dataclasses.dataclass(frozen=True)
class Classifier:
  """A model as prediction sees it: images [b, size, size, 3] in [-1, 1] -> logits [b, classes]."""

  logits_fn: Callable[[np.ndarray], np.ndarray]
  image_size: int
  class_names: tuple[str, ...]
  loss: str = 'softmax_xent'  # How the model was trained, so how logits become probabilities.
  # The run's eval crop (config.pp_eval), so images are prepared as its evaluation prepared them.
  pp_eval: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(DEFAULT_PP_EVAL))
  # Whether its evaluation turned images upright by their EXIF orientation (`exif_upright`).
  exif_orientation: bool = False


def exif_upright(config: ml_collections.ConfigDict) -> bool:
  """Whether a run of `config` evaluated images turned upright by their EXIF orientation."""
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top

  return config.dataset in sources.EXIF_UPRIGHT


def load_run(
    workdir: str,
    step: int | str | None = None,
    image_size: int | None = None,
    patch_size: int | None = None,
) -> Classifier:
  """The classifier of checkpoint `step` (default: the latest) of a run; its Polyak average if kept;
  at `image_size` and `patch_size` (None: the run's; run_dir.at_size)."""
  # Imported here so that bad flags are answered before the model code loads.
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top

  trained = run_dir.load_trained(workdir, step)
  if image_size is not None or patch_size is not None:
    trained = run_dir.at_size(trained, image_size, patch_size)
  config = trained.config
  if config.task != 'classification':
    raise ValueError(
        f'{workdir!r} is a {config.task!r} run, which has no classifier: fine-tune it '
        '(config.init_from) and predict with that run'
    )
  model = trained.model
  apply = jax.jit(lambda params, images: model.apply({'params': params}, images, train=False))
  return Classifier(
      functools.partial(apply, trained.params),
      config.image_size,
      trained.info.class_names,
      config.loss,
      config.pp_eval.to_dict(),
      exif_upright(config),
  )


def load_export(export_dir: str) -> Classifier:
  """The classifier serialized by `vit_jax.tools.export` in `export_dir`."""
  from vit_jax.checkpoints import run_dir  # pylint: disable=g-import-not-at-top

  description, infer = run_dir.load_export(export_dir)
  task = description.get('task', 'classification')  # Exports older than the field: classifiers.
  if task != 'classification':
    raise ValueError(
        f"{export_dir!r} is the export of a {task!r} run's encoder, which has no classifier: "
        'fine-tune the run (config.init_from) and predict with that run'
    )
  if 'class_names' not in description:
    raise ValueError(
        f'{export_dir}/config.json names no class_names: export the run again (python -m '
        'vit_jax.tools.export)'
    )
  return Classifier(
      jax.jit(infer),
      description['image_size'],
      tuple(description['class_names']),
      # Exports older than a field: its default, what they prepared images with.
      description.get('loss', 'softmax_xent'),
      description.get('pp_eval', DEFAULT_PP_EVAL),
      description.get('exif_orientation', False),
  )


def _decoded(path: str, decode: Callable[[bytes], np.ndarray]) -> np.ndarray:
  """`decode` of the bytes of file `path`; raises ValueError saying why it cannot be read."""
  from vit_jax.data import folder, images  # pylint: disable=g-import-not-at-top

  try:
    data = folder.read_file(path)  # As an image folder's files are read: local or cloud storage.
  except OSError as e:
    raise ValueError(f'cannot read {path} ({e.strerror or e})') from None
  try:
    return decode(data)
  except images.UnreadableImage as e:
    raise ValueError(f'cannot decode {path}: {e}') from None


def read_image(path: str, exif_orientation: bool = False) -> np.ndarray:
  """The image in a file as uint8 [h, w, 3], turned upright by its EXIF orientation if
  `exif_orientation`; raises ValueError saying why it cannot be read."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top

  # The decoder of the input pipeline, so that an image decodes to the same pixels as in training.
  return _decoded(path, lambda data: images.rgb(images.decode(data, exif_orientation)))


def model_input(
    image: 'np.ndarray | images.Encoded',
    image_size: int,
    pp_eval: Mapping[str, Any] = DEFAULT_PP_EVAL,
) -> np.ndarray:
  """The eval preprocessing of the input pipeline (the crop of `pp_eval`, a config.pp_eval) of a
  decoded image or of an encoded one, which it decodes as the crop of the run's evaluation did:
  float32 [image_size, image_size, 3] in [-1, 1]."""
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  # Fields newer than the run or export take their defaults, which is how it prepared its images.
  pp_eval = ml_collections.ConfigDict({**DEFAULT_PP_EVAL, **pp_eval})
  return preprocess.model_input(
      preprocess.eval_preprocess(image, pp_eval=pp_eval, image_size=image_size)
  )


def probabilities(logits: np.ndarray, loss: str, temperature: float = 1.0) -> np.ndarray:
  """Softmax over classes of `logits` / `temperature` (calibration.py's), or for a model trained with
  a sigmoid loss (sigmoid_xent, asl) each class's own sigmoid."""
  if not softmax_trained(loss):
    return np.asarray(jax.nn.sigmoid(logits))
  return np.asarray(jax.nn.softmax(logits / np.float32(temperature), axis=-1))


def softmax_trained(loss: str) -> bool:
  """Whether a model of `loss` gives one softmax over its classes (what a temperature calibrates)."""
  from vit_jax.tasks import classification  # pylint: disable=g-import-not-at-top

  return loss not in classification.SIGMOID_LOSSES


def read_model_input(path: str, classifier: Classifier) -> np.ndarray:
  """`model_input` of the image in file `path` for `classifier`; raises ValueError saying why it
  cannot be read."""
  from vit_jax.data import images  # pylint: disable=g-import-not-at-top

  return _decoded(
      path,
      lambda data: model_input(
          images.Encoded(data, classifier.exif_orientation),
          classifier.image_size,
          classifier.pp_eval,
      ),
  )


def split_logits(
    config: ml_collections.ConfigDict,
    split: str,
    logits_fn: Callable[[np.ndarray], Any],
    class_names: Sequence[str],
) -> tuple[np.ndarray, np.ndarray, list[int]]:
  """One pass of `split` prepared as the run's evaluation prepares it (its images and labels as
  config says): float32 `logits_fn` of its readable examples [n, classes], their labels (int [n], or
  of label sets multi-hot bool [n, classes]) and their indices in the split (unreadable ones are
  left out, as evaluations mask them); a one-line ValueError for a split with none, or for data
  whose classes are no longer the run's `class_names` (its labels would name other classes)."""
  from vit_jax import data  # pylint: disable=g-import-not-at-top
  from vit_jax.data import preprocess  # pylint: disable=g-import-not-at-top
  from vit_jax.checkpoints import label_order  # pylint: disable=g-import-not-at-top

  now = data.class_names(config)
  if tuple(now) != tuple(class_names):
    raise ValueError(
        f'the data of the run ({config.dataset}'
        + (f' at {config.data_dir}' if config.data_dir else '')
        + f') has changed since it trained: {label_order.class_changes(class_names, now)}; its labels '
        'would name other classes: restore the data as it was'
    )
  logits, labels, kept = [], [], []
  batches = data.eval_iterator(config, split, local_batch_size=SPLIT_BATCH)
  try:
    for b, batch in enumerate(batches):
      mask = batch['mask']
      logits.append(np.asarray(logits_fn(preprocess.model_input(batch['image'])), np.float32)[mask])
      labels.append(batch['labels' if 'labels' in batch else 'label'][mask])
      kept += [b * SPLIT_BATCH + row for row in np.flatnonzero(mask)]
  finally:
    batches.close()
  if not kept:
    raise ValueError(f'split {split!r} has no readable example: nothing to evaluate')
  return np.concatenate(logits), np.concatenate(labels), kept


def split_scorer(trained: 'run_dir.TrainedModel', split: str) -> Callable[[Any], float]:
  """params -> the score of `trained`'s model with them on `split` (`split_logits`): the top-1
  accuracy, or of a run on label sets the mean AP (its eval_map). A one-line ValueError for a split
  the dataset does not have."""
  from vit_jax.data import sources  # pylint: disable=g-import-not-at-top
  from vit_jax.evaluators import average_precision  # pylint: disable=g-import-not-at-top

  config, model = trained.config, trained.model
  sources.check_split(sources.checked_source(config), split, '--split')
  apply = jax.jit(lambda params, images: model.apply({'params': params}, images, train=False))

  def score(params: Any) -> float:
    params = jax.device_put(params)  # Once, not at every batch.
    logits, labels, _ = split_logits(
        config, split, functools.partial(apply, params), trained.info.class_names
    )
    if trained.info.multi_label:
      return float(np.nanmean(average_precision.average_precisions(logits, labels)))
    return float(np.mean(logits.argmax(-1) == labels))

  return score
