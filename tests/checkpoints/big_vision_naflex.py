"""big_vision's NaFlex ViT (models/proj/image_text/naflex_vit.py, and models/vit.py's MlpBlock, at
google-research/big_vision 0127fb6, Apache 2.0), as the reference the tests read its checkpoints
against: its modules copied with their parameter names (`l` renamed `side`), less what inference
does not run (dropout, scan, remat, sharding constraints; `batch_shmap` is the plain vmap it maps);
`patchify` is pp/proj/image_text/ops_naflex.py's (tf.image.extract_patches flattens a patch's
rows, columns, channels) in NumPy.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def patchify(image: np.ndarray, patch: int) -> tuple[np.ndarray, ...]:
  """ops_naflex's `patchify` of one [H, W, 3] image: (patches [N, P*P*3], type, yidx, xidx)."""
  h, w, c = image.shape
  nh, nw = h // patch, w // patch
  patches = image[: nh * patch, : nw * patch].reshape(nh, patch, nw, patch, c)
  patches = patches.transpose(0, 2, 1, 3, 4).reshape(nh * nw, patch * patch * c)
  gy, gx = np.meshgrid(np.arange(nh), np.arange(nw), indexing='ij')
  return patches, np.ones(nh * nw, np.int32), gy.reshape(-1), gx.reshape(-1)


def _pos_emb_resize(pos_emb, shapes, coords, side):
  def resize_fn(shape, coords):
    emb = jax.image.scale_and_translate(
        pos_emb,
        shape=(side, side, pos_emb.shape[-1]),
        spatial_dims=(0, 1),
        scale=shape / jnp.asarray(pos_emb.shape[:2]),
        translation=jnp.asarray([0, 0]),
        method='bilinear',
        antialias=True,
    )
    gather_dim = jax.lax.GatherDimensionNumbers(
        offset_dims=(1,), collapsed_slice_dims=(0, 1), start_index_map=(0, 1, 2)
    )
    return jax.lax.gather(
        emb, jnp.pad(coords, [[0, 0], [0, 1]]), gather_dim, [1, 1, emb.shape[-1]], mode='fill'
    )

  return jax.vmap(resize_fn, in_axes=(0, 0), out_axes=0)(shapes, coords)


class MlpBlock(nn.Module):
  mlp_dim: int | None = None

  @nn.compact
  def __call__(self, x):
    d = x.shape[-1]
    x = nn.Dense(self.mlp_dim or 4 * d)(x)
    x = nn.gelu(x)
    return nn.Dense(d)(x)


class Encoder1DBlock(nn.Module):
  mlp_dim: int | None = None
  num_heads: int = 12

  @nn.compact
  def __call__(self, x, mask=None):
    if mask is not None:
      mask = mask[..., None, :, :]
    y = nn.LayerNorm()(x)
    y = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(y, y, mask=mask)
    x = x + y
    y = nn.LayerNorm()(x)
    y = MlpBlock(mlp_dim=self.mlp_dim)(y)
    return x + y


class Encoder(nn.Module):
  depth: int
  mlp_dim: int | None = None
  num_heads: int = 12

  @nn.compact
  def __call__(self, x, mask=None):
    for lyr in range(self.depth):
      x = Encoder1DBlock(
          name=f'encoderblock_{lyr}', mlp_dim=self.mlp_dim, num_heads=self.num_heads
      )(x, mask)
    return nn.LayerNorm(name='encoder_norm')(x)


class MAPHead(nn.Module):
  mlp_dim: int | None = None
  num_heads: int = 12

  @nn.compact
  def __call__(self, x, mask=None):
    n, _, d = x.shape
    probe = self.param('probe', nn.initializers.xavier_uniform(), (1, 1, d), x.dtype)
    probe = jnp.tile(probe, [n, 1, 1])
    if mask is not None:
      mask = mask[..., None, None, :]
    x = nn.MultiHeadDotProductAttention(num_heads=self.num_heads)(probe, x, mask=mask)
    y = nn.LayerNorm()(x)
    x = x + MlpBlock(mlp_dim=self.mlp_dim)(y)
    return x[:, 0]


class NaFlexViT(nn.Module):
  """naflex_vit.py's `_Model`, posemb 'learn_2d(l)': (patches, type, yidx, xidx) -> outputs."""

  num_classes: int | None = None
  width: int = 768
  depth: int = 12
  mlp_dim: int | None = None
  num_heads: int = 12
  pool_type: str = 'map'
  nposemb: int = 16
  posemb_grid_size: int = 64
  patchln_post: bool = False

  @nn.compact
  def __call__(self, image):
    patches, ptype, yabs, xabs = image
    tokens = nn.Dense(self.width, name='embedding')(jnp.asarray(patches, jnp.float32))
    if self.patchln_post:
      tokens = nn.LayerNorm(name='patchln_post')(tokens)
    posembs = self.param(
        'pos_embedding',
        nn.initializers.normal(stddev=1 / np.sqrt(self.width)),
        (self.nposemb, self.nposemb, self.width),
    )
    coords = jnp.stack([yabs, xabs], axis=-1)
    shapes = coords.max(axis=1) + 1
    x = tokens + _pos_emb_resize(posembs, shapes, coords, self.posemb_grid_size)
    sa_mask = ptype == 1
    sa_mask = jnp.logical_and(sa_mask[..., :, None], sa_mask[..., None, :])
    x = Encoder(
        depth=self.depth, mlp_dim=self.mlp_dim, num_heads=self.num_heads, name='Transformer'
    )(x, mask=sa_mask)
    pool_mask = ptype == 1
    if self.pool_type == 'map':
      x = MAPHead(num_heads=self.num_heads, mlp_dim=self.mlp_dim)(x, mask=pool_mask)
    else:  # 'gap'
      pool_mask = pool_mask[..., None]
      x = jnp.sum(x * pool_mask, axis=1) / jnp.sum(pool_mask, axis=1)
    if self.num_classes:
      x = nn.Dense(self.num_classes, name='head')(x)
    return x
