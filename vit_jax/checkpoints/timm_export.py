"""Export to timm (`export`): our parameters as timm's state dict (timm_export_tensors.py) and the
config.json with which `timm.create_model('local-dir:DIR', pretrained=True)` builds the model: timm's
`VisionTransformer`, its `Eva` for what only that class computes (rotary embeddings, gated MLPs,
the MLP's norm: EVA-02, DINOv3), or its `Beit` for relative position biases (`timm_class`), with the
model arguments of our fields (timm_export_args.py) and the eval crop as timm's (`eval_crop`).
"""

from typing import Any, Mapping, Optional

import numpy as np

from vit_jax.checkpoints import adapting, timm_export_args, timm_export_beit, timm_export_tensors
from vit_jax.checkpoints.torch_files import StateDict
from vit_jax.models import posemb

# The model_args of each timm class an export builds (timm_export_args.timm_class), by the class.
ARGUMENTS = {
    'vision_transformer': timm_export_args.vision_transformer_args,
    'eva': timm_export_args.eva_args,
    'beit': timm_export_beit.beit_args,
}


def eval_crop(pp_eval: Mapping[str, Any], image_size: int) -> dict[str, Any]:
  """timm's `crop_pct` and `crop_mode` for the eval crop of `pp_eval` (a config.pp_eval), so that
  timm's `resolve_data_config` + `create_transform` prepare images as vit_jax's evaluation does.

  'resize' squashes the whole image to the square: timm's 'squash' at crop_pct 1. 'central' resizes the
  shorter side to int(image_size / crop_fraction), then takes the central square: timm's 'center'
  at crop_pct = crop_fraction.
  """
  if pp_eval['crop'] == 'resize':
    return {'crop_pct': 1.0, 'crop_mode': 'squash'}
  if pp_eval['crop'] != 'central':
    raise ValueError(
        f"config.pp_eval.crop={pp_eval['crop']!r} has no timm counterpart: use 'resize' or "
        "'central'"
    )
  return {'crop_pct': pp_eval['crop_fraction'], 'crop_mode': 'center'}


def _fixed_posemb_as_tensor(
    params: Any, model: Mapping[str, Any], image_size: int
) -> tuple[Any, dict[str, Any]]:
  """The parameters and model of learned position embeddings holding the fixed sin-cos ones of
  `image_size`'s grid, zero for the prefix tokens (as MAE's published weights hold theirs): the same
  function at that size, which timm's VisionTransformer computes."""
  grid = image_size // model['patch_size']
  tokens = np.zeros(
      (1, adapting.num_prefix_tokens(params) + grid * grid, model['hidden_size']), np.float32
  )
  table = posemb.POSEMBS[model['posemb']]().apply({}, tokens, (grid, grid))
  encoder = {**params['Transformer'], 'posembed_input': {'pos_embedding': np.asarray(table)}}
  return {**params, 'Transformer': encoder}, {**model, 'posemb': 'learn'}


def export(
    params: Any,
    model: Mapping[str, Any],
    image_size: int,
    num_classes: Optional[int],
    class_names: Optional[list[str]] = None,
    *,
    pp_eval: Mapping[str, Any],
) -> tuple[StateDict, dict[str, Any]]:
  """timm's state dict of `params` and the config.json with which
  `timm.create_model('local-dir:DIR', pretrained=True)` builds this model and loads it. Images are in
  [-1, 1]: mean = std = 0.5. Its preprocessing is the run's `pp_eval` (`eval_crop`), resized with
  PIL's bilinear filter, which always antialiases: pp_eval.antialias=True's resize (without it, a
  shrunk image differs) of the image decoded at its full size (with pp_eval.reducing_gap, a JPEG
  far larger than the crop differs by its reduced decoding). Fixed sin-cos position embeddings are
  written as the tensor they are at `image_size`. What timm's class cannot compute is a one-line
  ValueError."""
  pools = timm_export_args.GLOBAL_POOLS
  if model['classifier'] not in pools:
    raise ValueError(
        f"timm's ViTs pool as model.classifier {', '.join(pools)} do, not as "
        f"{model['classifier']!r}"
    )
  if model['posemb_where'] != 'input':  # 'shared_every_layer' has the tree of 'input'.
    raise ValueError(
        "timm's ViTs add position embeddings only at the input "
        f"(model.posemb_where={model['posemb_where']})"
    )
  if model['posemb'] in posemb.SINCOS:
    params, model = _fixed_posemb_as_tensor(params, model, image_size)
  cls = timm_export_args.timm_class(model)
  architecture, model_args = ARGUMENTS[cls](model)
  pretrained_cfg = {
      'input_size': [3, image_size, image_size],
      'fixed_input_size': True,
      'mean': [0.5] * 3,
      'std': [0.5] * 3,
      'interpolation': 'bilinear',
      **eval_crop(pp_eval, image_size),
      'num_classes': num_classes or 0,
      # What timm drops for another num_classes (a new head, or none): its own save_for_hf's key.
      'classifier': ['head', 'head_dist'] if model.get('distilled') else 'head',
  }
  if class_names:
    pretrained_cfg['label_names'] = list(class_names)
  config = {
      'architecture': architecture,
      'num_classes': num_classes or 0,
      'num_features': model['hidden_size'],
      'model_args': {'img_size': image_size, **model_args},
      'pretrained_cfg': pretrained_cfg,
  }
  return timm_export_tensors.to_state_dict(params, cls), config
