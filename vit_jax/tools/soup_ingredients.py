"""Which checkpoints a model soup (soup.py) averages, and whether they may be: the checkpoint
directories its inputs name, checked to be of one model and warned of where they did not start from
the same parameters."""

from typing import Optional, Sequence, TYPE_CHECKING

from etils import epath
from flax import traverse_util
import numpy as np

from vit_jax.runtime import workdir_files

if TYPE_CHECKING:  # Loaded once the flags are checked.
  from vit_jax.checkpoints import run_dir


def find_ingredients(inputs: Sequence[str], step: Optional[str]) -> list[str]:
  """The checkpoint directories `inputs` name (see the module's docstring), in order; a one-line
  ValueError for an input that names none, or a checkpoint named twice."""
  from vit_jax.checkpoints import saved_state  # pylint: disable=g-import-not-at-top
  from vit_jax.runtime import paths  # pylint: disable=g-import-not-at-top
  from vit_jax.tools import runs  # pylint: disable=g-import-not-at-top

  found = {}  # checkpoint directory -> the input that named it.
  for given in inputs:
    if saved_state.is_step_dir(given):
      if step is not None:
        raise ValueError(
            f'--step={step} picks a checkpoint of each run, and {given} is a checkpoint: drop '
            '--step, or pass its run'
        )
      named = [saved_state.find_checkpoint(given)[0]]
    else:  # A soup found under a sweep's root (--out inside it) is not one of its runs.
      named = [
          saved_state.find_checkpoint(str(run), step)[0]
          for _, run in runs.find_runs([given])
          if run == epath.Path(paths.absolute(given)) or not (run / workdir_files.SOUP).exists()
      ]
    for checkpoint_dir in named:
      if checkpoint_dir in found:
        raise ValueError(
            f'{checkpoint_dir} is named twice ({found[checkpoint_dir]!r} and {given!r}): name each '
            'checkpoint once'
        )
      found[checkpoint_dir] = given
  if len(found) < 2:
    raise ValueError(
        f'a soup averages two or more checkpoints, and {" ".join(inputs)} name one: pass runs, '
        "a sweep's root, or checkpoint directories such as W/checkpoints/1000"
    )
  return list(found)


def check_same_model(first: 'run_dir.TrainedModel', other: 'run_dir.TrainedModel') -> None:
  """A one-line ValueError unless `other` computes the function of `first` with parameters of the same
  shapes: an average of two other models is neither."""
  from vit_jax.models import variants  # pylint: disable=g-import-not-at-top

  a, b = first.config, other.config
  differences = [
      (field, a[field], b[field])
      for field in ('task', 'variant', 'image_size', 'loss')
      if a[field] != b[field]
  ]
  differences += variants.function_changes(
      (a.variant, first.model_config), (b.variant, other.model_config)
  )
  if first.info.class_names != other.info.class_names:
    differences.append(('class names', first.info.class_names[:5], other.info.class_names[:5]))
  shapes = [
      {name: np.shape(x) for name, x in traverse_util.flatten_dict(t.params, sep='/').items()}
      for t in (first, other)
  ]
  differences += [
      (f'parameter {name}', shapes[0].get(name, 'none'), shapes[1].get(name, 'none'))
      for name in sorted(shapes[0].keys() | shapes[1].keys())
      if shapes[0].get(name) != shapes[1].get(name)
  ]
  if differences:
    field, there, here = differences[0]
    raise ValueError(
        f'{other.checkpoint_dir} is not the model of {first.checkpoint_dir} ({field}: {here!r} '
        f'here, {there!r} there): a soup averages checkpoints of one model, fine-tuned from the '
        'same parameters'
    )


def same_start(first: 'run_dir.TrainedModel', other: 'run_dir.TrainedModel') -> bool:
  """Whether two checkpoints are of one run, or of runs fine-tuned from the same config.init_from."""
  from vit_jax.checkpoints import saved_state  # pylint: disable=g-import-not-at-top

  runs = {saved_state.workdir_of(t.checkpoint_dir) for t in (first, other)}
  return (
      len(runs) == 1
      or bool(first.config.init_from)
      and (first.config.init_from == other.config.init_from)
  )
