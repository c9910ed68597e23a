"""The encoder's blocks as one `nn.scan` (model.scan=True): one block compiled and looped over, so
that compile time does not grow with depth; its parameters stacked under `encoderblock`, layer axis
first (scan_layout.py converts them to and from the checkpoints' per-block tree)."""

import contextvars
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models.block import Encoder1DBlock, Rate
from vit_jax.models.scan_layout import BLOCK

# The sharding of a [batch, tokens, D] activation while a step over a mesh is traced (set by
# sharding.with_activation_sharding); None elsewhere (init, export, the tools): see ScanBlock.
ACTIVATION_SHARDING: contextvars.ContextVar[Optional[jax.sharding.Sharding]] = (
    contextvars.ContextVar('activation_sharding', default=None)
)


class ScanBlock(Encoder1DBlock):
  """A block as an `nn.scan` body: (carry, deterministic, this layer's rate, the shared position
  embeddings, this layer's lambda_init) -> (carry, no output).

  Its input is constrained to stay split over the batch (ACTIVATION_SHARDING, when set): XLA's
  sharding propagation into the scan's loop otherwise follows the fsdp-split parameters and has every
  device compute the whole global batch (8x the memory and FLOPs on 8 devices).
  """

  @nn.compact
  def __call__(
      self,
      inputs: jnp.ndarray,
      deterministic: bool,
      drop_path_rate: Rate = None,
      shared_posemb: Optional[jnp.ndarray] = None,
      lambda_init: Rate = None,
  ) -> tuple[jnp.ndarray, None]:
    if (activation_sharding := ACTIVATION_SHARDING.get()) is not None:
      inputs = jax.lax.with_sharding_constraint(inputs, activation_sharding)
    return super().__call__(inputs, deterministic, drop_path_rate, shared_posemb, lambda_init), None


class ScannedBlocks(nn.Module):
  """`num_layers` blocks as one `nn.scan`: parameters stacked under `encoderblock` (layer axis first)."""

  num_layers: int
  block_kwargs: dict[str, Any]
  remat: Optional[str] = None

  @nn.compact
  def __call__(
      self,
      x: jnp.ndarray,
      deterministic: bool,
      rates: Optional[jax.Array],
      shared_posemb: Optional[jnp.ndarray],
      lambda_inits: Optional[jax.Array],
  ) -> jnp.ndarray:
    """`rates`: each layer's stochastic-depth rate (scanned over), or None for none; `shared_posemb`:
    the position embeddings every block adds to its input, or None; `lambda_inits`: each layer's
    differential attention's lambda_init (scanned over), or None."""
    block = ScanBlock
    if self.remat:
      # prevent_cse=False: scan already keeps XLA from merging the recomputation into the forward pass.
      block = nn.remat(
          block,
          policy=getattr(jax.checkpoint_policies, self.remat),
          prevent_cse=False,
          static_argnums=(2,),
      )
    # Each layer gets its own initialisation and dropout keys (split, not broadcast).
    x, _ = nn.scan(
        block,
        variable_axes={'params': 0},
        split_rngs={'params': True, 'dropout': True},
        in_axes=(nn.broadcast, 0, nn.broadcast, 0),
        length=self.num_layers,
    )(**self.block_kwargs, name=BLOCK)(x, deterministic, rates, shared_posemb, lambda_inits)
    return x
