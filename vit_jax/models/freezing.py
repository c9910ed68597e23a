"""Which parameters train (config.optim.frozen, config.optim.trained, low-rank adapters): a rule on a
parameter's '/'-joined path, beside the models' other rules on paths (layer_ids.py), read by the
optimizer (train/param_groups.py) and by the tools that load a trained run (the peft export).

A parameter is frozen when a regex of `frozen` matches it, or when `trained` is set and none of its
regexes does (a low-rank adapter, lora.py, trains then all the same); with adapters in the model and
`trained` unset, the adapters and the task's own layers train (`TRAINED_WITH_ADAPTERS`: a classifier's
head(s), peft's modules_to_save of a classifier; masked patch prediction's head and mask token; a
masked autoencoder's decoder), the pretrained weights they adapt stay as loaded.
"""

import re
from typing import Any, Optional

import ml_collections

from vit_jax.models import lora

# config.optim.trained's value for a model with adapters when it is unset: the task's own layers, which
# start new (the classifier's head(s); tasks/mpp.py's, tasks/mae.py's).
TRAINED_WITH_ADAPTERS = ('^head', '^mpp_head/', '^mask_token$', '^decoder/')


def trained_regexes(optim: ml_collections.ConfigDict, tree: Any) -> Optional[tuple[str, ...]]:
  """The regexes of the parameters that train beside the adapters (None: all of them): optim.trained,
  or `TRAINED_WITH_ADAPTERS` for a `tree` with adapters when it is unset."""
  if optim.trained is not None:
    return tuple(optim.trained)
  return TRAINED_WITH_ADAPTERS if lora.has_adapters(tree) else None


def is_frozen(
    optim: ml_collections.ConfigDict, trained: Optional[tuple[str, ...]], path: str
) -> bool:
  """Whether the parameter at `path` is frozen by optim.frozen or, beside the adapters, by `trained`
  (`trained_regexes`' of the tree)."""
  if any(re.search(regex, path) for regex in optim.frozen):
    return True
  return not (
      trained is None
      or lora.ADAPTER_PATH.search(path)
      or any(re.search(regex, path) for regex in trained)
  )
