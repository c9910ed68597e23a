"""Every field of the defaults, given an invalid value, is a one-line error from setup before the
workdir is touched. A field added to vit_jax/defaults.py without an entry here fails the last test.
"""

import os
import re

import ml_collections
import pytest

import helpers
from vit_jax import defaults
from vit_jax.train import setup as train_setup

# field: (invalid value, other overrides it needs to matter, a pattern of the message).
FEWSHOT_ON = {'fewshot.every_steps': 6}
KNN_ON = {'knn.every_steps': 6}
INVALID = {
    'accum_steps': (0, {}, 'accum_steps=0 must be at least 1'),
    'asl.clip': (
        1.0,
        {'loss': 'asl'},
        r'^config\.asl\.clip=1\.0 must be a number >= 0 and < 1 \(unset: 0\.05\)$',
    ),
    'asl.gamma_neg': (
        -1.0,
        {'loss': 'asl'},
        r'^config\.asl\.gamma_neg=-1\.0 must be a number >= 0 \(unset: 4\.0\)$',
    ),
    'asl.gamma_pos': (
        float('inf'),
        {'loss': 'asl'},
        r'^config\.asl\.gamma_pos=inf must be a number >= 0 \(unset: 1\.0\)$',
    ),
    'batch_size': (0, {}, 'batch_size=0 must be at least 1 image'),
    'best_checkpoint.metric': (
        'eval_top',
        {},
        r"^config\.best_checkpoint\.metric='eval_top' is not a metric this run logs: use one of "
        r'eval_loss, eval_top1, eval_top5 \(_polyak_ ones: set config\.polyak_decay\)$',
    ),
    'best_checkpoint.patience': (
        0,
        {'best_checkpoint.metric': 'eval_top1'},
        r'^config\.best_checkpoint\.patience=0 must be a number of evaluations >= 1 \(unset: the '
        r'run trains to the end\)$',
    ),
    'best_checkpoint.mode': (
        'maximum',
        {'best_checkpoint.metric': 'eval_top1'},
        r"^config\.best_checkpoint\.mode='maximum' must be one of max, min \(unset: min for a "
        r'metric ending in loss, else max\)$',
    ),
    'checkpoint_every_steps': (0, {}, 'checkpoint_every_steps=0 must be at least 1'),
    'data_dir': ('MISSING', {'dataset': 'folder'}, 'does not exist'),
    'data_shards': (0, {}, 'data_shards=0 must be at least 1'),
    'dataset': ('no_such_dataset', {}, "Unknown dataset 'no_such_dataset'"),
    'dtype': ('float64', {}, "Unknown config.dtype 'float64'"),
    'eval_batch_size': (12, {}, 'eval_batch_size=12 is not divisible'),
    'eval_every_steps': (0, {}, r"'eval': every_steps=0 must be.*--config.eval_every_steps"),
    'eval_split': ('validation', {}, "'validation'"),
    'fewshot.eval_split': ('validation', FEWSHOT_ON, "'validation'"),
    'fewshot.every_steps': (0, {}, "'fewshot': every_steps=0"),
    'fewshot.l2_reg': (0.0, FEWSHOT_ON, 'l2_reg > 0'),
    'fewshot.seeds': (0, FEWSHOT_ON, 'seeds >= 1'),
    'fewshot.shots': ((0, 5), FEWSHOT_ON, r'shots=\(0, 5\) must be positive'),
    'fewshot.train_split': ('validation', FEWSHOT_ON, "'validation'"),
    'grad_clip_norm': (-1.0, {}, 'grad_clip_norm=-1.0'),
    'knn.eval_split': ('validation', KNN_ON, "'validation'"),
    'knn.every_steps': (0, {}, "'knn': every_steps=0"),
    'knn.ks': ((0, 5), KNN_ON, r'knn.ks=\(0, 5\) must be positive'),
    'knn.temperature': (0.0, KNN_ON, r'knn.temperature=0.0 must be > 0'),
    'knn.train_split': ('validation', KNN_ON, "'validation'"),
    'hang_timeout_s': (
        0.5,
        {},
        r'config\.hang_timeout_s=0\.5 must be 0 \(no watchdog\) or at least 10 seconds, e\.g\. 1800',
    ),
    'skip_nonfinite_steps': (
        -1,
        {},
        r'config\.skip_nonfinite_steps=-1 must be at least 0 '
        r'\(0: stop at the first non-finite step\)',
    ),
    'image_size': (10, {}, 'image_size=10 is not divisible by the patch size 4'),
    'init_from': ('MISSING/model.npz', {}, 'no checkpoint file'),
    'keep_checkpoints': (0, {}, 'keep_checkpoints=0 must be at least 1'),
    'keep_head': (
        True,
        {},
        r'^config\.keep_head=True keeps part of the config\.init_from checkpoint, '
        r'which is unset: set --config\.init_from=PATH or --config\.keep_head=False$',
    ),
    'keep_pre_logits': (
        True,
        {},
        r'^config\.keep_pre_logits=True keeps part of the config\.init_from '
        'checkpoint, which is unset',
    ),
    'label_feature': ('fine_label', {}, r"has no ClassLabel .* feature 'fine_label'"),
    'label_smoothing': (1.5, {}, r'label_smoothing=1.5 must be in \[0, 1\)'),
    'log_every_steps': (0, {}, 'log_every_steps=0 must be at least 1'),
    'loss': ('hinge', {}, "Unknown config.loss 'hinge'"),
    'lr.base': (-1.0, {}, 'lr.base=-1.0'),
    'lr.decay': ('step', {}, "Unknown lr.decay 'step'"),
    'lr.end': (-1.0, {}, 'lr.end=-1.0'),
    'lr.warmup_steps': (-1, {}, 'lr.warmup_steps=-1'),
    'mesh': ((('data', 3),), {}, 'multiply to 3, but there are 8 devices'),
    'model.attention': ('flash', {}, "Unknown model.attention 'flash'"),
    'model.matmul': ('int8', {}, "Unknown model.matmul 'int8': use one of default, fp8"),
    'model.lora_rank': (0, {}, r'^model.lora_rank=0 must be a positive integer, e.g. 8'),
    'model.lora_alpha': (
        16.0,
        {},
        r'^model.lora_alpha=16.0 shapes low-rank adapters, and model.lora_rank is unset: set '
        r'--config.model.lora_rank',
    ),
    'model.lora_targets': (
        ('query', 'qkv'),
        {'model.lora_rank': 4},
        r"^Unknown model.lora_targets entry 'qkv': use some of query, key, value, out, mlp_in, "
        r'mlp_out, as a tuple, e.g. --config.model.lora_targets="\(\'query\', \'value\'\)"$',
    ),
    'model.lora_dropout': (
        1.0,
        {'model.lora_rank': 4},
        r'^model.lora_dropout=1.0 must be in \[0, 1\), e.g. 0.1$',
    ),
    'model.attention_dropout_rate': (1.5, {}, 'attention_dropout_rate=1.5'),
    'model.classifier': ('mean', {}, "Unknown model.classifier 'mean'"),
    'model.dropout_rate': (-0.1, {}, 'dropout_rate=-0.1'),
    'model.head_dropout_rate': (1.0, {}, r'model.head_dropout_rate=1.0 must be in \[0, 1\)'),
    'model.head_bias_init': (float('inf'), {}, r'model.head_bias_init=inf must be a finite number'),
    'model.drop_path_rate': (1.0, {}, r'model.drop_path_rate=1.0 must be in \[0, 1\)'),
    'wandb.project': ('', {}, r"^config\.wandb\.project='' must be a non-empty string, or unset$"),
    'wandb.entity': (
        'my-team',
        {},
        r'^config\.wandb\.entity is for a Weights & Biases run, and config\.wandb\.project is '
        r'unset, so nothing is logged there: set --config\.wandb\.project=PROJECT$',
    ),
    'wandb.name': ('', {'wandb.project': 'p'}, r"^config\.wandb\.name='' must be a non-empty"),
    'wandb.group': ('', {'wandb.project': 'p'}, r"^config\.wandb\.group='' must be a non-empty"),
    'wandb.tags': (
        ('a', 1),
        {'wandb.project': 'p'},
        r"^config\.wandb\.tags=\('a', 1\) must be a tuple of strings",
    ),
    'model.patch_dropout': (
        1.0,
        {},
        r'^model\.patch_dropout=1\.0 must be in \[0, 1\): the share of the patches dropped at '
        r'train time, e\.g\. 0\.5 \(0: none\)$',
    ),
    'model.fc_norm': (
        True,
        {},
        r"model.fc_norm=True changes nothing with model.classifier='token'",
    ),
    'model.final_norm': (
        False,
        {'model.classifier': 'gap', 'model.fc_norm': True},
        r'model.fc_norm=True puts the final LayerNorm after the pooling, and '
        r'model.final_norm=False has none',
    ),
    'model.posemb': ('sincos', {}, r"Unknown model.posemb 'sincos'"),
    'model.norm_layer': ('batchnorm', {}, r"Unknown model.norm_layer 'batchnorm'"),
    'model.posemb_where': ('stem', {}, r"Unknown model.posemb_where 'stem'"),
    'model.mlp_activation': (
        'relu',
        {},
        r"Unknown model.mlp_activation 'relu': use one of gelu_tanh, gelu",
    ),
    'model.layer_scale': (
        -1e-5,
        {},
        r'model.layer_scale=-1e-05 must be a positive finite initial scale',
    ),
    'model.layer_scale_mlp': (
        False,
        {},
        r'^model\.layer_scale_mlp=False leaves the MLP unscaled, and without model\.layer_scale',
    ),
    'model.num_kv_heads': (
        3,
        {},
        r'^model\.num_kv_heads=3 must be a number of key/value heads that divides num_heads=',
    ),
    'model.num_registers': (-1, {}, r'model.num_registers=-1 must be a whole number of tokens'),
    'model.class_token': (
        False,
        {},
        r"model.classifier='token' pools the class token, and model.class_token=False has none: "
        r'set --config.model.class_token=True, or classifier=gap \(or map\)$',
    ),
    'model.distilled': (
        True,
        {'model.classifier': 'gap'},
        r"model.distilled=True \(DeiT's distillation token and head\) takes the class token",
    ),
    'model.layernorm_epsilon': (
        0.0,
        {},
        r'model.layernorm_epsilon=0.0 must be in \(0, 1\)',
    ),
    'model.weight_init': (
        'xavier',
        {},
        r"Unknown model.weight_init 'xavier': use one of original, timm",
    ),
    'model.hidden_size': (33, {}, 'hidden_size=33 is not divisible by num_heads=2'),
    'model.mlp_dim': (0, {}, 'mlp_dim=0'),
    'model.num_heads': (0, {}, 'num_heads=0'),
    'model.num_layers': (0, {}, 'num_layers=0'),
    'model.patch_size': (0, {}, 'patch_size=0'),
    'model.remat': ('everything', {}, "Unknown model.remat policy 'everything'"),
    'model.representation_size': (0, {}, 'representation_size=0'),
    'model.resnet_layers': ((3, -1), {}, r'resnet_layers=\(3, -1\)'),
    'model.resnet_width_factor': (0.0, {}, 'resnet_width_factor=0.0'),
    'mae.mask_ratio': (1.0, {}, r'mae.mask_ratio=1.0 must be in \(0, 1\)'),
    'mae.decoder_hidden_size': (30, {}, r'decoder_hidden_size=30 does not divide into .*16 heads'),
    'mae.decoder_num_layers': (0, {}, 'mae.decoder_num_layers=0 must be a positive whole number'),
    'mae.decoder_num_heads': (0, {}, 'mae.decoder_num_heads=0 must be a positive whole number'),
    'mae.decoder_mlp_dim': (-1, {}, 'mae.decoder_mlp_dim=-1 must be a positive whole number'),
    'mae.decoder_posemb': ('rope', {}, "Unknown config.mae.decoder_posemb 'rope': use one of"),
    'mae.target_mean': (
        (0.5,),
        {},
        r'^config\.mae\.target_mean=\(0\.5,\) and target_std=None go together: 3 means',
    ),
    'mae.target_std': (
        (0.2, 0.2, 0.0),
        {'mae.target_mean': (0.5, 0.5, 0.5)},
        r'target_std=\(0\.2, 0\.2, 0\.0\) go together: 3 means and 3 positive stds',
    ),
    # Valid of a task='mae' run, and nothing it could do in another.
    'mae.norm_pix_loss': (
        False,
        {},
        r'^config\.mae\.norm_pix_loss=False shapes the masked autoencoder, and '
        r"config\.task='classification': set --config\.task=mae, or leave config\.mae as it is$",
    ),
    'mpp.mask_rate': (0.0, {}, r'mpp.mask_rate=0.0 must be in \(0, 1\]'),
    'mpp.num_bits': (0, {}, 'mpp.num_bits=0 must be in 1..8'),
    'num_epochs': (-1.0, {'total_steps': None}, 'The run has -'),
    'optim.b1': (1.0, {}, 'b1=1.0'),
    'optim.b2': (-0.1, {}, 'b2=-0.1'),
    'optim.momentum': (1.0, {'optim.name': 'sgd'}, 'momentum=1.0'),
    'optim.name': ('lamb', {}, "Unknown optim.name 'lamb'"),
    'optim.weight_decay': (-0.1, {}, 'weight_decay=-0.1'),
    'optim.layer_decay': (1.5, {}, r'^config.optim.layer_decay=1.5 must be in \(0, 1\]'),
    'optim.mu_dtype': ('int8', {}, r"^config.optim.mu_dtype='int8' must name a float dtype"),
    'optim.lr_mults': (
        (('head', 0.0),),
        {},
        r"^config.optim.lr_mults\[0\]=\('head', 0.0\): the " 'multiplier must be > 0',
    ),
    'optim.wd_mults': ((('(', 1.0),), {}, r"^config.optim.wd_mults\[0\]='\(' is not a valid regex"),
    'optim.frozen': ((3,), {}, r'^config.optim.frozen\[0\]=3 must be a regex string'),
    'optim.trained': (
        ('^hed',),
        {},
        r"^config.optim.trained regex '\^hed' matches no parameter: fix it",
    ),
    'polyak_decay': (1.0, {}, r'polyak_decay=1.0 must be in \[0, 1\)'),
    'posemb_interpolation': ('nearest', {}, "Unknown config.posemb_interpolation 'nearest'"),
    'patch_interpolation': ('area', {}, "Unknown config.patch_interpolation 'area'"),
    'aug_repeats': (0, {}, r'^config.aug_repeats=0 must be a whole number of copies of each image'),
    'flexi.patch_sizes': ((4, 4), {}, r'^config.flexi.patch_sizes=\(4, 4\) must be distinct whole'),
    'flexi.weights': (
        (1.0, 0.0),
        {'flexi.patch_sizes': (2, 4)},
        r'^config.flexi.weights=\(1.0, 0.0\) must be one positive number per patch size \(2\)',
    ),
    'flexi.kernel_size': (
        0,
        {'flexi.patch_sizes': (2, 4)},
        r'^config.flexi.kernel_size=0 must be a positive whole number',
    ),
    'flexi.posemb_grid': (
        -7,
        {'flexi.patch_sizes': (2, 4)},
        r'^config.flexi.posemb_grid=-7 must be a positive whole number',
    ),
    'pp.crop': ('centre', {}, "Unknown config.pp.crop 'centre'"),
    'pp.min_area': (0.0, {'pp.crop': 'inception'}, r'min_area=0.0 must be in \(0, 1\]'),
    'pp.pad': (-1, {'pp.crop': 'random'}, 'pad=-1 must be >= 0'),
    'pp.randaug_layers': (-1, {}, r'config\.pp\.randaug_layers=-1 must be >= 0'),
    'pp.randaug_magnitude': (25, {}, r'config\.pp\.randaug_magnitude=25 must be in \[0, 20\]'),
    'pp.color_jitter': (-0.1, {}, r'config\.pp\.color_jitter=-0\.1 must be finite and >= 0'),
    'pp.erase_prob': (1.5, {}, r'config\.pp\.erase_prob=1\.5 must be in \[0, 1\]'),
    'pp.erase_area': (
        (0.5, 0.2),
        {},
        r'config\.pp\.erase_area=.* must be \(min, max\) area fractions',
    ),
    'pp.erase_aspect': ((0.0, 3.0), {}, r'config\.pp\.erase_aspect=.* must be \(min, max\) aspect'),
    'pp.reducing_gap': (0.5, {}, r'config\.pp\.reducing_gap=0\.5 must be 0 .* or >= 1'),
    'pp_eval.crop': ('center', {}, r"Unknown config\.pp_eval\.crop 'center'"),
    'pp_eval.reducing_gap': (-2.0, {}, r'config\.pp_eval\.reducing_gap=-2\.0 must be 0 .* or >= 1'),
    'pp_eval.crop_fraction': (1.2, {}, r'config\.pp_eval\.crop_fraction=1\.2 must be in \(0, 1\]'),
    'mix.mixup_alpha': (-0.1, {}, r'mix\.mixup_alpha=-0\.1 must be at least 0'),
    'mix.cutmix_alpha': (-1.0, {}, r'mix\.cutmix_alpha=-1\.0 must be at least 0'),
    'mix.prob': (1.5, {}, r'mix\.prob=1\.5 must be in \[0, 1\]'),
    'distill.teacher': (
        '/nonexistent/run',
        {},
        r"config\.distill\.teacher='/nonexistent/run': '/nonexistent/run' has no checkpoints/ "
        r'directory: pass the workdir of a vit_jax run that has saved a checkpoint$',
    ),
    # Without a teacher the other distill fields would do nothing (their ranges: test_distillation).
    'distill.kind': ('kl', {}, r"config\.distill\.kind='kl' has no teacher to distil from"),
    'distill.alpha': (1.5, {}, r'config\.distill\.alpha=1\.5 has no teacher to distil from'),
    'distill.temperature': (0.0, {}, r'config\.distill\.temperature=0\.0 has no teacher'),
    'distill.teacher_image_size': (
        16,
        {},
        r'config\.distill\.teacher_image_size=16 has no teacher',
    ),
    'distill.teacher_step': (8, {}, r'config\.distill\.teacher_step=8 has no teacher'),
    'mix.switch_prob': (-0.5, {}, r'mix\.switch_prob=-0\.5 must be in \[0, 1\]'),
    'mix.until_step': (0, {}, r'mix\.until_step=0 must be at least 1'),
    'seed': (
        2**63,
        {},
        r'^config\.seed=9223372036854775808 must be a signed 64-bit integer, e.g. '
        r'--config\.seed=0$',
    ),
    'profile_steps': (-1, {}, r'config\.profile_steps=-1 must be at least 0 \(0: no trace\)'),
    'data_workers': (-1, {}, r'config\.data_workers=-1 must be from 0 worker processes'),
    'device_prefetch': (-1, {}, r'config\.device_prefetch=-1 must be from 0 to 32 batches'),
    'storage_timeout_s': (0.0, {}, 'storage_timeout_s=0.0 must be a positive number'),
    'task': ('detection', {}, "Unknown config.task 'detection'"),
    'total_steps': (0, {}, 'The run has 0 steps'),
    'train_split': ('validation', {}, "'validation'"),
    'variant': ('ViT-Q_16', {}, "Unknown model variant 'ViT-Q_16'"),
    'model.rope': (True, {'model.num_heads': 16}, r'num_heads = 2 must be a multiple of 4'),
    'model.rope_grid': (
        (16, 16),
        {},
        r'model\.rope_grid=\(16, 16\) must be .* with model\.rope=True',
    ),
    'model.map_heads': (
        3,
        {'model.classifier': 'map'},
        r'^model\.map_heads=3 must be a positive number of heads that divides '
        r'model\.hidden_size=32',
    ),
    'model.map_mlp_dim': (
        0,
        {'model.classifier': 'map'},
        r'^model\.map_mlp_dim=0 must be a positive width \(or unset: model\.mlp_dim\)$',
    ),
    'model.map_include_prefix': (
        True,
        {},
        r"^model\.map_include_prefix=True shapes the MAP head, and model\.classifier='token' has "
        r'none: set --config\.model\.classifier=map',
    ),
    'model.rope_style': (
        'dinov2',
        {'model.rope': True},
        r"^model\.rope_style='dinov2' must be one of eva02, rope_vit, pe, eva02_xy, rope_mixed, dinov3, with model\.rope=True",
    ),
}
# Their errors are about 8 devices (make test's); elsewhere another value is the error.
ON_EIGHT_DEVICES = ('eval_batch_size', 'mesh')
# Fields for which every value of their type is valid.
ALWAYS_VALID = {
    'model.scan': 'a bool',
    'model.pre_norm': 'a bool',
    'model.qk_norm': 'a bool',
    'model.key_bias': 'a bool',
    'model.attn_norm': 'a bool',
    'model.embed_norm': 'a bool',
    'model.mlp_gated': 'a bool',
    'model.mlp_norm': 'a bool',
    'model.res_post_norm': 'a bool',
    'model.parallel_block': 'a bool',
    'model.diff_attention': 'a bool',
    'pp.flip': 'a bool',
    'pp.antialias': 'a bool',
    'pp_eval.antialias': 'a bool',
    'pp.three_augment': 'a bool',
}
MPP = {'task': 'mpp', 'model.head_dropout_rate': None}
MAE = {'task': 'mae', 'model.head_dropout_rate': None, 'label_smoothing': 0.0}
# More invalid values, each once a traceback (at once, or at the first step after the workdir was
# written) or a run that ignored the field: (overrides, a pattern of the message).
ALSO_INVALID = {
    # --config.init_from=$CKPT with CKPT unset: a fine-tune trained from scratch, silently.
    'an empty init_from': (
        {'init_from': ''},
        r'^config\.init_from is empty \(--config\.init_from=\$VAR of an unset variable\?\): give',
    ),
    'an empty data_dir': ({'data_dir': ''}, r'^config\.data_dir is empty'),
    # The demo's config with a folder of one's own images: it trained on the digits, without a word.
    'a data_dir of images with the digits': (
        {'data_dir': os.path.join(helpers.REPO, 'tests')},
        r"^config\.data_dir='.*/tests' is not read: config\.dataset='digits' is the bundled digits; "
        r'train on it with --config\.dataset=folder \(class folders\) or huggingface',
    ),
    'a hub dataset with the digits': (
        {'data_dir': 'hf-hub:org/pets'},
        r"^config\.data_dir='hf-hub:org/pets' is not read: config\.dataset='digits'",
    ),
    # Each spawned for minutes, then the machine ran out of memory.
    'a thousand data workers': (
        {'data_workers': 1000},
        r'^config\.data_workers=1000 must be from 0 worker processes \(threads of this process '
        r'only\) to \d+ \(4 for each of the \d+ cores this process may use\)',
    ),
    # The first step waited for that many batches on the devices: hours of reading, then out of memory.
    'a hundred thousand batches ahead': (
        {'device_prefetch': 100000},
        r'^config\.device_prefetch=100000 must be from 0 to 32 batches',
    ),
    # `--config.optim.frozen=`: ('',), a pattern every parameter matches; the run trained nothing.
    'an empty frozen pattern': (
        {'optim.frozen': ('',)},
        r"^config\.optim\.frozen\[0\]='' matches every parameter, freezing them all: give",
    ),
    # It failed in the first batch's augmentation, as data that could not be read.
    'an infinite colour jitter': (
        {'pp.color_jitter': float('inf')},
        r'^config\.pp\.color_jitter=inf must be finite and >= 0',
    ),
    # Tracebacks: 1.5 is no tuple; 3.5 passed its check and failed in the model, after writing.
    'key heads of a fraction': (
        {'model.num_kv_heads': 1.5},
        r'^model\.num_kv_heads=1\.5 must be a number of key/value heads that divides',
    ),
    'a fraction of resnet units': (
        {'model.resnet_layers': (3.5,)},
        r'^model\.resnet_layers=\(3\.5,\) must be positive numbers of units per stage',
    ),
    # 625,000,000 patches: it wrote the workdir's files, then allocated and compiled for hours.
    'an image of more tokens than any device holds': (
        {'image_size': 100_000},
        r'^--config\.image_size=100000 cuts each image into 625,000,000 tokens of 4 px, more than '
        r'1,048,576 \(a 4096 px image\): use a smaller image size or larger patches$',
    ),
    'a MAP head width without a MAP head': (
        {'model.map_mlp_dim': 64},
        r"^model\.map_mlp_dim=64 shapes the MAP head, and model\.classifier='token' has none",
    ),
    'key heads for some blocks only': (
        {'model.num_kv_heads': (1,)},
        r'^model\.num_kv_heads=\(1,\) must be .*, or a tuple of one per block \(\d+\); or unset$',
    ),
    'scanned blocks of other key heads': (
        {'model.scan': True, 'model.num_kv_heads': (1, 2), 'model.num_layers': 2},
        r'^model\.num_kv_heads=\(1, 2\) differs between blocks, which model\.scan=True runs as '
        r'one: set --config\.model\.scan=False$',
    ),
    'a parallel block with res-post-norms': (
        {'model.parallel_block': True, 'model.res_post_norm': True},
        r'^model\.parallel_block=True sums the attention and the MLP of one norm, which '
        r'model\.res_post_norm=True splits: unset one of them$',
    ),
    'differential attention of rotary embeddings': (
        {'model.diff_attention': True, 'model.rope': True},
        r'^model\.diff_attention=True does not take model\.rope=True: set '
        r'--config\.model\.rope=False \(no model to match turns the halves\)$',
    ),
    'differential attention of odd head widths': (
        {'model.diff_attention': True, 'model.hidden_size': 36, 'model.num_heads': 4},
        r'^model\.diff_attention=True splits each head in halves: its width hidden_size / '
        r'num_heads = 9 must be even',
    ),
    'token_gap without a class token': (
        {'model.classifier': 'token_gap', 'model.class_token': False},
        r"^model.classifier='token_gap' pools the class token, and model.class_token=False has none",
    ),
    'a setting of the asymmetric loss with another loss': (
        {'asl.gamma_neg': 2.0},
        r"^config\.asl\.gamma_neg=2\.0 shapes the asymmetric loss, and config\.loss='softmax_xent' "
        r'is another: set --config\.loss=asl, or unset config\.asl\.gamma_neg$',
    ),
    'a best checkpoint ordered by no metric': (
        {'best_checkpoint.mode': 'min'},
        r"^config\.best_checkpoint\.mode='min' acts on config\.best_checkpoint\.metric, which is "
        r'unset: set it too',
    ),
    'patience without a metric to be patient about': (
        {'best_checkpoint.patience': 3},
        r'^config\.best_checkpoint\.patience=3 acts on config\.best_checkpoint\.metric, which is '
        r'unset: set it too .* or unset the patience$',
    ),
    'a best checkpoint of the Polyak average of a run that keeps none': (
        {'best_checkpoint.metric': 'eval_polyak_top1'},
        r"^config\.best_checkpoint\.metric='eval_polyak_top1' is not a metric this run logs",
    ),
    'a best checkpoint of a few-shot accuracy the run does not measure': (
        {'best_checkpoint.metric': 'fewshot_7shot', 'fewshot.every_steps': 6},
        r'use one of eval_loss, eval_top1, eval_top5, fewshot_10shot, fewshot_1shot, '
        r'fewshot_25shot, fewshot_5shot \(',
    ),
    'infinite epochs': (
        {'total_steps': None, 'num_epochs': float('inf')},
        r'^config\.num_epochs=inf must be a finite number of passes',
    ),
    'NaN epochs': (
        {'total_steps': None, 'num_epochs': float('nan')},
        r'^config\.num_epochs=nan must be a finite number of passes',
    ),
    'endless storage timeout': (
        {'storage_timeout_s': float('inf')},
        r'^config\.storage_timeout_s=inf must be a positive number of seconds up ' 'to',
    ),
    'string mesh size': (
        {'mesh': (('data', '8'),)},
        r"^config\.mesh size '8' must be a positive integer " r'or -1',
    ),
    'float mesh size': (
        {'mesh': (('data', 2.5),)},
        r'^config\.mesh size 2\.5 must be a positive integer',
    ),
    'bool mesh size': (
        {'mesh': (('data', True),)},
        r'^config\.mesh size True must be a positive integer',
    ),
    'infinite mixup': (
        {'mix.mixup_alpha': float('inf')},
        r'^config\.mix\.mixup_alpha=inf must be at least 0 \(0: off\) and finite',
    ),
    'infinite cutmix': (
        {'mix.cutmix_alpha': float('inf')},
        r'^config\.mix\.cutmix_alpha=inf must be',
    ),
    'until_step without mixing': (
        {'mix.until_step': 5},
        r'^config\.mix\.until_step=5 ends a mixing that '
        r'is off .*--config\.mix\.mixup_alpha=0\.8$',
    ),
    'mpp with another loss': (
        {**MPP, 'loss': 'sigmoid_xent'},
        r'^config\.task=mpp trains on the softmax_xent .*, not '
        r"config\.loss='sigmoid_xent': set --config\.loss=softmax_xent$",
    ),
    'mae with label smoothing': (
        {**MAE, 'label_smoothing': 0.1},
        r"^config\.task=mae trains on the squared error of the hidden patches' pixels: leave "
        r"config\.loss at 'softmax_xent' and config\.label_smoothing at 0$",
    ),
    'mae with mixup': ({**MAE, 'mix.mixup_alpha': 0.8}, r'^config\.task=mae has no labels to mix'),
    'mae of a hybrid': (
        {**MAE, 'model.resnet_layers': (1,), 'image_size': 16},
        r"^config\.task=mae: a hybrid's ResNet stem would see the hidden patches' pixels",
    ),
    'mae with relative position embeddings': (
        {**MAE, 'model.posemb': 'relative'},
        r"^config\.task=mae: .*config\.model\.posemb other than 'relative'$",
    ),
    'mpp field without mpp': (
        {'mpp.num_bits': 4},
        r'^config\.mpp\.num_bits=4 shapes masked patch prediction, and '
        r"config\.task='classification': set --config\.task=mpp, or leave config\.mpp as it is$",
    ),
    # Unused by the run (no every_steps), but the fewshot tool's defaults for its checkpoints.
    'fewshot seeds of a run without few-shot': (
        {'fewshot.seeds': 0},
        r'^config\.fewshot needs seeds >= 1 \(a whole number\) and l2_reg > 0',
    ),
    'knn temperature of a run without k-NN': (
        {'knn.temperature': -1.0},
        r'^config\.knn\.temperature=-1\.0 must be > 0',
    ),
    'mae with rope': ({**MAE, 'model.rope': True}, r'^config\.task=mae: RoPE of a masked grid'),
    # The fix is a variant: model.block is no field (its name sets it).
    'resnet width of a pure vit': (
        {'model.resnet_width_factor': 2.0},
        r"^model\.resnet_width_factor=2\.0 widens a hybrid's ResNet stem, which a pure ViT has not",
    ),
    # GroupNorm's 32 groups of 16 channels: a traceback at the model's init.
    'a hybrid stem too narrow for its groups': (
        {'variant': 'R50+ViT-testing_16', 'model.resnet_width_factor': 0.25},
        r'^model\.resnet_width_factor=0\.25 gives 16 root channels, not a positive multiple of '
        r"GroupNorm's 32 groups: use a multiple of 0\.5$",
    ),
    'mae of an axial vit': (
        {**MAE, 'variant': 'Axial-ViT-testing_4', 'model.classifier': 'gap'},
        r'^config\.task=mae: axial blocks .*: use a ViT-\* variant, not an Axial-ViT$',
    ),
    'mae hiding every patch': (
        {**MAE, 'mae.mask_ratio': 0.99},
        r'^config\.mae\.mask_ratio=0\.99 hides all 4 patches of an image: lower it',
    ),
    'mae with a sin-cos decoder of odd width': (
        {**MAE, 'mae.decoder_hidden_size': 18, 'mae.decoder_num_heads': 2},
        r"^config\.mae\.decoder_posemb='sincos2d_mae' needs a config\.mae\.decoder_hidden_size",
    ),
    'misspelt field': (
        {'lr.warmup': 5},
        r'^config\.lr\.warmup is not a field of the config, so it would '
        r'change nothing: .*did you mean config\.lr\.warmup_steps\?$',
    ),
    'misspelt top-level field': (
        {'label_smothing': 0.1},
        r'did you mean config\.label_smoothing\?$',
    ),
    'unknown field': ({'pp.sharpen': 2}, r'^config\.pp\.sharpen is not a field of the config'),
    'replaced dict': (
        {'pp': {'crop': 'resize'}},
        r'^config\.pp\.antialias is missing: set the fields of '
        r'config\.pp one by one instead of replacing the dict',
    ),
    'dict unset': ({'pp_eval': None}, r'^config\.pp_eval=None must be the dict of fields'),
    # A field only another crop reads, changed from its default (it would do nothing).
    'pad without its crop': (
        {'pp.pad': 4},
        r"^config\.pp\.pad=4 is a field of the crop 'random' only, not "
        r"config\.pp\.crop='inception': set --config\.pp\.crop=random, or --config\.pp\.pad=0$",
    ),
    'min_area without its crop': (
        {'pp.crop': 'resize', 'pp.min_area': 0.3},
        r"^config\.pp\.min_area=0\.3 is a field of the crop 'inception' or 'random_resized' only, "
        r"not config\.pp\.crop='resize': set --config\.pp\.crop=inception, or "
        r'--config\.pp\.min_area=0\.05$',
    ),
    'crop_fraction without its crop': (
        {'pp_eval.crop_fraction': 0.5},
        r'^config\.pp_eval\.crop_fraction=0\.5 is a field of the crop .central. only, not '
        r"config\.pp_eval\.crop='resize': set --config\.pp_eval\.crop=central",
    ),
    'infinite few-shot l2_reg': ({**FEWSHOT_ON, 'fewshot.l2_reg': float('inf')}, 'l2_reg > 0'),
    'NaN few-shot l2_reg': ({**FEWSHOT_ON, 'fewshot.l2_reg': float('nan')}, 'l2_reg > 0'),
    'end of a constant rate': (
        {'lr.decay': 'constant', 'lr.end': 1e-5},
        r"^config\.lr\.end=1e-05 is where a decay ends, and lr\.decay='constant'",
    ),
    'cosine from 0 to an end': (
        {'lr.decay': 'cosine', 'lr.base': 0.0, 'lr.end': 1e-5},
        r'^config\.lr\.end=1e-05 with lr\.base=0: a cosine decay .* --config\.lr\.decay=linear$',
    ),
    'patch dropout with relative position embeddings': (
        {'model.patch_dropout': 0.5, 'model.posemb': 'relative'},
        r'^model\.patch_dropout=0\.5 keeps a random share of the patches, which only position '
        r"embeddings added at the input locate, and the model has model\.posemb='relative': set "
        r'--config\.model\.patch_dropout=0, or',
    ),
    'patch dropout with axial blocks': (
        {'model.patch_dropout': 0.5, 'variant': 'Axial-ViT-testing_4'},
        r'^model\.patch_dropout=0\.5 .* the model is an Axial-ViT: .* a ViT-\* variant$',
    ),
    'b1 of sgd': (
        {'optim.name': 'sgd', 'optim.b1': 0.95},
        r"^config\.optim\.b1=0\.95 does nothing with optim\.name='sgd', whose first-moment decay "
        r'is optim\.momentum: set config\.optim\.momentum instead$',
    ),
    'momentum of adamw': (
        {'optim.momentum': 0.0},
        r"^config\.optim\.momentum=0\.0 does nothing with optim\.name='adamw', .*optim\.b1",
    ),
    'b1 of adafactor': (
        {'optim.name': 'adafactor', 'optim.b1': 0.0},
        r"^config\.optim\.b1=0\.0 does nothing with optim\.name='adafactor', which keeps no "
        r'first moment: leave it at 0\.9$',
    ),
    'b2 of sgd': (
        {'optim.name': 'sgd', 'optim.b2': 0.99},
        r'^config\.optim\.b2=0\.99 is the second-moment decay of adamw, lion, '
        r'big_vision_adafactor, which sgd does not use: unset it$',
    ),
    'b1 of big_vision_adafactor': (
        {'optim.name': 'big_vision_adafactor', 'optim.b1': 0.0},
        r"^config\.optim\.b1=0\.0 does nothing with optim\.name='big_vision_adafactor', whose "
        r'first-moment decay is optim\.momentum: set config\.optim\.momentum instead$',
    ),
}
BAD_EVALS = {
    'unknown type': (dict(type='ocr', every_steps=5), "Unknown evaluator type 'ocr' of 'minival'"),
    'unknown field': (
        dict(type='classification', split='test', every_steps=5, splt='test'),
        "'minival' has no field splt",
    ),
    'missing split': (
        dict(type='classification', split='validation', every_steps=5),
        "'validation'",
    ),
    'no cadence': (dict(type='classification', split='test', every_steps=0), 'every_steps=0'),
    'other task': (dict(type='mpp', split='test', every_steps=5), "config.task='classification'"),
    'no type': (
        dict(split='test', every_steps=5),
        'config.evals.minival must be a dict with a type',
    ),
}


def _fields(config: ml_collections.ConfigDict, prefix: str = '') -> list[str]:
  names = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict) and key not in ('evals',):
      names += _fields(value, f'{prefix}{key}.')
    else:
      names.append(prefix + key)
  return names


def _expect_one_line_error(config: ml_collections.ConfigDict, workdir: str, pattern: str) -> None:
  with pytest.raises(ValueError, match=pattern) as error:
    train_setup.prepare(config, workdir)
  assert '\n' not in str(error.value)
  assert not os.path.exists(workdir)


@pytest.mark.parametrize(
    'field',
    [
        pytest.param(field, marks=pytest.mark.devices(8)) if field in ON_EIGHT_DEVICES else field
        for field in sorted(INVALID)
    ],
)
def test_an_invalid_value_of_each_field_is_a_one_line_error(field, tmp_path, data_dir):
  value, needs, pattern = INVALID[field]
  if isinstance(value, str) and value.startswith('MISSING'):
    value = str(tmp_path / value)
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, **needs, field: value}
  )
  _expect_one_line_error(config, str(tmp_path / 'workdir'), pattern)


@pytest.mark.parametrize('case', sorted(ALSO_INVALID))
def test_more_invalid_values_are_one_line_errors(case, tmp_path, data_dir):
  overrides, pattern = ALSO_INVALID[case]
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir, **overrides})
  _expect_one_line_error(config, str(tmp_path / 'workdir'), pattern)


def test_the_command_line_refuses_a_seed_out_of_range_before_writing(tmp_path, data_dir):
  """It used to pass set-up, write the workdir and fail with a traceback where the state was made."""
  workdir = str(tmp_path / 'workdir')
  run = helpers.run_main(
      'configs/demo.py', workdir, {**helpers.TINY, 'data_dir': data_dir, 'seed': 2**63}, timeout=300
  )
  assert run.returncode == 2, run.stderr[-2000:]
  assert run.stderr.strip().splitlines()[-1] == (
      'error: config.seed=9223372036854775808 must be a signed 64-bit integer, e.g. --config.seed=0'
  )
  assert not os.path.exists(workdir)


@pytest.mark.parametrize('split, shards', [('train[5:5]', None), ('train[10:13]', 4)])
def test_a_train_split_smaller_than_the_data_shards_is_a_one_line_error(
    split, shards, tmp_path, data_dir
):
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, 'train_split': split, 'data_shards': shards}
  )
  _expect_one_line_error(
      config,
      str(tmp_path / 'workdir'),
      rf"train_split='{re.escape(split)}' has {0 if shards is None else 3} examples, "
      rf'fewer than the {shards or 1} data shards',
  )


@pytest.mark.parametrize('case', sorted(BAD_EVALS))
def test_a_bad_extra_evaluator_is_a_one_line_error(case, tmp_path, data_dir):
  settings, pattern = BAD_EVALS[case]
  config = helpers.load_config('demo', {**helpers.TINY, 'data_dir': data_dir})
  config.evals.minival = settings
  _expect_one_line_error(config, str(tmp_path / 'workdir'), pattern)


def test_every_field_of_the_defaults_has_a_check_here():
  fields = set(_fields(defaults.get_config()))
  assert fields - {'evals'} == set(INVALID) | set(
      ALWAYS_VALID
  ), 'a field without an invalid-value test (or a test of a field that is gone)'


@pytest.mark.parametrize('field', ['lr_mults', 'wd_mults', 'frozen'])
def test_a_parameter_group_matching_no_parameter_is_a_one_line_error(field, tmp_path, data_dir):
  value = (('haed', 2.0),) if field != 'frozen' else ('haed',)
  config = helpers.load_config(
      'demo', {**helpers.TINY, 'data_dir': data_dir, f'optim.{field}': value}
  )
  _expect_one_line_error(
      config, str(tmp_path / 'workdir'), rf"^config.optim.{field} regex 'haed' matches no parameter"
  )
