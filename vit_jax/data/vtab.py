"""VTAB-1k's 19 tasks (Zhai et al. 2019; the paper's Sec. 4.2) as data sources: `config.dataset =
'vtab/<task>'`, as configs/vtab.py:<task> sets it.

Each task reads a tensorflow_datasets dataset at the version VTAB used, with its label: a ClassLabel
feature of the dataset, or a label computed from its features (dSprites position and orientation bins,
CLEVR's object count and closest-object distance bins, KITTI's closest-vehicle distance bins). Splits,
versions and labels are those of google-research/task_adaptation (task_adaptation/data/*.py and
scripts/run_all_tasks.sh, which lists the 19 tasks), with its held-out parts written as fixed slices:
the split sizes it reads from the datasets' info are the published ones, so no data is needed to
build a config. VTAB-1k trains on 'train800' and selects hyper-parameters on 'val200', then trains
on 'train800val200' (the same 1000 images) and reports 'test'.
"""

import dataclasses
import functools
from typing import Any, Callable

import ml_collections
import numpy as np
import tensorflow_datasets as tfds

from vit_jax.data import images
from vit_jax.data import tfds_source

GROUPS = ('natural', 'specialized', 'structured')


@dataclasses.dataclass(frozen=True)
class Label:
  """A label computed from an example's features (as tfds' numpy parser gives them: a Sequence
  feature's values as a list), and the names of its classes. `fn` pickles: sources go to grain's
  worker processes."""

  class_names: tuple[str, ...]
  fn: Callable[[dict[str, Any]], int]


@dataclasses.dataclass(frozen=True)
class Task:
  group: str
  tfds_name: str  # name[/config]:version, as tfds.builder takes it.
  splits: dict[str, str]  # 'train800', 'val200', 'train800val200' and 'test' -> a tfds split.
  label: str | Label = 'label'  # A ClassLabel feature, or a computed label.
  # BiT's preprocessing (Kolesnikov et al. 2020), which the paper follows for VTAB: a random crop and
  # a flip, left out where they change the label (positions, orientations, counts, distances; mirrored
  # house numbers).
  crop: bool = True
  flip: bool = True
  binary_image: bool = False  # dSprites stores pixels as 0/1.


def _held_out_of_train(train_count: int, test: str = 'test') -> dict[str, str]:
  """VTAB's val200 for datasets without a validation split: the first 200 images after the part of
  'train' it trains on (`train_count`: that part's size, a fixed percentage of the split)."""
  val = f'train[{train_count}:{train_count + 200}]'
  return dict(train800='train[:800]', val200=val, train800val200=f'train[:800]+{val}', test=test)


def _validation(val: str = 'validation', test: str = 'test') -> dict[str, str]:
  return dict(
      train800='train[:800]',
      val200=f'{val}[:200]',
      train800val200=f'train[:800]+{val}[:200]',
      test=test,
  )


def _bins(thresholds: tuple[float, ...], value: np.float32) -> int:
  """The index of the bin (thresholds[i], thresholds[i + 1]] that holds `value`, as VTAB bins it."""
  return int(np.sum(np.array(thresholds, np.float32) < value)) - 1


def _coarser(feature: str, factor: float) -> Callable[[dict[str, Any]], int]:
  """dSprites: `factor` neighbouring classes of a ClassLabel feature merged into one."""
  return functools.partial(_coarser_class, feature, factor)  # A lambda would not pickle.


def _coarser_class(feature: str, factor: float, ex: dict[str, Any]) -> int:
  return int(np.float32(ex[feature]) // np.float32(factor))


_CLEVR_DISTANCES = (0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0)
_KITTI_DISTANCES = (-100.0, 8.0, 20.0, 999.0)
_KITTI_VEHICLES = 3  # objects/type below this is Car, Van or Truck.


def _xyz(values: Any) -> np.ndarray:
  """A Sequence of 3-vectors as float32 [objects, 3], also when there are none."""
  return np.asarray(values, np.float32).reshape(-1, 3)


def _object_count(ex: dict[str, Any]) -> int:
  """CLEVR: the number of objects, from 3 (class 0) to 10."""
  return len(ex['objects']['size']) - 3


def _closest_object(ex: dict[str, Any]) -> int:
  """CLEVR: the bin of the depth of the object closest to the camera."""
  return _bins(_CLEVR_DISTANCES, _xyz(ex['objects']['pixel_coords'])[:, 2].min())


def _closest_vehicle(ex: dict[str, Any]) -> int:
  """KITTI: the depth bin of the closest car, van or truck; 1000 m (the last bin) when there is none."""
  objects = ex['objects']
  depths = _xyz(objects['location'])[np.asarray(objects['type'], np.int64) < _KITTI_VEHICLES, 2]
  return _bins(_KITTI_DISTANCES, np.append(depths, np.float32(1000.0)).min())


_NATURAL, _SPECIALIZED, _STRUCTURED = GROUPS
_STILL = dict(crop=False, flip=False)  # Structured tasks: labels of positions, counts, distances.

# The task names follow the paper's (Table 9: Clevr-Count is clevr_count...). Split sizes: train
# 90% of caltech101's 3060, cifar100's 50000, svhn_cropped's 73257 and clevr's 70000 images, 80% of
# oxford_iiit_pet's 3680 and dsprites' 737280, 60% of eurosat's 27000 and resisc45's 31500.
TASKS: dict[str, Task] = {
    'caltech101': Task(_NATURAL, 'caltech101:3.*.*', _held_out_of_train(2754)),
    'cifar100': Task(_NATURAL, 'cifar100:3.*.*', _held_out_of_train(45_000)),
    'dtd': Task(_NATURAL, 'dtd:3.*.*', _validation()),
    'flowers102': Task(_NATURAL, 'oxford_flowers102:2.*.*', _validation()),
    # task_adaptation read version 3; tensorflow_datasets builds only 4.0.0 now (its release notes:
    # corrupt images fixed, head boxes added; the same 3680 train images).
    'pets': Task(_NATURAL, 'oxford_iiit_pet:4.*.*', _held_out_of_train(2944)),
    'sun397': Task(_NATURAL, 'sun397/tfds:4.*.*', _validation()),
    'svhn': Task(_NATURAL, 'svhn_cropped:3.*.*', _held_out_of_train(65_931), flip=False),
    'camelyon': Task(_SPECIALIZED, 'patch_camelyon:2.*.*', _validation()),
    'eurosat': Task(_SPECIALIZED, 'eurosat/rgb:2.*.*', _held_out_of_train(16_200, 'train[21600:]')),
    'resisc45': Task(_SPECIALIZED, 'resisc45:3.*.*', _held_out_of_train(18_900, 'train[25200:]')),
    'retinopathy': Task(
        _SPECIALIZED, 'diabetic_retinopathy_detection/btgraham-300:3.*.*', _validation()
    ),
    'clevr_count': Task(
        _STRUCTURED,
        'clevr:3.*.*',
        _held_out_of_train(63_000, 'validation'),
        Label(tuple(str(n) for n in range(3, 11)), _object_count),
        **_STILL,
    ),
    'clevr_dist': Task(
        _STRUCTURED,
        'clevr:3.*.*',
        _held_out_of_train(63_000, 'validation'),
        Label(('up to 8', '8-8.5', '8.5-9', '9-9.5', '9.5-10', 'over 10'), _closest_object),
        **_STILL,
    ),
    'dmlab': Task(_STRUCTURED, 'dmlab:2.0.1', _validation(), **_STILL),
    'dsprites_loc': Task(
        _STRUCTURED,
        'dsprites:2.*.*',
        _held_out_of_train(589_824, 'train[663552:]'),
        Label(
            tuple(f'x {2 * i}-{2 * i + 1} of 32' for i in range(16)),
            _coarser('label_x_position', 2.0),
        ),
        binary_image=True,
        **_STILL,
    ),
    'dsprites_ori': Task(
        _STRUCTURED,
        'dsprites:2.*.*',
        _held_out_of_train(589_824, 'train[663552:]'),
        Label(
            tuple(f'orientation {i} of 16' for i in range(16)),
            _coarser('label_orientation', 40 / 16),
        ),
        binary_image=True,
        **_STILL,
    ),
    'kitti_dist': Task(
        _STRUCTURED,
        'kitti:3.1.0',
        _validation(),
        Label(('up to 8 m', '8-20 m', 'over 20 m', 'no vehicle'), _closest_vehicle),
        **_STILL,
    ),
    'smallnorb_azim': Task(
        _STRUCTURED, 'smallnorb:2.*.*', _validation('test', 'test[50%:]'), 'label_azimuth', **_STILL
    ),
    'smallnorb_elev': Task(
        _STRUCTURED,
        'smallnorb:2.*.*',
        _validation('test', 'test[50%:]'),
        'label_elevation',
        **_STILL,
    ),
}


def get(name: str) -> Task:
  """The task `name`, or a one-line ValueError listing the valid names."""
  if name not in TASKS:
    raise ValueError(
        f'Unknown VTAB task {name!r}: use one of {", ".join(TASKS)} '
        '(e.g. --config=configs/vtab.py:cifar100)'
    )
  return TASKS[name]


class VtabSource(tfds_source.TfdsRecords):
  """A VTAB task's examples: its dataset's image (RGB, 0-255) and the task's int32 label."""

  def __init__(self, task: Task, builder: tfds.core.DatasetBuilder):
    super().__init__(builder)
    self._task = task
    if isinstance(task.label, Label):
      self.class_names = task.label.class_names
    else:
      feature = dict(builder.info.features).get(task.label)
      if not isinstance(feature, tfds.features.ClassLabel):
        raise ValueError(
            f'Dataset {builder.name!r} {builder.version} has no ClassLabel feature '
            f'{task.label!r}: prepare the version VTAB reads, {task.tfds_name}'
        )
      self.class_names = tuple(feature.names)

  def load(self, record: tfds_source.Example) -> dict[str, np.ndarray]:
    """The record's 'image' (`images.Encoded`; a binary image decoded, its 1s made 255) and the
    task's 'label' (int32). Raises `images.UnreadableImage` for a binary image PIL cannot decode."""
    parsed = self._deserialize(record)
    task = self._task
    image = images.Encoded(parsed['image'])
    if task.binary_image:
      image = images.pixels(image) * np.uint8(255)
    label = task.label.fn(parsed) if isinstance(task.label, Label) else parsed[task.label]
    return {'image': image, 'label': np.int32(label)}


def make_source(name: str, config: ml_collections.ConfigDict, label_feature: str) -> VtabSource:
  if label_feature != 'label':
    raise ValueError(
        f'VTAB task {name!r} has one label an image, not a label feature '
        f"{label_feature!r}: leave the evaluator's label_feature unset"
    )
  task = TASKS[name]
  return VtabSource(task, tfds_source.prepared_builder(task.tfds_name, config.data_dir))


# The entries of data.sources.SOURCES: config.dataset -> its source.
SOURCES = {f'vtab/{name}': functools.partial(make_source, name) for name in TASKS}
