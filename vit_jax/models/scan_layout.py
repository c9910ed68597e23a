"""The two layouts of the encoder blocks' parameters: per block (the checkpoints) and stacked (the scan).

A scanned encoder reads its blocks stacked (`Transformer/encoderblock/...`, layer axis first); the
checkpoints and `init` have them per block (`Transformer/encoderblock_{i}/...`). These functions convert
any tree that holds blocks: parameters, an optimizer state, a whole train state.
"""

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

BLOCK = (
    'encoderblock'  # Blocks are `encoderblock_{i}` in the checkpoints, `encoderblock` when stacked.
)
# A path inside the stacked blocks: their arrays have a leading layer axis that sharding keeps whole.
STACKED_BLOCKS = rf'(^|/){BLOCK}/'


def _holds(node: Any, key: str) -> bool:
  return isinstance(node, Mapping) and key in node


def stack_blocks(tree: Any, num_layers: int) -> Any:
  """Per-block layout -> scan layout, wherever `tree` holds encoder blocks; the rest is unchanged.

  In every mapping with `encoderblock_0 .. encoderblock_{num_layers-1}`, they become one `encoderblock`
  whose arrays have a leading layer axis. `tree` may be parameters, an optimizer state (its moments are
  parameter-shaped) or a whole train state, or their shapes under `jax.eval_shape`; a tree already
  stacked is returned as it is. Under `jax.jit`, `out_shardings` places the result.
  """
  names = [f'{BLOCK}_{i}' for i in range(num_layers)]

  def stack(node):
    if not _holds(node, names[0]):
      return node
    found = sorted(k for k in node if k.startswith(f'{BLOCK}_'))
    if found != sorted(names):
      raise ValueError(f'expected encoder blocks {names[0]}..{names[-1]}, got {", ".join(found)}')
    rest = {k: v for k, v in node.items() if k not in names}
    return {**rest, BLOCK: jax.tree.map(lambda *xs: jnp.stack(xs), *[node[k] for k in names])}

  return jax.tree.map(stack, tree, is_leaf=lambda node: _holds(node, names[0]))


def unstack_blocks(tree: Any) -> Any:
  """Scan layout -> per-block layout (the inverse of `stack_blocks`); per-block trees are unchanged."""

  def unstack(node):
    if not _holds(node, BLOCK):
      return node
    rest = {k: v for k, v in node.items() if k != BLOCK}
    num_layers = jax.tree.leaves(node[BLOCK])[0].shape[0]
    return {
        **rest,
        **{
            f'{BLOCK}_{i}': jax.tree.map(lambda x, i=i: x[i], node[BLOCK])
            for i in range(num_layers)
        },
    }

  return jax.tree.map(unstack, tree, is_leaf=lambda node: _holds(node, BLOCK))


def scanned(model: nn.Module) -> bool:
  """Whether `model` trains its encoder blocks stacked: a ViT with scan=True (a BiT has no such field)."""
  return getattr(model, 'scan', False)


def per_block(model: nn.Module) -> nn.Module:
  """`model` with its blocks in a loop, so that it initialises and applies the per-block layout."""
  return model.clone(scan=False) if scanned(model) else model
