"""Low-rank adapters (LoRA, Hu et al. 2021) of the blocks' projections (`model.lora_*`).

An adapted layer computes dense(x) + dropout(x) A B * alpha / rank: A [inputs, rank] drawn as
PyTorch's `kaiming_uniform_(a=sqrt(5))` (U(-1/sqrt(inputs), 1/sqrt(inputs)), peft's), B [rank,
outputs] zeros, so an adapted model starts as the model it adapts. Hugging Face peft's `LoraConfig`
(r, lora_alpha, lora_dropout, target_modules) computes the same. The adapter of a layer `query` is
its sibling module `query_lora` with parameters `a` and `b`, shaped like the layer's kernel on
either side (`query`'s kernel [D, heads, D/heads]: a [D, rank], b [rank, heads, D/heads]): the
layers' own parameters keep the checkpoints' layout, and an adapter folds into its layer's kernel
(`merge`) for export, for tools that take a plain ViT, and for a run that starts from another's
adapted parameters. Training them alone (the pretrained weights frozen) is config.optim.trained's
default with adapters (param_groups.py).
"""

import dataclasses
import re
from typing import Any, Optional, Sequence, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

# model.lora_targets: the layers of every block that get adapters, and their module names.
TARGETS = {
    'query': ('query',),
    'key': ('key',),
    'value': ('value',),
    'out': ('out',),  # The attention's output projection.
    'mlp_in': ('Dense_0', 'Dense_linear'),  # The MLP's first layer (both halves of a gated one).
    'mlp_out': ('Dense_1',),
}
# model.lora_targets unset: peft's (and the LoRA paper's) choice for a ViT's attention.
DEFAULT_TARGETS = ('query', 'value')
# The model fields of the adapters, as a model without them has them.
_WITHOUT = dict(lora_rank=None, lora_alpha=None, lora_dropout=0.0, lora_targets=DEFAULT_TARGETS)
FIELDS = tuple(_WITHOUT)
SUFFIX = '_lora'
# An adapter's parameters in '/'-joined paths (param_groups.py trains them; `merge` folds them).
ADAPTER_PATH = re.compile(rf'{SUFFIX}/[ab]$')


@dataclasses.dataclass(frozen=True)
class Spec:
  """The adapters of a model: their rank, alpha (the update is scaled by alpha / rank), dropout of
  their input, and the `TARGETS` they adapt."""

  rank: int
  alpha: float
  dropout_rate: float
  targets: tuple[str, ...]

  @property
  def scale(self) -> float:
    return self.alpha / self.rank

  def adapts(self, layer: str) -> bool:
    """Whether the layer of module name `layer` (a block's `query`, `Dense_0`, ...) has an adapter."""
    return any(layer in TARGETS[target] for target in self.targets)


def spec(
    rank: Optional[int], alpha: Optional[float], dropout_rate: float, targets: Sequence[str]
) -> Optional[Spec]:
  """The `Spec` of the model fields lora_rank (None: no adapters), lora_alpha (None: the rank, a
  scale of 1), lora_dropout and lora_targets."""
  if rank is None:
    return None
  return Spec(rank, float(rank if alpha is None else alpha), dropout_rate, tuple(targets))


def check(model: dict[str, Any]) -> None:
  """One-line errors for the lora_* fields of a resolved ViT model config."""
  rank, alpha, targets = model['lora_rank'], model['lora_alpha'], model['lora_targets']
  if rank is None:
    given = [f'lora_alpha={alpha!r}'] if alpha is not None else []
    given += [f'lora_dropout={model["lora_dropout"]}'] if model['lora_dropout'] else []
    given += [f'lora_targets={targets!r}'] if tuple(targets) != DEFAULT_TARGETS else []
    if given:
      raise ValueError(
          f'model.{given[0]} shapes low-rank adapters, and model.lora_rank is unset: set '
          '--config.model.lora_rank (e.g. 8) for adapters, or unset it'
      )
    return
  if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
    raise ValueError(
        f'model.lora_rank={rank!r} must be a positive integer, e.g. 8 (unset: no adapters)'
    )
  if alpha is not None and not (isinstance(alpha, (int, float)) and 0 < alpha < float('inf')):
    raise ValueError(
        f'model.lora_alpha={alpha!r} must be a positive number, e.g. 16 (unset: lora_rank, a scale '
        'of 1)'
    )
  if not 0.0 <= model['lora_dropout'] < 1.0:
    raise ValueError(f"model.lora_dropout={model['lora_dropout']} must be in [0, 1), e.g. 0.1")
  if isinstance(targets, str) or not targets:
    raise ValueError(
        f"model.lora_targets={targets!r} must be a tuple of layer names, e.g. \"('query', "
        f"'value')\", of {', '.join(TARGETS)}"
    )
  unknown = [t for t in targets if t not in TARGETS]
  if unknown:
    raise ValueError(
        f'Unknown model.lora_targets entry {unknown[0]!r}: use some of {", ".join(TARGETS)}, as '
        "a tuple, e.g. --config.model.lora_targets=\"('query', 'value')\""
    )


class LowRankAdapter(nn.Module):
  """x -> dropout(x) A B * scale: the low-rank update of a dense layer of `features` outputs that
  contracts the `axis` axes of its input (flax's `DenseGeneral`'s)."""

  spec: Spec
  features: tuple[int, ...]
  axis: tuple[int, ...]
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    axis = tuple(sorted(a % x.ndim for a in self.axis))
    inputs = tuple(x.shape[a] for a in axis)
    in_axes = tuple(range(len(inputs)))
    init_a = nn.initializers.variance_scaling(1 / 3, 'fan_in', 'uniform', in_axes, -1)
    a = self.param('a', init_a, inputs + (self.spec.rank,), jnp.float32)
    b = self.param('b', nn.initializers.zeros, (self.spec.rank,) + self.features, jnp.float32)
    x = nn.Dropout(self.spec.dropout_rate)(x, deterministic=deterministic)
    low = jax.lax.dot_general(x, a.astype(self.dtype), ((axis, in_axes), ((), ())))
    return jnp.tensordot(low * jnp.asarray(self.spec.scale, self.dtype), b.astype(self.dtype), 1)


def adapted(
    lora: Optional[Spec],
    dense: Union[nn.Dense, nn.DenseGeneral],
    x: jnp.ndarray,
    *,
    deterministic: bool,
) -> jnp.ndarray:
  """`dense(x)`, plus its adapter's update where `lora` adapts it; call it from the compact method
  of the module that owns `dense`, so that the adapter is its sibling."""
  y = dense(x)
  if lora is None or not lora.adapts(dense.name):
    return y
  features = dense.features if isinstance(dense.features, tuple) else (dense.features,)
  axis = dense.axis if isinstance(dense, nn.DenseGeneral) else -1
  return y + LowRankAdapter(
      lora,
      features,
      axis if isinstance(axis, tuple) else (axis,),
      dense.dtype,
      name=f'{dense.name}{SUFFIX}',
  )(x, deterministic=deterministic)


def draw(shapes: dict[str, Any], seed: int) -> dict[str, np.ndarray]:
  """Fresh adapters for the '/'-joined paths of `shapes` (per-block layout) as `LowRankAdapter`
  draws them: each `a` uniform in +-1/sqrt(its inputs), each `b` zeros."""
  drawn = {}
  for i, path in enumerate(sorted(shapes)):
    shape = tuple(shapes[path].shape)
    if path.endswith('/b'):
      drawn[path] = np.zeros(shape, np.float32)
      continue
    bound = 1 / np.sqrt(np.prod(shape[:-1]))
    key = jax.random.fold_in(jax.random.key(seed), i)
    drawn[path] = np.asarray(jax.random.uniform(key, shape, jnp.float32, -bound, bound))
  return drawn


def enabled(model_config: dict[str, Any]) -> bool:
  """Whether the model of a resolved model config has adapters (a BiT has no lora fields)."""
  return model_config.get('lora_rank') is not None


def has_adapters(params: Any) -> bool:
  """Whether a parameter tree (nested, or flat with '/'-joined keys) holds adapters."""
  return any(
      ADAPTER_PATH.search(jax.tree_util.keystr(key_path, simple=True, separator='/'))
      for key_path, _ in jax.tree_util.tree_leaves_with_path(params)
  )


def merge(params: Any, scale: float) -> Any:
  """`params` with every adapter folded into its layer's kernel (kernel + scale * a b) and removed:
  the same function as a model without adapters, to float rounding. Per-block or stacked trees (a
  leading layer axis on the kernel and both factors)."""
  flat = traverse_util.flatten_dict(params, sep='/')
  for path in sorted(p for p in flat if ADAPTER_PATH.search(p) and p.endswith('/a')):
    adapter = path[: -len('/a')]
    layer = adapter[: -len(SUFFIX)]
    a, b = np.asarray(flat.pop(path), np.float32), np.asarray(flat.pop(f'{adapter}/b'), np.float32)
    kernel = flat[f'{layer}/kernel']
    stacked = np.ndim(kernel) < a.ndim + b.ndim - 2
    update = (
        np.einsum('lir,lr...->li...', a.reshape(a.shape[0], -1, a.shape[-1]), b).reshape(
            kernel.shape
        )
        if stacked
        else np.tensordot(a, b, 1)
    )
    flat[f'{layer}/kernel'] = (np.asarray(kernel, np.float32) + scale * update).astype(
        np.asarray(kernel).dtype
    )
  return traverse_util.unflatten_dict(flat, sep='/')


def model_spec(model_config: dict[str, Any]) -> Optional[Spec]:
  """The `Spec` of the adapters of the model of a resolved model config; None without."""
  if not enabled(model_config):
    return None
  return spec(
      model_config['lora_rank'],
      model_config['lora_alpha'],
      model_config['lora_dropout'],
      model_config['lora_targets'],
  )


def folded(model_config: dict[str, Any], params: Any) -> tuple[dict[str, Any], Any]:
  """(the model config without adapters, `params` with its adapters merged into their kernels): the
  same function as a plain model, for export and the tools; a model without adapters as it is."""
  if not enabled(model_config):
    return model_config, params
  return without_adapters(model_config), merge(params, model_spec(model_config).scale)


# Singular values below this fraction of the largest are float rounding of an update of lower rank.
_RANK_TOLERANCE = 1e-5


def factored(params: Any, updates: Any, adapters: Spec) -> tuple[Any, int, int]:
  """`params` (per-block, without adapters) with `updates` (a tree like it: each parameter's change,
  zeros where none) as adapters where `adapters` adapt the layer, elsewhere added to the parameters:
  the same function. A kernel's update U S V^T (SVD) becomes a = U sqrt(S), b = sqrt(S) V^T / scale
  in its top `adapters.rank` directions; a direction it lacks gets a of U's unit column / sqrt(3)
  (the per-entry scale of `LowRankAdapter`'s draw) and b zeros, so that it trains. Returns the tree
  and how many layers' updates became adapters and how many were added; a one-line ValueError for
  an update of a higher rank than adapters.rank."""
  flat = traverse_util.flatten_dict(params, sep='/')
  changes = traverse_util.flatten_dict(updates, sep='/')
  kept = added = 0
  for path, change in changes.items():
    change = np.asarray(change, np.float32)
    if not change.any():
      continue
    layer, _, kind = path.rpartition('/')
    name = layer.rpartition('/')[2]
    if (
        kind != 'kernel'
        or not layer.startswith('Transformer/encoderblock_')
        or not adapters.adapts(name)
    ):
      flat[path] = (np.asarray(flat[path], np.float32) + change).astype(
          np.asarray(flat[path]).dtype
      )
      added += layer.startswith('Transformer/') and kind == 'kernel'
      continue
    inputs = change.shape[: 2 if name == 'out' else 1]  # The attention's output contracts 2 axes.
    u, s, vt = np.linalg.svd(change.reshape(int(np.prod(inputs)), -1).astype(np.float64), False)
    rank = adapters.rank
    if len(s) > rank and s[rank] > _RANK_TOLERANCE * s[0]:
      higher = int(np.sum(s > _RANK_TOLERANCE * s[0]))
      raise ValueError(
          f'the update of {layer} has rank {higher}, beyond model.lora_rank={rank}: set '
          f'--config.model.lora_rank={higher} to keep it as adapters'
      )
    s = np.pad(s[:rank], (0, rank - min(rank, len(s))))
    u = np.pad(u[:, :rank], ((0, 0), (0, rank - min(rank, u.shape[1]))))
    vt = np.pad(vt[:rank], ((0, rank - min(rank, vt.shape[0])), (0, 0)))
    trains = s > _RANK_TOLERANCE * s[0]
    a = np.where(trains, u * np.sqrt(s), u / np.sqrt(3))
    b = np.where(trains[:, None], np.sqrt(s)[:, None] * vt / adapters.scale, 0.0)
    flat[f'{layer}{SUFFIX}/a'] = a.reshape(inputs + (rank,)).astype(np.float32)
    flat[f'{layer}{SUFFIX}/b'] = b.reshape((rank,) + change.shape[len(inputs) :]).astype(np.float32)
    kept += 1
  return traverse_util.unflatten_dict(flat, sep='/'), kept, added


def without_adapters(model_config: dict[str, Any]) -> dict[str, Any]:
  """The model config of `folded`'s plain model."""
  if not enabled(model_config):
    return model_config
  return {**model_config, **_WITHOUT}
