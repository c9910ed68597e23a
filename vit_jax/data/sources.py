"""Where examples come from: config.dataset -> its Source (the bundled digits, an image folder, a
Hugging Face dataset on disk: Parquet, Arrow, WebDataset shards or image files, a
tensorflow_datasets dataset, a VTAB-1k task), and what a run reads of it before any batch: the data
config's validation, split sizes, class names and listed labels. pipeline.py and eval_pipeline.py
make the batches.
"""

import dataclasses
import functools
import os
from typing import Any, Callable, Protocol, Sequence

import ml_collections
import numpy as np

from vit_jax.data import digits
from vit_jax.data import folder
from vit_jax.data import hf_source
from vit_jax.data import order
from vit_jax.data import preprocess
from vit_jax.data import tfds_source
from vit_jax.data import vtab
from vit_jax.data import zip_members
from vit_jax.runtime import cpuinfo, paths


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """What `get_info` reads of the config's splits; `num_examples` counts any other split."""

  num_classes: int
  num_train: int  # Examples in config.train_split, all hosts together.
  num_eval: int  # Examples in config.eval_split, all hosts together.
  class_names: tuple[str, ...]
  multi_label: bool = False  # config.label_feature is a set of classes an image ('labels').


class Source(Protocol):
  """Where examples come from: the digits, an image folder, a Hugging Face or tfds dataset. It must
  pickle: grain's worker processes read through it."""

  class_names: tuple[str, ...]

  def examples(
      self, split: str, shard: int = 0, num_shards: int = 1, with_shards: Sequence[int] = ()
  ) -> order.Records:
    """Shard `shard` of `num_shards` of `split`, nothing decoded yet: its examples shard, shard +
    num_shards, shard + 2 num_shards, ... (strided: each shard holds every class; the features
    evaluators put the hosts' rows back in the split's order by it).
    `with_shards`: the other shards the same process reads (a source that copies the rows it reads,
    a Hugging Face Parquet split, copies theirs at once)."""

  def load(self, record: Any) -> dict[str, np.ndarray]:
    """The record's 'image', an `images.Encoded` file that the preprocessing's crop decodes (or
    uint8 pixels [h, w, 3], or greyscale [h, w, 1]), and its int32 'label' (or, for a label set,
    'labels': multi-hot bool [classes]); `images.UnreadableImage` where it cannot be read."""

  def describe(self, record: Any) -> str:
    """The record as a warning names it (a path)."""


def _digits(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  if label_feature != 'label':
    raise ValueError(
        f"Dataset 'digits' has no ClassLabel (or Sequence of ClassLabel) feature "
        f"{label_feature!r}: set --config.label_feature (or the evaluator's "
        "label_feature) to 'label'"
    )
  if config.data_dir and _holds_data(config.data_dir):
    raise ValueError(
        f"config.data_dir={config.data_dir!r} is not read: config.dataset='digits' is the bundled "
        'digits; train on it with --config.dataset=folder (class folders) or huggingface (a Hugging '
        'Face dataset), or unset config.data_dir'
    )
  return digits.DigitsSource()


def _holds_data(data_dir: str) -> bool:
  """Whether `data_dir` names data (a hub dataset, cloud storage, a file, a folder not empty): what a
  user meant to train on, set on a config of the digits (the demo's) without its dataset. An empty
  folder (a tfds data_dir the digits leave as it is) holds none."""
  if data_dir.startswith('hf-hub:') or paths.is_url(data_dir) or os.path.isfile(data_dir):
    return True
  return os.path.isdir(data_dir) and any(os.scandir(data_dir))


def _folder(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  if label_feature != 'label':
    raise ValueError(
        f'An image folder has one class an image, not a label feature {label_feature!r}: '
        'read it from a tensorflow_datasets dataset that has it'
    )
  if not config.data_dir:
    raise ValueError(
        "config.dataset='folder' needs config.data_dir: set it to a root with "
        f'{config.train_split}/ and {config.eval_split}/ sub-folders of class folders'
    )
  return _listed_folder(config.data_dir, config.train_split)


@functools.lru_cache(maxsize=8)
def _listed_folder(root: str, train_split: str) -> folder.FolderSource:
  """One FolderSource per folder for a run: it lists each split once (it keeps the listing), where the
  run's info, its train stream and every evaluation would each list the folder again; 1,000 class
  folders on cloud storage take seconds to list. `get_info` starts a run, and lists afresh."""
  return folder.FolderSource(root, train_split)


def _huggingface(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  if not config.data_dir:
    raise ValueError(
        "config.dataset='huggingface' needs config.data_dir: set it to a dataset on the hub "
        "('hf-hub:<org>/<name>'), one downloaded with `hf download --repo-type dataset NAME "
        '--local-dir DIR`, or one written by save_to_disk'
    )
  return _listed_huggingface(config.data_dir, config.train_split, label_feature)


@functools.lru_cache(maxsize=8)
def _listed_huggingface(root: str, train_split: str, label_feature: str) -> Source:
  """One source per dataset, split and label for a run: its labels are read once."""
  return hf_source.HuggingFaceSource(root, train_split, label_feature)


def _tfds(config: ml_collections.ConfigDict, label_feature: str) -> Source:
  return tfds_source.TfdsSource(
      tfds_source.prepared_builder(config.dataset, config.data_dir), label_feature
  )


# config.dataset -> its Source, reading the given label feature; any other name is a
# tensorflow_datasets name. 'vtab/<task>': VTAB-1k's tasks (vtab.py).
SOURCES: dict[str, Callable[[ml_collections.ConfigDict, str], Source]] = {
    'digits': _digits,
    'folder': _folder,
    'huggingface': _huggingface,
    **vtab.SOURCES,
}


# The config.datasets whose images decode turned upright by their EXIF orientation (hf_source.py's,
# as `datasets` decodes them; the others' as PIL opens them): the tools decode an image file as the
# run's evaluation did.
EXIF_UPRIGHT = frozenset({'huggingface'})
# The most grain worker processes a core (config.data_workers): one a core keeps every core busy.
WORKERS_A_CORE = 4


def make_source(config: ml_collections.ConfigDict, label_feature: str | None = None) -> Source:
  """The source named by config.dataset, its labels read from `label_feature` (a tfds feature;
  None: the run's); raises a one-line ValueError that says what to fix."""
  if config.dataset.startswith('vtab/') and config.dataset not in SOURCES:
    raise ValueError(f'Unknown VTAB task {config.dataset!r}: use one of {", ".join(vtab.SOURCES)}')
  return SOURCES.get(config.dataset, _tfds)(config, label_feature or config.label_feature)


def checked_source(config: ml_collections.ConfigDict, label_feature: str | None = None) -> Source:
  """The source of a validated data config, reading `label_feature` (None: the run's)."""
  if config.image_size < 1:
    raise ValueError(f'config.image_size={config.image_size} must be a positive number of pixels')
  # Each worker is a process of its own interpreter and buffers: a thousand on 2 cores spawned for
  # minutes, then ran out of memory.
  most = WORKERS_A_CORE * cpuinfo.usable_cores()
  if config.data_workers is not None and not 0 <= config.data_workers <= most:
    raise ValueError(
        f'config.data_workers={config.data_workers} must be from 0 worker processes (threads of '
        f'this process only) to {most} ({WORKERS_A_CORE} for each of the {cpuinfo.usable_cores()} '
        'cores this process may use), or unset for one a core'
    )
  preprocess.check_pp(config.pp)
  preprocess.check_pp_eval(config.pp_eval)
  return make_source(config, label_feature)


def check_split(source: Any, split: str, flag: str) -> None:
  """A one-line ValueError naming `flag`, the one to set, for a split that `source` does not have."""
  if hasattr(source, 'check_split'):
    source.check_split(split, flag)


def get_info(config: ml_collections.ConfigDict) -> DatasetInfo:
  """Sizes and class names of config.label_feature; validates the data config. A run starts here: an
  image folder is listed anew, a zip archive read anew (a notebook may have added images since the
  last run)."""
  _listed_folder.cache_clear()
  _listed_huggingface.cache_clear()
  zip_members.forget()
  source = checked_source(config)
  for field in ('train_split', 'eval_split'):
    check_split(source, config[field], f'--config.{field}')
  return DatasetInfo(
      num_classes=len(source.class_names),
      num_train=source.examples(config.train_split).num_records,
      num_eval=source.examples(config.eval_split).num_records,
      class_names=source.class_names,
      multi_label=getattr(source, 'multi_label', False),
  )


def class_names(
    config: ml_collections.ConfigDict, label_feature: str | None = None
) -> tuple[str, ...]:
  """The classes of config.dataset's `label_feature` (None: the run's), in label order; validates the
  data config."""
  return checked_source(config, label_feature).class_names


def is_label_set(config: ml_collections.ConfigDict, label_feature: str) -> bool:
  """Whether config.dataset's `label_feature` is a set of classes an image (a Sequence of ClassLabel,
  e.g. imagenet2012_real's real_label), not one class an image."""
  return getattr(checked_source(config, label_feature), 'multi_label', False)


def num_examples(
    config: ml_collections.ConfigDict, split: str, label_feature: str | None = None
) -> int:
  """Examples in `split` (e.g. 'test', or a tfds slice such as 'train[90%:]'), all hosts together;
  validates the data config, the label feature (None: the run's) and the split name."""
  return checked_source(config, label_feature).examples(split).num_records


def listed_labels(config: ml_collections.ConfigDict, split: str) -> np.ndarray | None:
  """The label (of config.label_feature) of every example of `split` where the source lists them
  without decoding the examples (an image folder's class folders, the digits); None where that would
  mean reading the split (tfds)."""
  source = checked_source(config)
  if isinstance(source, hf_source.HuggingFaceSource):
    return source.split_labels(split)
  if not isinstance(source, (folder.FolderSource, digits.DigitsSource)):
    return None
  records = source.examples(split)
  return np.array([records.read(k)[1] for k in range(records.num_records)], np.int32)


def num_workers(config: ml_collections.ConfigDict, source: Source) -> int:
  """grain worker processes: config.data_workers, or unset, one a core for sources that decode files
  (threads of this process would share one interpreter lock for the per-example Python and numpy)
  and none for the digits (8x8 arrays in memory: a worker's start-up would cost more than it saves).
  """
  if config.data_workers is not None:
    return config.data_workers
  return 0 if isinstance(source, digits.DigitsSource) else cpuinfo.usable_cores()


def labels_of(example: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """An example's 'label' (int32), or its 'labels' (a label set: multi-hot bool [classes])."""
  return {k: example[k] for k in ('label', 'labels') if k in example}


def label_spec(source: Source) -> dict[str, tuple[tuple[int, ...], type[np.generic]]]:
  """The shape and dtype of an example's labels from `source` (`labels_of`)."""
  if getattr(source, 'multi_label', False):
    return {'labels': ((len(source.class_names),), np.bool_)}
  return {'label': ((), np.int32)}
