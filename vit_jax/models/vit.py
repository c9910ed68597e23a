"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021).

Module and parameter names follow the original `vit_jax` code, so the parameter tree is the tree of the
published `.npz` checkpoints (ViT-B_16.npz, the AugReg files) and they load without renaming. The
classifier and the masked patch predictor (mpp.py) share that layout: both are a `ViTBackbone`.

Fast paths (model fields; none changes the parameter tree): `attention='dot_product_attention'` computes
attention with `jax.nn.dot_product_attention` (cuDNN flash attention on GPU, XLA elsewhere; attention.py);
`remat=POLICY` recomputes each block's activations in the backward pass except what the
`jax.checkpoint_policies` policy saves; `scan=True` compiles one block and loops over `nn.scan`, so
compile time does not grow with depth.

A scanned encoder reads its blocks stacked (`Transformer/encoderblock/...`, layer axis first). `init`
still returns the per-block tree of the checkpoints, and `apply` takes either layout: per-block
parameters are stacked inside the program, which is cheap to run but not to compile (the gradient of the
stacking is one slice per layer and parameter), so training keeps them stacked (`stack_blocks`) and
unstacks at the checkpoint boundary (`unstack_blocks`).
"""
from typing import Any, Callable, Mapping, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from vit_jax.models import resnet
from vit_jax.models.attention import ATTENTION_FNS

Dtype = Any
BLOCK = 'encoderblock'  # Blocks are `encoderblock_{i}` in the checkpoints, `encoderblock` when stacked.
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
    return {**rest, **{f'{BLOCK}_{i}': jax.tree.map(lambda x, i=i: x[i], node[BLOCK])
                       for i in range(num_layers)}}

  return jax.tree.map(unstack, tree, is_leaf=lambda node: _holds(node, BLOCK))


class AddPositionEmbs(nn.Module):
  """Adds learned 1D position embeddings, one per token (class token included)."""
  posemb_init: Callable = nn.initializers.normal(stddev=0.02)

  @nn.compact
  def __call__(self, inputs: jnp.ndarray) -> jnp.ndarray:
    shape = (1, inputs.shape[1], inputs.shape[2])
    if self.has_variable('params', 'pos_embedding'):
      # Flax would only say that the initializer's shape differs from the stored one.
      stored = tuple(self.get_variable('params', 'pos_embedding').shape)
      if stored != shape:
        raise ValueError(f'the position embeddings {stored} are for {stored[1]} tokens, but the images '
                         f'give {shape[1]}: the parameters are for another image size; fit them to this '
                         'one with vit_jax.models.loading.adapt_params (as config.init_from does)')
    pos_embedding = self.param('pos_embedding', self.posemb_init, shape, jnp.float32)
    return inputs + pos_embedding.astype(inputs.dtype)


class MlpBlock(nn.Module):
  """Dense -> GELU -> dropout -> Dense -> dropout."""
  mlp_dim: int
  dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, *, deterministic: bool) -> jnp.ndarray:
    dense = lambda features, name: nn.Dense(
        features, dtype=self.dtype, kernel_init=nn.initializers.xavier_uniform(),
        bias_init=nn.initializers.normal(stddev=1e-6), name=name)
    x = dense(self.mlp_dim, 'Dense_0')(inputs)
    x = nn.gelu(x)  # The tanh approximation, as in the original code and checkpoints.
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = dense(inputs.shape[-1], 'Dense_1')(x)
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class Encoder1DBlock(nn.Module):
  """Pre-LayerNorm transformer block: x + MSA(LN(x)), then x + MLP(LN(x)).

  Submodule names are spelled out: they are the names in the original checkpoints (older Flax numbered
  submodules across types), and current Flax would number them per type.
  """
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.

  # `deterministic` may be positional: `nn.remat` needs it as a static positional argument.
  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    x = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_0')(inputs)
    x = nn.MultiHeadDotProductAttention(
        num_heads=self.num_heads, dtype=self.dtype,
        kernel_init=nn.initializers.xavier_uniform(), broadcast_dropout=False,
        dropout_rate=self.attention_dropout_rate, deterministic=deterministic,
        attention_fn=ATTENTION_FNS[self.attention], name='MultiHeadDotProductAttention_1')(
            # The weights land in 'intermediates' only when it is mutable (the pictures tool asks).
            x, x, sow_weights=self.attention == 'xla')
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = x + inputs
    y = nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='LayerNorm_2')(x)
    y = MlpBlock(self.mlp_dim, self.dropout_rate, self.dtype, name='MlpBlock_3')(
        y, deterministic=deterministic)
    return x + y


# Tensor parallelism (Megatron style): (regex over the '/'-joined parameter path, the dimension split over
# the mesh axis `tensor`) for the attention heads and MLP units of `Encoder1DBlock`. Paths of
# optimizer-state leaves end with the parameter path, so the same rules serve them.
TENSOR_RULES = (
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/kernel$', 1),  # (D, heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/(query|key|value)/bias$', 0),  # (heads, D/heads)
    (r'MultiHeadDotProductAttention_\d+/out/kernel$', 0),  # (heads, D/heads, D)
    (r'MlpBlock_\d+/Dense_0/kernel$', 1),  # (D, mlp)
    (r'MlpBlock_\d+/Dense_0/bias$', 0),  # (mlp,)
    (r'MlpBlock_\d+/Dense_1/kernel$', 0),  # (mlp, D)
)


class ScanBlock(Encoder1DBlock):
  """A block as an `nn.scan` body: (carry, deterministic) -> (carry, no output)."""

  @nn.compact
  def __call__(self, inputs: jnp.ndarray, deterministic: bool) -> tuple[jnp.ndarray, None]:
    return super().__call__(inputs, deterministic), None


class ScannedBlocks(nn.Module):
  """`num_layers` blocks as one `nn.scan`: parameters stacked under `encoderblock` (layer axis first)."""
  num_layers: int
  block_kwargs: dict[str, Any]
  remat: Optional[str] = None

  @nn.compact
  def __call__(self, x: jnp.ndarray, deterministic: bool) -> jnp.ndarray:
    block = ScanBlock
    if self.remat:
      # prevent_cse=False: scan already keeps XLA from merging the recomputation into the forward pass.
      block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat), prevent_cse=False,
                       static_argnums=(2,))
    # Each layer gets its own initialisation and dropout keys (split, not broadcast).
    x, _ = nn.scan(block, variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
                   in_axes=nn.broadcast, length=self.num_layers)(
                       **self.block_kwargs, name=BLOCK)(x, deterministic)
    return x


class Encoder(nn.Module):
  """Position embeddings, dropout, `num_layers` blocks and a final LayerNorm.

  `remat` names a `jax.checkpoint_policies` policy to rematerialise each block with (None: off); `scan`
  runs the blocks as one `nn.scan`; it initialises per-block parameters and applies with either layout
  (see the module docstring).
  """
  num_layers: int
  mlp_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'
  remat: Optional[str] = None
  scan: bool = False

  @nn.compact
  def __call__(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    x = AddPositionEmbs(name='posembed_input')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=not train)
    block_kwargs = dict(
        mlp_dim=self.mlp_dim, num_heads=self.num_heads, dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate, dtype=self.dtype,
        attention=self.attention)
    if self.scan:
      # The scanned blocks read stacked parameters; per-block ones (from checkpoints) are stacked on
      # the way in, and `init` unstacks what the scan creates, so the stored tree is per-block.
      blocks = nn.map_variables(
          ScannedBlocks, 'params', init=True,
          trans_in_fn=lambda v: {**v, 'params': stack_blocks(v.get('params', {}), self.num_layers)},
          trans_out_fn=lambda v: {**v, 'params': unstack_blocks(v.get('params', {}))})(
              num_layers=self.num_layers, block_kwargs=block_kwargs, remat=self.remat)
      # The blocks live in this module's scope, so their parameters sit at Transformer/encoderblock_{i}
      # (or Transformer/encoderblock) as in the checkpoints, not one level down.
      nn.share_scope(self, blocks)
      x = blocks(x, not train)
    else:
      block = Encoder1DBlock
      if self.remat:
        block = nn.remat(block, policy=getattr(jax.checkpoint_policies, self.remat),
                         static_argnums=(2,))  # deterministic (self is 0).
      for i in range(self.num_layers):
        x = block(**block_kwargs, name=f'{BLOCK}_{i}')(x, not train)
    return nn.LayerNorm(epsilon=1e-6, dtype=self.dtype, name='encoder_norm')(x)


class ViTBackbone(nn.Module):
  """Fields and layers from images to encoded tokens, shared by `VisionTransformer` and the MPP model.

  `embed_patches`: the hybrid's ResNet stem and the patch embedding `embedding`; `encode`: the class
  token `cls` (classifier 'token') and the encoder `Transformer`. Subclasses call both from their
  compact `__call__`, so the layers sit at the top of their tree as in the original checkpoints, and
  may change the patch embeddings in between (masked patch prediction corrupts them there).
  """
  patch_size: int
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  classifier: str = 'token'
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.
  remat: Optional[str] = None  # A jax.checkpoint_policies name, e.g. 'nothing_saveable'; None: off.
  scan: bool = False
  # The R50+ViT hybrid: units per stage of a ResNet-v2 stem before the patch embedding (None: pure ViT).
  resnet_layers: Optional[tuple[int, ...]] = None
  resnet_width_factor: float = 1.0

  @property
  def input_stride(self) -> int:
    """Input pixels per patch side: the patch size times the ResNet stem's stride (1 for a pure ViT)."""
    return self.patch_size * resnet.stem_stride(self.resnet_layers)

  def embed_patches(self, images: jnp.ndarray) -> jnp.ndarray:
    """RGB images [b, H, W, 3] -> patch embeddings [b, H/s * W/s, hidden_size], s = `input_stride`."""
    chex.assert_shape(images, (None, None, None, 3),
                      custom_message='the model takes a batch of RGB images [batch, height, width, 3]')
    s = self.input_stride
    if images.shape[1] % s or images.shape[2] % s:
      # The strided convolutions would silently drop the pixels that fill no whole patch.
      raise ValueError(f'images of {images.shape[1]}x{images.shape[2]} pixels do not divide into '
                       f'patches of {s}x{s} input pixels: use an image size that is a multiple of {s}')
    x = images.astype(self.dtype)
    if self.resnet_layers:
      x = resnet.resnet_stem(x, num_layers=self.resnet_layers, width_factor=self.resnet_width_factor,
                             dtype=self.dtype)
    p = self.patch_size
    x = nn.Conv(self.hidden_size, (p, p), strides=(p, p), padding='VALID', dtype=self.dtype,
                name='embedding')(x)
    n, h, w, d = x.shape
    return jnp.reshape(x, (n, h * w, d))

  def encode(self, x: jnp.ndarray, *, train: bool) -> jnp.ndarray:
    """Patch embeddings [b, patches, D] -> encoded tokens [b, (1 +) patches, D], class token first."""
    n, _, d = x.shape
    if self.classifier == 'token':
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    elif self.classifier != 'gap':
      raise ValueError(f"classifier must be 'token' or 'gap', got {self.classifier!r}")
    return Encoder(
        num_layers=self.num_layers, mlp_dim=self.mlp_dim, num_heads=self.num_heads,
        dropout_rate=self.dropout_rate, attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype, attention=self.attention, remat=self.remat, scan=self.scan,
        name='Transformer')(x, train=train)


# kw_only: the backbone's fields come first and have defaults; num_classes stays required all the same.
class VisionTransformer(ViTBackbone, kw_only=True):
  """ViT classifier: the backbone, class-token or GAP pooling, head.

  `representation_size` adds the tanh pre-logits layer used in pretraining; `num_classes=None` returns
  the pooled (pre-logits) representation. Logits are float32 whatever the compute `dtype`.
  """
  num_classes: Optional[int]
  representation_size: Optional[int] = None

  @nn.compact
  def __call__(self, images: jnp.ndarray, *, train: bool = False) -> jnp.ndarray:
    x = self.encode(self.embed_patches(images), train=train)
    x = x[:, 0] if self.classifier == 'token' else jnp.mean(x, axis=1)

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    if self.num_classes is None:
      return x.astype(jnp.float32)
    # Zero-initialised head: the fine-tuning recipe of the paper, and harmless for pretraining.
    x = nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=nn.initializers.zeros,
                 name='head')(x)
    return x.astype(jnp.float32)
