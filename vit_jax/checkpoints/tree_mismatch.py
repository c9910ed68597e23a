"""Why a checkpoint's parameter tree does not fit the model's, in one line naming the flags that make
it fit: its position embeddings, registers, distillation or class token, pooling and final LayerNorm,
the options that add parameters to every block (`STRUCTURE_FIELDS`), grouped key heads, parallel
blocks, layer scale (of one branch or both); else another architecture. adapting.py, which fits the
trees, raises what `explain` returns.

It knows the models' parameter names (vit.py, pooling.py, encoder.py, block.py), beside them.
"""

import re
from typing import Any, Optional

from vit_jax.checkpoints import posemb_resizing, torch_names
from vit_jax.models.pooling import MAP_HEAD

# The final LayerNorm: the encoder's, before the pooling, or after it (model.fc_norm). A new head may
# pool otherwise than the checkpoint's (state_dicts.POOLING_FIELDS).
FINAL_NORMS = (torch_names.ENCODER_NORM, 'fc_norm')


def has(flat: dict[str, Any], layer: str) -> bool:
  return any(k.startswith(f'{layer}/') for k in flat)


def final_norm(flat: dict[str, Any]) -> Optional[str]:
  """Which of `FINAL_NORMS` a flat tree has, if any (model.fc_norm, model.final_norm)."""
  return next((norm for norm in FINAL_NORMS if has(flat, norm)), None)


def _posemb_kind(flat: dict[str, Any]) -> tuple[str, str]:
  """The position embeddings a flat tree has, told by its parameter names: (what, the flags that make
  a model with them)."""
  names = [k for k in flat if posemb_resizing.POSEMB_PARAM.search(k)]
  if not names:
    return (
        'no learned position embeddings',
        '--config.model.posemb=sincos2d (or sincos2d_mae, none)',
    )
  if any('relative_posemb/' in k for k in names):
    return 'relative position embeddings', '--config.model.posemb=relative'
  two_d = any(posemb_resizing.POSEMB_AXIS.search(k) for k in names)
  flags = f'--config.model.posemb={"learn2d" if two_d else "learn"}'
  if any('/posembed/' in k for k in names):
    return (
        f'learned {"2-D " if two_d else ""}position embeddings in every block',
        f'{flags} --config.model.posemb_where=every_layer',
    )
  return f'learned {"2-D " if two_d else ""}position embeddings', flags


# Parameters that a bool model field adds: (their path's pattern, the field, what they are).
STRUCTURE_FIELDS = (
    (r'/[qk]_norm/', 'qk_norm', 'query/key normalisation'),
    (r'/MultiHeadDotProductAttention_1/key/bias$', 'key_bias', 'key biases'),
    (r'/MultiHeadDotProductAttention_1/norm/', 'attn_norm', 'LayerNorms in its attention'),
    (r'/MlpBlock_3/Dense_linear/', 'mlp_gated', 'gated MLPs (GLU)'),
    (r'/MlpBlock_3/norm/', 'mlp_norm', 'LayerNorms in its MLPs'),
    (r'^embedding_norm/', 'embed_norm', 'a norm of its patch embeddings'),
)


def explain(
    path: str, loaded: Any, target: Any, params: dict[str, Any], targets: dict[str, Any]
) -> ValueError:
  """The error for parameter `path`, of shape `loaded` in the checkpoint and `target` in the model
  ('none' where absent), of the flat trees `params` (the checkpoint's) and `targets`."""
  kind, want = _posemb_kind(params), _posemb_kind(targets)
  if posemb_resizing.POSEMB_PARAM.search(path) and kind[0] != want[0]:
    # Learned embeddings are what the blocks were trained with: replacing them with others is a
    # change of architecture the config has to ask for.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has {kind[0]}; '
        f'set {kind[1]} to match it'
    )
  if path == 'reg':
    return ValueError(
        f'reg: checkpoint {loaded} vs model {target}: the checkpoint has '
        + (
            f"{loaded[1]} register token{'s' if loaded[1] > 1 else ''}"
            if loaded != 'none'
            else 'no register tokens'
        )
        + f"; set --config.model.num_registers={loaded[1] if loaded != 'none' else 0}"
    )
  if path == 'dist':
    present = loaded != 'none'
    return ValueError(
        f'dist: checkpoint {loaded} vs model {target}: the checkpoint has '
        f"{'a' if present else 'no'} distillation token (DeiT's); set "
        f'--config.model.distilled={present}'
    )
  if path == 'cls' and 'none' in (loaded, target):
    if loaded != 'none':
      return ValueError(
          f'cls: checkpoint {loaded} vs model none: the checkpoint has a class token; set '
          '--config.model.class_token=True (classifier gap or map leave it unpooled)'
      )
    return ValueError(
        f'cls: checkpoint none vs model {target}: the checkpoint has no class token to pool; set '
        '--config.model.classifier=gap (or map) and class_token=False'
    )
  if path.startswith(f'{MAP_HEAD}/') and 'none' in (loaded, target):
    if loaded != 'none':
      return ValueError(
          f'{path}: checkpoint {loaded} vs model none: the checkpoint pools by attention; set '
          '--config.model.classifier=map, or --config.keep_head=False for a new head that pools '
          'otherwise'
      )
    return ValueError(
        f'{path}: checkpoint none vs model {target}: the checkpoint has no MAP head; set '
        '--config.keep_head=False for a new head with a new one, or --config.model.classifier to '
        "the checkpoint's pooling"
    )
  if path in (f'{MAP_HEAD}/MlpBlock_0/Dense_0/bias', f'{MAP_HEAD}/MlpBlock_0/Dense_0/kernel'):
    return ValueError(
        f"{path}: checkpoint {loaded} vs model {target}: the checkpoint's MAP head has an MLP of "
        f'{loaded[-1]} units; set --config.model.map_mlp_dim={loaded[-1]}'
    )
  if path.endswith('/rope_freqs'):
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint '
        + (
            "learns its rotary embeddings' frequencies (RoPE-Mixed's); set "
            '--config.model.rope=True and rope_style=rope_mixed'
            if loaded != 'none'
            else 'has no learned rotary frequencies; set --config.model.rope_style to its style'
        )
    )
  layer = path.rsplit('/', 1)[0]
  if layer in FINAL_NORMS and has(params, layer) != has(targets, layer):
    norm = final_norm(params)  # The checkpoint's.
    if norm is None:
      fix = 'has no final LayerNorm; set --config.model.final_norm=False'
    else:
      fix = (
          f"normalises {'after' if norm == 'fc_norm' else 'before'} its pooling; set "
          f"--config.model.fc_norm={norm == 'fc_norm'}"
          + ('' if final_norm(targets) else ' and final_norm=True')
      )
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint {fix}, or '
        '--config.keep_head=False for a new head (a new LayerNorm starts at scale 1)'
    )
  if (
      re.search(r'(^|/)(LayerNorm_\d|\w*norm)/bias$', path)
      and has(params, layer)
      and has(targets, layer)
  ):
    # A norm with a scale and no bias is an RMSNorm.
    kind = 'layernorm' if loaded != 'none' else 'rmsnorm'
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has '
        f"{'LayerNorms' if kind == 'layernorm' else 'RMSNorms (no bias)'}; set "
        f'--config.model.norm_layer={kind}'
    )
  kv = re.search(r'/MultiHeadDotProductAttention_1/(key|value)/(kernel|bias)$', path)
  if (
      kv
      and 'none' not in (loaded, target)
      and (loaded[:-2], loaded[-1]) == (target[:-2], target[-1])
  ):
    heads = loaded[-2]
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has {heads} key and value '
        f'heads here; set --config.model.num_kv_heads={heads} (a tuple where blocks differ: '
        '--config.variant=checkpoint reads each)'
    )
  for pattern, field, what in STRUCTURE_FIELDS:
    if re.search(pattern, path) and 'none' in (loaded, target):
      present = loaded != 'none'
      return ValueError(
          f'{path}: checkpoint {loaded} vs model {target}: the checkpoint has '
          f"{'' if present else 'no '}{what}; set --config.model.{field}={present}"
      )
  if (
      re.search(r'/LayerNorm_2/(scale|bias)$', path)
      and 'none' in (loaded, target)
      and f'{layer.rsplit("/", 1)[0]}/LayerNorm_0/scale' in params
  ):
    parallel = loaded == 'none'  # One norm for both branches.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint '
        + ('runs' if parallel else 'does not run')
        + f' attention and MLP side by side; set --config.model.parallel_block={parallel}'
    )
  if path.endswith('/ls2') and all(
      f'{layer}/{name}' in tree
      for name in ('ls1', 'LayerNorm_2/scale')
      for tree in (params, targets)
  ):
    # Both scale the attention's branch, one the MLP's too: model.layer_scale_mlp.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: the checkpoint scales '
        + (
            "the attention's branch alone; set --config.model.layer_scale_mlp=False"
            if loaded == 'none'
            else 'both branches; unset --config.model.layer_scale_mlp'
        )
    )
  if re.search(r'/ls[12]$', path):  # Layer scale: a tensor per block, its value any positive one.
    return ValueError(
        f'{path}: checkpoint {loaded} vs model {target}: '
        + (
            'the checkpoint has layer scale; set --config.model.layer_scale=1e-5 (the '
            "checkpoint's scales replace the initial value)"
            if target == 'none'
            else 'the checkpoint has no layer scale; unset --config.model.layer_scale'
        )
    )
  return ValueError(
      f'{path}: checkpoint {loaded} vs model {target}: the checkpoint is another '
      'architecture; set --config.variant (and --config.model.*) to match it'
  )
