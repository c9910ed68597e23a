"""The Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., 2021).

Module and parameter names follow the original `vit_jax` code, so the parameter tree is the tree of the
published `.npz` checkpoints (ViT-B_16.npz, the AugReg files) and they load without renaming. The
classifier, the masked patch predictor (mpp.py) and the masked autoencoder (mae.py) share that layout:
all are a `ViTBackbone`.

The parts live in their own modules: the encoder, its fast paths and stochastic depth (encoder.py), the
position embeddings (posemb.py), the poolings incl. the MAP head (pooling.py), the per-block and
stacked layouts of the blocks (scan_layout.py). The later recipes' options are fields: `classifier`
'map', `fc_norm` (timm's: the final LayerNorm after the pooling, as `fc_norm`), `posemb` 'sincos2d',
`drop_path_rate`; the paper's position-embedding ablation is `posemb` and `posemb_where`; at their
defaults the model is the original one.
"""

from typing import Any, Optional, Sequence, Union

import chex
import flax.linen as nn
import jax.numpy as jnp

from vit_jax.models import lora, norms, patch_dropout as patch_dropout_lib, patch_embedding, resnet
from vit_jax.models.encoder import Encoder
from vit_jax.models.pooling import CLASS_TOKEN_POOLINGS, CLASSIFIERS

Dtype = Any
# The classifier's heads: DeiT's distilled models have a second, on the distillation token.
HEADS = ('head', 'head_dist')


def has_class_token(classifier: str, class_token: Optional[bool]) -> bool:
  """Whether a ViT of these `classifier` and `class_token` fields has a class token."""
  return classifier in CLASS_TOKEN_POOLINGS if class_token is None else class_token


class ViTBackbone(nn.Module):
  """Fields and layers from images to encoded tokens, shared by `VisionTransformer` and the MPP model.

  `embed_patches`: the hybrid's ResNet stem and the patch embedding `embedding`; `encode`: the class
  token `cls` (`class_token`) and the encoder `Transformer`; `apply_fc_norm`: the final LayerNorm
  `fc_norm` when the encoder has none. Subclasses call them from their compact `__call__`, so the layers
  sit at the top of their tree as in the original checkpoints, and may change the patch embeddings in
  between (masked patch prediction corrupts them there).
  """

  patch_size: int
  hidden_size: int
  num_layers: int
  mlp_dim: int
  num_heads: int
  classifier: str = 'token'  # A key of pooling.CLASSIFIERS.
  # A class token `cls` before the other tokens (None: for the classifiers that pool it, 'token' and
  # 'token_gap');
  # True with 'gap' or 'map': one they do not pool (timm's class_token with global_pool='avg': MAE,
  # BEiT, EVA). `has_class_token` resolves it.
  class_token: Optional[bool] = None
  # The MAP head's (classifier 'map'): its attention heads (None: num_heads, big_vision's and
  # SigLIP's; Perception Encoder's 8), its MLP's width (None: mlp_dim; Perception Encoder G's 4 D,
  # narrower than its blocks'), and whether its probe attends to the class token and registers
  # too (timm Eva's attn_pool, Perception Encoder's) or to the patches alone (big_vision's, timm's
  # VisionTransformer's).
  map_heads: Optional[int] = None
  map_mlp_dim: Optional[int] = None
  map_include_prefix: bool = False
  # The final LayerNorm after the pooling (timm's fc_norm) instead of at the end of the encoder.
  fc_norm: bool = False
  # False: no final LayerNorm at all (timm's final_norm=False: InternViT's, RADIO's, PE lang's).
  final_norm: bool = True
  posemb: str = 'learn'  # A key of posemb.POSEMBS.
  posemb_where: str = 'input'  # A key of posemb.POSEMB_WHERE: where the position embeddings enter.
  # Stochastic depth: the rate of the last block (encoder.drop_path_rates).
  drop_path_rate: float = 0.0
  dropout_rate: float = 0.0
  attention_dropout_rate: float = 0.0
  mlp_activation: str = 'gelu_tanh'  # A key of block.MLP_ACTIVATIONS.
  layer_scale: Optional[float] = None  # Scales each block's residual branches (block.py).
  layer_scale_mlp: bool = True  # False: layer scale on the attention's branch alone (Sapiens 2's).
  # Grouped-query attention: the key and value heads (None: num_heads), of all blocks or each one's
  # (Sapiens 2's full heads in its first and last blocks; not scanned then): encoder.py.
  num_kv_heads: Optional[Union[int, Sequence[int]]] = None
  qk_norm: bool = False  # LayerNorms of the queries and keys per head (block.py).
  key_bias: bool = True  # False: no bias of the attention's keys (EVA's).
  # A LayerNorm of the attention's heads before its output projection (EVA-02 CLIP's).
  attn_norm: bool = False
  # The MLP: a GLU (`mlp_gated`, SwiGLU with mlp_activation 'silu'), a LayerNorm of its hidden units
  # (`mlp_norm`): block.MlpBlock's `gated` and `norm`, EVA-02's.
  mlp_gated: bool = False
  mlp_norm: bool = False
  # Each block's norms after its branches, before the residual adds (block.py; EVA-02-CLIP-E's).
  res_post_norm: bool = False
  # Each block's attention and MLP side by side, of one norm's output, summed into the residual
  # (ViT-22B's parallel layers; timm's ParallelScalingBlock): block.py.
  parallel_block: bool = False
  # Differential attention (differential.py; timm's attn_layer='diff'): two softmax maps of each
  # head's halves, the second subtracted at a learned weight (lambda_init of each block's index).
  diff_attention: bool = False
  # 2-D rotary embeddings of the patches' queries and keys (rope.py), EVA-02's, RoPE-ViT's (axial or
  # mixed: learned), Perception Encoder's or DINOv3's (`rope_style`, a key of rope.STYLES);
  # `rope_grid`: the grid other grids' positions are rescaled to (timm's ref_feat_shape; not
  # 'dinov3' nor 'rope_mixed'), None: each grid's own indices.
  rope: bool = False
  rope_grid: Optional[tuple[int, int]] = None
  rope_style: str = 'eva02'
  num_registers: int = 0  # Learned tokens `reg` after the class token, which no pooling reads.
  # DeiT's distillation token `dist` after the class token, read by its own head `head_dist`.
  distilled: bool = False
  # A LayerNorm before the first block (Transformer/pre_norm) and no bias in the patch embedding:
  # CLIP's image tower (timm's pre_norm).
  pre_norm: bool = False
  # Every LayerNorm's epsilon: the original checkpoints' and timm's 1e-6; Hugging Face's ViT 1e-12.
  layernorm_epsilon: float = 1e-6
  # Every norm's kind, a key of norms.NORM_LAYERS ('rmsnorm': AIMv2's), with layernorm_epsilon.
  norm_layer: str = 'layernorm'
  # A norm `embedding_norm` of the patch embeddings before the position embeddings (timm's
  # embed_norm_layer: AIMv2's).
  embed_norm: bool = False
  # A key of inits.WEIGHT_INITS: how the training state draws the first parameters (see inits.redraw).
  weight_init: str = 'original'
  block: str = 'standard'  # A key of encoder.BLOCKS: 'axial' for Axial-ViT.
  # Low-rank adapters (lora.py) of rank `lora_rank` (None: none) of every block's `lora_targets`
  # (keys of lora.TARGETS), their update scaled by lora_alpha / lora_rank (alpha None: the rank), their
  # input dropped at `lora_dropout`.
  lora_rank: Optional[int] = None
  lora_alpha: Optional[float] = None
  lora_targets: tuple[str, ...] = lora.DEFAULT_TARGETS
  lora_dropout: float = 0.0
  dtype: Dtype = jnp.float32
  attention: str = 'xla'  # A key of ATTENTION_FNS.
  matmul: str = 'default'  # A key of fp8.MATMULS: how the blocks' projections and MLPs multiply.
  remat: Optional[str] = None  # A jax.checkpoint_policies name, e.g. 'nothing_saveable'; None: off.
  scan: bool = False
  # The R50+ViT hybrid: units per stage of a ResNet-v2 stem before the patch embedding (None: pure ViT).
  resnet_layers: Optional[tuple[int, ...]] = None
  resnet_width_factor: float = 1.0

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patches' (the class token, the distillation token, the registers)."""
    return has_class_token(self.classifier, self.class_token) + self.distilled + self.num_registers

  @property
  def input_stride(self) -> int:
    """Input pixels per patch side: the patch size times the ResNet stem's stride (1 for a pure ViT)."""
    return self.patch_size * resnet.stem_stride(self.resnet_layers)

  def embed_patches(self, images: jnp.ndarray) -> jnp.ndarray:
    """RGB images [b, H, W, 3] -> patch embeddings [b, H/s * W/s, hidden_size], s = `input_stride`."""
    chex.assert_shape(
        images,
        (None, None, None, 3),
        custom_message='the model takes a batch of RGB images [batch, height, width, 3]',
    )
    s = self.input_stride
    if images.shape[1] % s or images.shape[2] % s:
      # The strided convolutions would silently drop the pixels that fill no whole patch.
      raise ValueError(
          f'images of {images.shape[1]}x{images.shape[2]} pixels do not divide into '
          f'patches of {s}x{s} input pixels: use an image size that is a multiple of {s}'
      )
    x = images.astype(self.dtype)
    if self.resnet_layers:
      x = resnet.resnet_stem(
          x, num_layers=self.resnet_layers, width_factor=self.resnet_width_factor, dtype=self.dtype
      )
    p = self.patch_size
    x = patch_embedding.PatchEmbedding(
        p, self.hidden_size, use_bias=not self.pre_norm, dtype=self.dtype, name='embedding'
    )(x)
    n, h, w, d = x.shape
    x = jnp.reshape(x, (n, h * w, d))
    if self.embed_norm:
      x = norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'embedding_norm')(x)
    return x

  def patch_grid(self, images: jnp.ndarray) -> tuple[int, int]:
    """The (rows, columns) of patches `embed_patches` cuts `images` into."""
    return images.shape[1] // self.input_stride, images.shape[2] // self.input_stride

  def encode(
      self,
      x: jnp.ndarray,
      *,
      grid: tuple[int, int],
      train: bool,
      keep: Optional[jnp.ndarray] = None,
  ) -> jnp.ndarray:
    """Patch embeddings [b, h * w, D] of the grid (h, w) -> encoded tokens
    [b, num_prefix_tokens + h * w, D]: the class token, the distillation token, the registers, the
    patches (timm's order); not normalised when `fc_norm` (see `apply_fc_norm`). `keep` [b, k]: the
    patches that the blocks see (the Encoder's; a masked autoencoder's), the tokens then
    [b, num_prefix_tokens + k, D]."""
    n, _, d = x.shape
    if self.classifier not in CLASSIFIERS:
      raise ValueError(
          f"classifier must be one of {', '.join(CLASSIFIERS)}, got {self.classifier!r}"
      )
    if self.num_registers:  # Drawn apart (DINOv2's std): equal registers would stay equal.
      reg = self.param('reg', nn.initializers.normal(1e-6), (1, self.num_registers, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(reg.astype(x.dtype), (n, 1, 1)), x], axis=1)
    if self.distilled:  # Drawn apart from the class token (DeiT's), which its head would mirror.
      dist = self.param('dist', nn.initializers.normal(0.02), (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(dist.astype(x.dtype), (n, 1, 1)), x], axis=1)
    if has_class_token(self.classifier, self.class_token):
      cls = self.param('cls', nn.initializers.zeros, (1, 1, d), jnp.float32)
      x = jnp.concatenate([jnp.tile(cls.astype(x.dtype), (n, 1, 1)), x], axis=1)
    return Encoder(
        num_layers=self.num_layers,
        mlp_dim=self.mlp_dim,
        num_heads=self.num_heads,
        dropout_rate=self.dropout_rate,
        attention_dropout_rate=self.attention_dropout_rate,
        dtype=self.dtype,
        attention=self.attention,
        matmul=self.matmul,
        remat=self.remat,
        scan=self.scan,
        posemb=self.posemb,
        posemb_where=self.posemb_where,
        drop_path_rate=self.drop_path_rate,
        final_norm=self.final_norm and not self.fc_norm,
        mlp_activation=self.mlp_activation,
        layer_scale=self.layer_scale,
        layer_scale_mlp=self.layer_scale_mlp,
        num_kv_heads=self.num_kv_heads,
        layernorm_epsilon=self.layernorm_epsilon,
        norm_layer=self.norm_layer,
        qk_norm=self.qk_norm,
        key_bias=self.key_bias,
        attn_norm=self.attn_norm,
        mlp_gated=self.mlp_gated,
        mlp_norm=self.mlp_norm,
        res_post_norm=self.res_post_norm,
        parallel_block=self.parallel_block,
        diff_attention=self.diff_attention,
        rope=self.rope,
        rope_grid=None if self.rope_grid is None else tuple(self.rope_grid),
        rope_style=self.rope_style,
        pre_norm=self.pre_norm,
        block=self.block,
        lora=lora.spec(self.lora_rank, self.lora_alpha, self.lora_dropout, self.lora_targets),
        name='Transformer',
    )(x, grid=grid, train=train, keep=keep)

  def apply_fc_norm(self, x: jnp.ndarray) -> jnp.ndarray:
    """The final LayerNorm `fc_norm` over the last axis when `fc_norm` (else `x` as it is)."""
    if not self.fc_norm:
      return x
    return norms.norm(self.norm_layer, self.layernorm_epsilon, self.dtype, 'fc_norm')(x)


# kw_only: the backbone's fields come first and have defaults; num_classes stays required all the same.
class VisionTransformer(ViTBackbone, kw_only=True):
  """ViT classifier: the backbone, a pooling (`classifier`: class token, GAP, MAP or both of the first
  two side by side), head.

  `representation_size` adds the tanh pre-logits layer used in pretraining; `num_classes=None` returns
  the pooled (pre-logits) representation, before `head_dropout_rate`'s dropout. Logits are float32
  whatever the compute `dtype`.

  `distilled` (DeiT's): the distillation token has its own head `head_dist`; the model's logits (and
  features) are the mean of the two heads' (DeiT's and timm's evaluation), and `both_heads=True`
  returns the pair (class token's, distillation token's) for distillation's two losses. A model
  without the token returns its one head's logits twice.
  """

  num_classes: Optional[int]
  representation_size: Optional[int] = None
  # Dropout of the pooled features before the head at train time (timm's `drop_rate`, train.py's
  # --drop); the original model has none: its `dropout_rate` acts inside the encoder.
  head_dropout_rate: float = 0.0
  # The heads' first bias (big_vision's init_head_bias: -10 starts a sigmoid loss over 21k classes
  # near each class's rarity, not at log 2 per class); their kernels start at zero.
  head_bias_init: float = 0.0
  # The share of each image's patches its blocks do not see at train time (patch_dropout.py).
  patch_dropout: float = 0.0

  @nn.compact
  def __call__(
      self,
      images: jnp.ndarray,
      *,
      train: bool = False,
      both_heads: bool = False,
      patch_noise: Optional[jnp.ndarray] = None,
  ) -> Union[jnp.ndarray, tuple[jnp.ndarray, jnp.ndarray]]:
    """`patch_noise` [b, patches]: the noise of `patch_dropout`'s draw at train time (timm's randn;
    default: drawn from the 'dropout' stream)."""
    x = self.embed_patches(images)
    keep = None
    if train and self.patch_dropout:
      keep = patch_dropout_lib.drawn(self, x, self.patch_dropout, patch_noise)
    tokens = self.encode(x, grid=self.patch_grid(images), train=train, keep=keep)
    x = self.apply_fc_norm(CLASSIFIERS[self.classifier](tokens, self))

    if self.representation_size is not None:
      x = nn.tanh(nn.Dense(self.representation_size, dtype=self.dtype, name='pre_logits')(x))
    if self.num_classes is None:
      x = (x + tokens[:, 1]) / 2 if self.distilled else x
      return x.astype(jnp.float32)
    logits = self._head(x, HEADS[0], train)
    if not self.distilled:
      return (logits, logits) if both_heads else logits
    distilled = self._head(tokens[:, 1], HEADS[1], train)
    return (logits, distilled) if both_heads else (logits + distilled) / 2

  def _head(self, x: jnp.ndarray, name: str, train: bool) -> jnp.ndarray:
    x = nn.Dropout(self.head_dropout_rate)(x, deterministic=not train)
    # Zero-initialised head: the fine-tuning recipe of the paper, and harmless for pretraining.
    x = nn.Dense(
        self.num_classes,
        dtype=self.dtype,
        kernel_init=nn.initializers.zeros,
        bias_init=nn.initializers.constant(self.head_bias_init),
        name=name,
    )(x)
    return x.astype(jnp.float32)
