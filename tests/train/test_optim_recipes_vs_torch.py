"""Layer decay and the hybrid's parameter groups against timm's: the comparisons of
test_optim_recipes.py with the torch-based peers, which `make test-all` runs (they need the test
extra)."""

import functools
import re

import jax
import numpy as np
import pytest
import torch
from timm.layers import HybridEmbed
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer_hybrid import _resnetv2
from timm.optim import param_groups_layer_decay

import helpers
from vit_jax.train import param_groups
from vit_jax.checkpoints import timm_layout
from test_optim_recipes import _config, _flat, _params, _stack

# Our parameter prefixes for timm's names (the hybrid's ResNet stem has one stage here).
TIMM_NAMES = (
    (r'^cls_token$', 'cls'),
    (r'^dist_token$', 'dist'),
    (r'^reg_token$', 'reg'),
    (r'^pos_embed$', 'Transformer/posembed_input/'),
    (r'^patch_embed\.backbone\.stem\.conv\.', 'conv_root/'),
    (r'^patch_embed\.backbone\.stem\.norm\.', 'gn_root/'),
    (r'^patch_embed\.backbone\.stages\.0\.', 'block1/'),
    (r'^patch_embed\.proj\.', 'embedding/'),
    (r'^patch_embed\.norm\.', 'embedding_norm/'),
    (r'^norm_pre\.', 'Transformer/pre_norm/'),
    (r'^blocks\.(\d+)\.', r'Transformer/encoderblock_\1/'),
    (r'^norm\.', 'Transformer/encoder_norm/'),
    (r'^fc_norm\.', 'fc_norm/'),
    (r'^attn_pool\.', 'MAPHead_0/'),
    (r'^head\.', 'head/'),
    (r'^head_dist\.', 'head_dist/'),
)


# Per kind of model: our config fields, timm's VisionTransformer arguments.
MODEL_KINDS = {
    'token': ({}, {}),
    'gap': (
        {'model.classifier': 'gap', 'model.fc_norm': True},
        dict(global_pool='avg', class_token=False, fc_norm=True),
    ),
    'map': ({'model.classifier': 'map'}, dict(global_pool='map', class_token=False)),
    'registers': ({'model.num_registers': 2}, dict(reg_tokens=2)),
    # CLIP's norm before the blocks; AIMv2's norm of the patch embedding.
    'pre_norm': ({'model.pre_norm': True}, dict(pre_norm=True)),
    'embed_norm': ({'model.embed_norm': True}, dict(embed_norm_layer=torch.nn.LayerNorm)),
    # DeiT's distillation token and head: timm's VisionTransformerDistilled.
    'distilled': ({'model.distilled': True}, dict(timm_class=VisionTransformerDistilled)),
    'hybrid': (
        {'variant': 'R50+ViT-testing_4', 'model.resnet_layers': (1,)},  # Stride 4: 1x1 patches.
        dict(patch_size=1, embed_layer=functools.partial(HybridEmbed, backbone=_resnetv2((1,)))),
    ),
}


def _timm_scales(depth, kind):
  torch.manual_seed(0)
  kwargs = dict(MODEL_KINDS[kind][1])
  model = kwargs.pop('timm_class', TimmViT)(
      **{
          'img_size': 8,
          'patch_size': 4,
          'embed_dim': 32,
          'depth': depth,
          'num_heads': 2,
          'mlp_ratio': 2,
          'num_classes': 3,
          **kwargs,
      }
  )
  names = {id(p): name for name, p in model.named_parameters()}
  scales = {}  # Our prefix -> timm's lr_scale of the parameters it holds.
  for group in param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.75):
    for p in group['params']:
      prefix = next(
          re.match(pattern, names[id(p)]).expand(ours)
          for pattern, ours in TIMM_NAMES
          if re.match(pattern, names[id(p)])
      )
      assert scales.setdefault(prefix, group['lr_scale']) == group['lr_scale']
  return scales


@pytest.mark.parametrize('kind', list(MODEL_KINDS))
@pytest.mark.parametrize('scan', [False, True])
def test_layer_decay_multipliers_are_timms(kind, scan):
  depth = 3
  config = _config(
      MODEL_KINDS[kind][0],
      {'model.num_layers': depth, 'model.scan': scan, 'optim.layer_decay': 0.75},
  )
  scales = _timm_scales(depth, kind)
  params = _params(config)
  mults = param_groups.lr_multipliers(
      config.optim,
      helpers.model_config(config)['num_layers'],
      _stack(params, config) if scan else params,
  )
  checked = set()
  for path, mult in _flat(mults).items():
    per_layer = (
        [path.replace('encoderblock/', f'encoderblock_{i}/') for i in range(depth)]
        if '/encoderblock/' in path
        else [path]
    )
    got = np.broadcast_to(np.ravel(mult), len(per_layer))
    for layer_path, value in zip(per_layer, got):
      prefix = next(p for p in scales if layer_path == p or layer_path.startswith(p))
      assert value == pytest.approx(scales[prefix], rel=1e-12), layer_path
      checked.add(prefix)
  assert checked == set(scales)  # Every timm group has a counterpart here.
  assert len(set(scales.values())) == depth + 2  # Stem, blocks and head all differ.


@pytest.mark.parametrize(
    'timm_kwargs', [{}, {'class_token': False, 'global_pool': 'avg'}], ids=['token', 'gap_fc_norm']
)
def test_weight_decay_falls_on_what_timms_optimizer_decays(timm_kwargs):
  # timm's create_optimizer_v2 splits the parameters into a decayed and an undecayed group (no decay
  # for biases, norms, pos_embed and cls_token). Each timm tensor filled with 1 if it decays, else 0,
  # read into our tree: our mask must be True exactly on the ones.
  from timm.optim import create_optimizer_v2  # pylint: disable=g-import-not-at-top

  model = TimmViT(
      img_size=8,
      patch_size=4,
      embed_dim=32,
      depth=2,
      num_heads=2,
      mlp_ratio=2.0,
      num_classes=3,
      **timm_kwargs,
  )
  groups = create_optimizer_v2(model, 'adamw', weight_decay=0.05).param_groups
  decayed = {id(p) for group in groups if group['weight_decay'] > 0 for p in group['params']}
  flags = {
      name: np.full(p.shape, float(id(p) in decayed), np.float32)
      for name, p in model.named_parameters()
  }
  tree = timm_layout.from_state_dict(flags, num_heads=2)
  mask = dict(jax.tree_util.tree_leaves_with_path(param_groups.kernels_only(tree)))
  for key_path, value in jax.tree_util.tree_leaves_with_path(tree):
    assert np.all(value == float(mask[key_path])), param_groups.path_str(key_path)
  assert 0 < sum(mask.values()) < len(mask)
