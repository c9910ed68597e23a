"""The train state on the mesh: initialised there, or restored from the latest checkpoint.

A scanned model trains on its encoder blocks stacked on a layer axis (`vit.stack_blocks`): stacking
inside the step would put one slice per layer and array into its gradient, and compile slower than no
scan at all. Checkpoints keep the per-block layout of the original ViT (`vit.unstack_blocks`).
"""
import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import logging

from vit_jax import checkpoint, sharding
from vit_jax.models import vit
from vit_jax.train.setup import Setup


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  ema_params: Any  # Polyak (exponential moving) average of params; None when config.polyak_decay is.


def init_state(key: jax.Array, *, model: nn.Module, tx: optax.GradientTransformation,
               image_size: int, polyak: bool) -> TrainState:
  """A fresh state in the checkpoint layout (per-block parameters)."""
  # Initialised as a loop of blocks even when scanned (a scan splits the key its own way): the fast
  # paths change the speed of a run, never its results.
  params = model.clone(scan=False).init({'params': key, 'mpp': key},
                                        jnp.zeros((1, image_size, image_size, 3)), train=False)['params']
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    ema_params=params if polyak else None)


def training_layout(tree: Any, model: nn.Module) -> Any:
  """`tree` (a train state or parameters) as the train step keeps it: blocks stacked if scanned."""
  return vit.stack_blocks(tree, model.num_layers) if model.scan else tree


def create_state(setup: Setup, tx: optax.GradientTransformation,
                 manager: Any) -> tuple[TrainState, Any, Callable[[TrainState], TrainState]]:
  """The train state on the mesh: restored from the latest checkpoint if any, else initialised there.

  Returns the state in its training layout, the shardings of that layout, and the function that brings
  such a state back to the layout checkpoints store.
  """
  init = functools.partial(init_state, model=setup.model, tx=tx, image_size=setup.config.image_size,
                           polyak=setup.config.polyak_decay is not None)
  to_training = functools.partial(training_layout, model=setup.model)
  key = jax.random.key(setup.config.seed)
  abstract = jax.eval_shape(init, key)
  shardings = sharding.state_shardings(abstract, setup.mesh)
  train_shardings = sharding.state_shardings(jax.eval_shape(to_training, abstract), setup.mesh)
  to_checkpoint = (jax.jit(vit.unstack_blocks, out_shardings=shardings) if setup.model.scan else
                   lambda state: state)
  restored = checkpoint.restore(manager, checkpoint.abstract_with_shardings(abstract, shardings))
  if restored is not None:
    logging.info('Resumed from %s at step %d', manager.directory, int(restored.step))
    return jax.jit(to_training, out_shardings=train_shardings)(restored), train_shardings, to_checkpoint
  state = jax.jit(lambda key: to_training(init(key)), out_shardings=train_shardings)(key)
  if setup.init_params is not None:
    def place_init_params():  # Separate buffers for each use: the train step donates both trees.
      params = jax.device_put(setup.init_params, shardings.params)
      return jax.jit(to_training, out_shardings=train_shardings.params)(params)

    state = state.replace(params=place_init_params(),
                          ema_params=None if state.ema_params is None else place_init_params())
  return state, train_shardings, to_checkpoint
