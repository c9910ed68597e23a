"""Defaults shared by every experiment; an experiment file starts from `get_config()` and changes fields.

Every field here is a knob the loop reads, and a run's config has exactly these fields (a name an
experiment file adds is a typo, refused by train/setup.py). Fields whose default is "not set" are typed
placeholders, so they can still be given on the command line (`--config.total_steps=100`).
"""

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.seed = 0  # Any signed 64-bit integer.

  # Data: 'digits' (bundled, offline), 'folder' (data_dir = root with train/ and test/ class folders),
  # 'huggingface' (data_dir = a Hugging Face dataset on disk or 'hf-hub:NAME': Parquet, Arrow,
  # WebDataset .tar shards or image files) or any tensorflow_datasets name.
  config.dataset = 'digits'
  config.data_dir = config_dict.placeholder(str)
  config.train_split = 'train'
  config.eval_split = 'test'
  # The tfds ClassLabel feature (a Hugging Face dataset's label column, 'COLUMN.FIELD' a struct
  # column's field; WebDataset shards' 'cls', or 'json.KEY': KEY of each sample's json file) the run
  # trains and evaluates on (its classes are the model's), e.g. cifar100's 'coarse_label' for its 20
  # superclasses; image folders and VTAB tasks have only 'label'. A set of classes an image (a
  # Sequence of ClassLabel) trains a multi-label classifier, with loss 'sigmoid_xent' (docs/data.md).
  config.label_feature = 'label'
  config.image_size = 224
  # Train-time preprocessing: a crop ('inception' | 'random_resized' | 'random' | 'resize'), then each
  # augmentation whose field is set, in this order: flip; RandAugment (randaug_layers ops of the TF
  # reference's set at randaug_magnitude in [0, 20], 10 being its paper's top; 0 layers: off); DeiT
  # III's 3-Augment (one of grayscale, solarize, gaussian blur per image); colour jitter of this
  # strength (brightness, contrast, saturation); random erasing (timm's reprob, random-pixel fill)
  # with probability erase_prob, of erase_area of the image and aspect ratio (height / width) in
  # erase_aspect.
  config.pp = ml_collections.ConfigDict(
      dict(
          crop='inception',
          min_area=0.05,
          pad=0,
          flip=True,
          antialias=True,
          randaug_layers=0,
          randaug_magnitude=10,
          three_augment=False,
          color_jitter=0.0,
          erase_prob=0.0,
          erase_area=(0.02, 1 / 3),
          erase_aspect=(0.3, 1 / 0.3),
          reducing_gap=0.0,
      )
  )
  # Eval preprocessing: 'resize' to image_size, or 'central': resize the shorter side to
  # image_size / crop_fraction and take the central image_size square (0.875: 256 -> 224, ImageNet's).
  # antialias (pp and pp_eval): shrink with PIL's (timm's) antialiased bilinear filter; False: the
  # 2x2 bilinear taps of TensorFlow's default resize (the original code's, for its checkpoints'
  # evaluation); it matters when shrinking by more than 2.
  # reducing_gap (pp and pp_eval): 0 decodes every image at its full size (timm's pixels); >= 1
  # decodes a JPEG at 1/2, 1/4 or 1/8 of its size where its crop keeps this many times the output
  # size, as PIL's thumbnail does (3: "indistinguishable from fair resampling in most cases"): for
  # images far larger than image_size (a 12-megapixel photo decodes ~5x faster).
  # Repeated augmentation (Hoffer et al. 2020; DeiT's RASampler, timm's --aug-repeats): each image of
  # the train stream comes this many times in a row, each copy augmented apart, so a batch holds the
  # copies side by side; a pass over the split then takes this many epochs (an epoch is still as many
  # examples as the split has). 1: off; DeiT's 3.
  config.aug_repeats = 1
  config.pp_eval = ml_collections.ConfigDict(
      dict(crop='resize', crop_fraction=0.875, antialias=True, reducing_gap=0.0)
  )
  # Processes that decode and augment the input (grain's workers): unset, one a core for files (image
  # folders, Hugging Face and tfds datasets) and none for the digits; 0: threads of the training
  # process only. The batches are the same for any number.
  config.data_workers = config_dict.placeholder(int)
  # Train batches handed to the devices this many steps before their step: each one's copy overlaps
  # the steps before it rather than waiting behind the step it feeds (0: at their step). The batches
  # are the same for any number.
  config.device_prefetch = 2
  # The train split is read as this many disjoint streams, each host reading its share of them; the
  # batches depend on it and not on the number of hosts (unset: one stream per host).
  config.data_shards = config_dict.placeholder(int)

  # Model: a variant name from vit_jax/models/variants.py; fields of `model` that are set override the preset.
  # 'checkpoint': the model of init_from (a timm or Hugging Face checkpoint, an .npz ViT, a vit_jax
  # run's workdir), every unset field read from it.
  config.variant = 'ViT-B_16'
  config.model = ml_collections.ConfigDict(
      dict(
          patch_size=config_dict.placeholder(int),
          hidden_size=config_dict.placeholder(int),
          num_layers=config_dict.placeholder(int),
          mlp_dim=config_dict.placeholder(int),
          num_heads=config_dict.placeholder(int),
          # 'token' | 'gap' (mean of the patch tokens) | 'map' (multihead attention pooling) |
          # 'token_gap' (the class token's output and the patches' mean side by side: DINOv2's
          # linear evaluation).
          classifier=config_dict.placeholder(str),
          # A class token before the patches: unset, for classifier 'token' or 'token_gap'; True with
          # 'gap' or 'map' keeps one they do not pool (timm's class_token with global_pool='avg': MAE,
          # EVA).
          class_token=config_dict.placeholder(bool),
          # classifier 'map': its attention heads (unset: num_heads; Perception Encoder's 8), its
          # MLP's width (unset: mlp_dim), and whether its probe attends to the class token and
          # registers too (timm Eva's attn_pool, Perception Encoder's; unset: the patches alone,
          # big_vision's and SigLIP's).
          map_heads=config_dict.placeholder(int),
          map_mlp_dim=config_dict.placeholder(int),
          map_include_prefix=config_dict.placeholder(bool),
          # GAP/MAP: the final LayerNorm after the pooling (timm's fc_norm) instead of before it;
          # final_norm=False: none at all (InternViT's, RADIO's; timm's final_norm).
          fc_norm=config_dict.placeholder(bool),
          final_norm=config_dict.placeholder(bool),
          # Position embeddings (the paper's Table 8): 'learn' (1-D) | 'learn2d' | 'sincos2d' (fixed,
          # big_vision's) | 'sincos2d_mae' (fixed, MAE's frequencies) | 'relative' (a learned bias per
          # head and offset in every block's attention) | 'none'; added at 'input' | 'every_layer' (each
          # block its own) | 'shared_every_layer'.
          posemb=config_dict.placeholder(str),
          posemb_where=config_dict.placeholder(str),
          # Stochastic depth: per-sample drop of each residual branch, at a rate growing linearly with
          # depth from 0 to this in the last block.
          drop_path_rate=config_dict.placeholder(float),
          representation_size=config_dict.placeholder(
              int
          ),  # tanh pre-logits layer width; unset = none
          # Dropout after the position embeddings, the attention and in the MLP (the original ViT's), of
          # the attention weights, and of the pooled features before the head (timm's drop_rate).
          dropout_rate=config_dict.placeholder(float),
          attention_dropout_rate=config_dict.placeholder(float),
          head_dropout_rate=config_dict.placeholder(float),
          # The head's initial bias (0; big_vision's AugReg i21k runs: -10 with the sigmoid loss).
          head_bias_init=config_dict.placeholder(float),
          # Patch dropout (timm's patch_drop_rate, FLIP's masking): the share of each image's patches
          # its blocks do not see at train time, once they have their position embeddings; a step
          # costs about what the rest cost. Evaluation sees them all.
          patch_dropout=config_dict.placeholder(float),
          # 'gelu_tanh' (the original checkpoints') | 'gelu' (exact: timm's and Hugging Face's models) |
          # 'quick_gelu' (OpenAI CLIP's) | 'silu' (SwiGLU's, with mlp_gated).
          mlp_activation=config_dict.placeholder(str),
          # Layer scale (CaiT, DeiT III, DINOv2; timm's init_values): each residual branch multiplied
          # by a learned per-channel scale starting at this value (e.g. 1e-5); unset: none.
          layer_scale=config_dict.placeholder(float),
          # False: layer scale on the attention's branch alone (Sapiens 2's; timm's
          # attn_only_layer_scale); unset: both branches.
          layer_scale_mlp=config_dict.placeholder(bool),
          # Grouped-query attention: key and value heads, each shared by num_heads / num_kv_heads
          # query heads; one number for every block or a tuple of each block's (Sapiens 2's, with
          # model.scan=False); unset: num_heads.
          num_kv_heads=config_dict.placeholder(object),
          # LayerNorms of each head's queries and keys before their product (ViT-22B's; timm's qk_norm).
          qk_norm=config_dict.placeholder(bool),
          # False: the attention's keys have no bias (EVA's; with rotary embeddings it would matter).
          key_bias=config_dict.placeholder(bool),
          # A LayerNorm of the attention's heads, concatenated, before its output projection (EVA-02
          # CLIP's; timm's scale_attn_inner, scale_attn_norm).
          attn_norm=config_dict.placeholder(bool),
          # A gated MLP (GLU; SwiGLU with mlp_activation='silu': EVA-02's, DINOv2 giant's): the
          # activated layer times a second linear one, mlp_dim units each; mlp_norm: a LayerNorm of the
          # hidden units before the output layer (EVA-02 B/L's).
          mlp_gated=config_dict.placeholder(bool),
          mlp_norm=config_dict.placeholder(bool),
          # Each block's norms after its attention and MLP, before the residual adds (Swin V2's
          # res-post-norm; timm's ResPostBlock, Eva's use_post_norm: EVA-02-CLIP-E's).
          res_post_norm=config_dict.placeholder(bool),
          # Each block's attention and MLP side by side, of one norm's output, summed into the
          # residual: x + MSA(LN(x)) + MLP(LN(x)) (ViT-22B's parallel layers; timm's
          # ParallelScalingBlock); layer scale then scales their sum.
          parallel_block=config_dict.placeholder(bool),
          # Differential attention (Ye et al. 2024; timm's attn_layer='diff'): two softmax maps of
          # each head's halves of queries and keys, the second subtracted at a learned weight, the
          # heads RMSNormed; each block's lambda_init grows with its index (scanned blocks' too).
          diff_attention=config_dict.placeholder(bool),
          # 2-D rotary position embeddings of the patches' queries and keys (of rope_style); rope_grid:
          # the (rows, columns) positions are rescaled to span at any resolution (timm's
          # ref_feat_shape, EVA-02's (16, 16); not 'dinov3', 'rope_mixed'); unset: each grid's own
          # indices.
          rope=config_dict.placeholder(bool),
          rope_grid=config_dict.placeholder(tuple),
          # The rotary embeddings' kind (with rope=True): 'eva02' (unset: EVA-02's, timm's rope 'cat'),
          # 'rope_vit' (RoPE-ViT's axial: columns first, temperature 100), 'pe' (Perception
          # Encoder's: columns first, positions from 1), 'eva02_xy' (columns first, Perception
          # Encoder G's), 'rope_mixed' (RoPE-Mixed's frequencies, learned per block and head: timm's
          # rope 'mixed') or 'dinov3' (DINOv3's, timm's rope 'dinov3': positions in [-1, 1] at any
          # grid, rotated halves, periods of temperature 100).
          rope_style=config_dict.placeholder(str),
          # Register tokens (DINOv2 with registers, "Vision Transformers Need Registers"): this many
          # learned tokens after the class token, in no pooling; unset: none.
          num_registers=config_dict.placeholder(int),
          # DeiT's distillation token after the class token, with its own head: the logits are the
          # mean of both heads' (config.distill trains each on its own target); unset: none.
          distilled=config_dict.placeholder(bool),
          # A LayerNorm `pre_norm` before the first block, and a patch embedding without bias (CLIP's
          # image tower; timm's pre_norm).
          pre_norm=config_dict.placeholder(bool),
          # Every LayerNorm's epsilon: 1e-6 (the original checkpoints', timm's) | 1e-12 (Hugging Face's
          # ViT, its config.json's layer_norm_eps; init_from checks it).
          layernorm_epsilon=config_dict.placeholder(float),
          # Every norm's kind: 'layernorm' | 'rmsnorm' (AIMv2's; vit_jax/models/norms.py); embed_norm:
          # a norm of the patch embeddings before the position embeddings (AIMv2's).
          norm_layer=config_dict.placeholder(str),
          embed_norm=config_dict.placeholder(bool),
          # 'original' (the modules' own initialisers, the original code's) | 'timm' (timm's
          # VisionTransformer: matrices ~N(0, 0.02), a random head; vit_jax/models/inits.py).
          weight_init=config_dict.placeholder(str),
          # The hybrid's ResNet stem (set by R50+ViT-* variants): units per stage and a width multiplier.
          resnet_layers=config_dict.placeholder(tuple),
          resnet_width_factor=config_dict.placeholder(float),
          # Fast paths: 'xla' | 'dot_product_attention' (cuDNN flash attention on GPU); a
          # jax.checkpoint_policies name to rematerialise each block (e.g. 'nothing_saveable');
          # nn.scan over the blocks for fast compiles of deep models (checkpoints keep per-block names).
          attention=config_dict.placeholder(str),
          # The blocks' projections and MLPs: 'default' (in config.dtype) | 'fp8' (operands in
          # float8_e4m3fn, gradients in float8_e5m2, scaled per tensor: FP8 tensor cores on GPUs of
          # compute capability 8.9+; emulated elsewhere, for no speed-up; vit_jax/models/fp8.py).
          matmul=config_dict.placeholder(str),
          remat=config_dict.placeholder(str),
          scan=config_dict.placeholder(bool),
          # Low-rank adapters (LoRA; vit_jax/models/lora.py): every block's lora_targets layers ('query',
          # 'key', 'value', 'out', 'mlp_in', 'mlp_out'; unset: ('query', 'value'), peft's for ViTs) add
          # dropout(x) A B * lora_alpha / lora_rank, A [in, rank] random, B [rank, out] zeros. Only the
          # adapters and the head train unless config.optim.trained says otherwise; export folds them
          # into the kernels. Unset rank: none; unset alpha: the rank.
          lora_rank=config_dict.placeholder(int),
          lora_alpha=config_dict.placeholder(float),
          lora_targets=config_dict.placeholder(tuple),
          lora_dropout=config_dict.placeholder(float),
      )
  )
  config.dtype = 'float32'  # Compute dtype; parameters and optimizer state stay float32.

  # Initialise from a pretrained checkpoint (unset: from scratch): an .npz in the original ViT layout,
  # or a vit_jax workdir (its latest step, its Polyak average if it kept one; 'WORKDIR/checkpoints/STEP'
  # for another step). The head is replaced by a zero-initialised one for this dataset's classes unless
  # keep_head (a new head may pool otherwise: model.classifier and fc_norm are then the run's, e.g.
  # MAE's gap + fc_norm); the checkpoint's pre-logits layer is dropped unless keep_pre_logits (which
  # needs model.representation_size set to its width); position embeddings are resized to the new
  # grid.
  # Without init_from, keep_head and keep_pre_logits have nothing to keep and must stay False.
  config.init_from = config_dict.placeholder(str)
  config.keep_head = False
  config.keep_pre_logits = False
  # 'bilinear' (the original code's) | 'bicubic' (timm's) | 'bilinear_antialiased' (NaFlex's) |
  # 'bicubic_torch' (Hugging Face transformers' interpolate_pos_encoding).
  config.posemb_interpolation = 'bilinear'
  # A checkpoint of another patch size (model.patch_size) has its patch embedding resampled to the
  # model's by FlexiViT's pseudo-inverse of a resize: 'bilinear' (big_vision's FlexiViT) | 'bicubic'
  # (timm's resample_patch_embed) | 'bilinear_antialiased' (timm's with interpolation='bilinear').
  config.patch_interpolation = 'bilinear'
  # FlexiViT (vit_jax/train/flexi.py): each step at a patch size drawn from patch_sizes (by weights,
  # empty: equal), the parameters kept at model.patch_size's shapes and resampled to it in the step
  # (patch_interpolation, posemb_interpolation). Empty: every step at model.patch_size.
  # kernel_size, posemb_grid: the parameters kept instead as big_vision's FlexiViT keeps them, the
  # patch kernel at kernel_size px (32) and the learned position embeddings at a posemb_grid square
  # grid (7), resampled to every step's and evaluation's size; None: model.patch_size's.
  config.flexi = ml_collections.ConfigDict(
      dict(
          patch_sizes=(),
          weights=(),
          kernel_size=config_dict.placeholder(int),
          posemb_grid=config_dict.placeholder(int),
      )
  )

  # 'classification'; 'mpp': masked patch prediction, the paper's self-supervised pretraining; 'mae':
  # the masked autoencoder (He et al. 2022), today's (vit_jax/tasks/mae.py).
  config.task = 'classification'
  config.mpp = ml_collections.ConfigDict(
      dict(
          mask_rate=0.5,  # Fraction of patches corrupted (80% [mask], 10% another patch, 10% kept).
          num_bits=3,  # Bits per colour channel of the predicted mean colour: 2^(3*3) = 512 classes.
      )
  )
  config.mae = ml_collections.ConfigDict(
      dict(
          mask_ratio=0.75,  # The share of each image's patches hidden from the encoder.
          # The targets: each patch's pixels normalised by their own mean and standard deviation.
          norm_pix_loss=True,
          # The pixels the decoder predicts: those u in [0, 1] normalised as (u - mean) / std per
          # channel, a checkpoint's own, which a run continuing its pretraining (config.init_from with
          # its pixel decoder) sets; unset: vit_jax's images in [-1, 1].
          target_mean=config_dict.placeholder(tuple),
          target_std=config_dict.placeholder(tuple),
          # The decoder: MAE's 8 blocks of width 512 (its ablations' best), fixed 2-D sin-cos
          # position embeddings of MAE's frequencies ('sincos2d_mae'), big_vision's ('sincos2d') or
          # learned ones ('learn').
          decoder_hidden_size=512,
          decoder_num_layers=8,
          decoder_num_heads=16,
          decoder_mlp_dim=2048,
          decoder_posemb='sincos2d_mae',
      )
  )

  # Loss: 'softmax_xent', 'sigmoid_xent' (as big_vision on ImageNet-21k) or 'asl' (the asymmetric loss
  # of multi-label classification, Ridnik et al. 2021, as timm's AsymmetricLossMultiLabel); label sets
  # need one of the last two; task 'mpp' takes only 'softmax_xent'. label_smoothing smooths the
  # one-hot targets (mpp's colour classes too).
  config.loss = 'softmax_xent'
  # The asymmetric loss's focusing of negatives and positives and its shift of negatives'
  # probabilities (a field set with another loss is an error; unset: 4, 1, 0.05, the paper's).
  config.asl = ml_collections.ConfigDict(
      dict(
          gamma_neg=config_dict.placeholder(float),
          gamma_pos=config_dict.placeholder(float),
          clip=config_dict.placeholder(float),
      )
  )
  config.label_smoothing = 0.0
  # Batch mixing in the train step (timm's Mixup): with probability `prob` a batch is mixed, by CutMix
  # with probability switch_prob when both alphas are set; lambda ~ Beta(alpha, alpha); the labels
  # become soft targets. Alphas 0: off. Unset until_step: mixing for the whole run (set it only with
  # an alpha).
  config.mix = ml_collections.ConfigDict(
      dict(
          mixup_alpha=0.0,
          cutmix_alpha=0.0,
          prob=1.0,
          switch_prob=0.5,
          until_step=config_dict.placeholder(int),
      )
  )
  # Knowledge distillation (DeiT's; vit_jax/tasks/distillation.py): the student also learns from a
  # frozen teacher's predictions on the same (mixed) images. teacher: a vit_jax run's workdir (any
  # classifier of the same classes, a BiT too) or a timm / Hugging Face ViT checkpoint; unset: none.
  # kind: 'hard' (the teacher's top class) | 'soft' (DeiT's KL at `temperature`, a mean over the
  # batch and classes) | 'kl' (the KL per example, a mean over the batch: FunMatch's); alpha weighs the
  # distillation loss, 1 - alpha the labels'. With model.distilled the distillation token's head
  # learns from the teacher, the class token's from the labels. teacher_image_size: the teacher sees
  # the student's images resized on the device to it (antialiased bilinear: a 384 px teacher of a 224
  # px student, FlexiViT's); unset: config.image_size. teacher_step: the checkpoint of a teacher
  # workdir; unset: its latest at the run's first start, which the run stores (config.json), so that a
  # resume distils from the same one while the teacher's run goes on.
  config.distill = ml_collections.ConfigDict(
      dict(
          teacher=config_dict.placeholder(str),
          kind='hard',
          alpha=0.5,
          temperature=1.0,
          teacher_image_size=config_dict.placeholder(int),
          teacher_step=config_dict.placeholder(int),
      )
  )

  # Optimisation. Exactly one of total_steps / num_epochs (steps: ceil(num_epochs x train examples /
  # batch_size)); 0 (with init_from) evaluates init_from's parameters without training: every
  # evaluator once, at step 0.
  config.batch_size = 4096
  config.eval_batch_size = 1024
  config.total_steps = config_dict.placeholder(int)
  config.num_epochs = config_dict.placeholder(float)
  config.optim = ml_collections.ConfigDict(
      dict(
          name='adamw',  # 'adamw' | 'sgd' | 'lion' | 'adafactor' | 'big_vision_adafactor'
          # adamw, lion; b2 unset: the optimizer's own (adamw 0.999, lion 0.99; optim.DEFAULT_B2);
          # big_vision_adafactor's cap on its second-moment decay (0.999).
          # Each optimizer refuses a changed decay it does not read (sgd's is momentum).
          b1=0.9,
          b2=config_dict.placeholder(float),
          # Decoupled and multiplied by the learning rate (optax.adamw), applied to kernels only; with
          # sgd an L2 term added to the gradient (so through the momentum, as torch's SGD).
          weight_decay=0.1,
          momentum=0.9,  # sgd, big_vision_adafactor (0: none)
          # The first moment's dtype (adamw, lion, big_vision_adafactor), e.g. 'bfloat16'.
          mu_dtype=config_dict.placeholder(str),
          # Parameter groups, by regex over '/'-joined parameter paths (first match wins):
          # ((regex, multiplier), ...) of the learning rate and of the weight decay (of any parameter
          # it matches; an unmatched kernel decays at 1, nothing else); frozen: regexes of
          # parameters that are not updated and keep no optimizer state; trained: regexes of the only
          # parameters that train, with model.lora_rank's adapters (unset: all; with adapters, the
          # adapters and ('^head',); a linear probe: "('^head',)").
          lr_mults=(),
          wd_mults=(),
          frozen=(),
          trained=config_dict.placeholder(tuple),
          # Layer-wise learning-rate decay (BEiT/MAE/timm): block i of L gets decay^(L - i), the
          # embeddings decay^(L + 1), the head 1. Unset: off.
          layer_decay=config_dict.placeholder(float),
      )
  )
  config.lr = ml_collections.ConfigDict(
      dict(
          base=1e-3,
          warmup_steps=10_000,
          decay='linear',  # 'linear' | 'cosine' | 'constant'
          # Where the decay ends (linear and cosine): the rate after the last step; step t of T
          # applies the schedule at t - 1 (optax's count), so the last update's is one step short.
          end=0.0,
      )
  )
  config.grad_clip_norm = 1.0  # Global-norm clipping; 0 disables it.
  # Steps whose gradients are not finite that a run skips (no update, no optimizer step; the data moves
  # on; optax.apply_if_finite) before it stops; 0: stop at the first such step.
  config.skip_nonfinite_steps = 0
  # Polyak averaging: an exponential moving average of the parameters with this decay (e.g. 0.9999),
  # evaluated beside them (eval_polyak_*) and exported; of the parameters that train (a frozen one is
  # its own average, kept once); unset = off.
  config.polyak_decay = config_dict.placeholder(float)
  # Gradient accumulation: batch_size is split into accum_steps micro-batches, one update per batch.
  config.accum_steps = 1

  # Devices: (axis, size) pairs over 'data' (batch split, parameters replicated), 'fsdp' (batch and
  # parameters + optimizer state split) and 'tensor' (heads and MLP units split); one size may be -1
  # to take the remaining devices, e.g. "(('data', 2), ('fsdp', -1))".
  config.mesh = (('data', -1),)

  # Seconds the workdir's (and init_from's) file system may take to answer the checks made before a
  # run starts; a remote one (gs://) that does not answer by then is a one-line error, not a hang.
  config.storage_timeout_s = 60.0
  # Seconds a run may spend in one train step (the first compiles), evaluation or save before its
  # watchdog prints every thread's stack and exits with status 70 for the scheduler to restart it (a
  # hung collective or file system); 0: no watchdog.
  config.hang_timeout_s = 1800.0

  # Bookkeeping (in steps). The train metrics logged every log_every_steps are means over the steps
  # since the last log (train_loss, grad_norm...), but learning_rate: the rate of the logged step.
  config.log_every_steps = 100
  config.eval_every_steps = 1000
  config.checkpoint_every_steps = 1000
  config.keep_checkpoints = 3
  # The parameters of the best evaluation, kept in workdir/best/<step> beside the latest checkpoints:
  # `metric` is a metric an evaluator logs (eval_top1, eval_polyak_top1, eval_loss, eval_map,
  # fewshot_10shot, ...), `mode` 'max' or 'min' (unset: min for a *loss, else max); metric unset: none
  # kept. The tools read it as --step=best; config.init_from=W/best/<step> fine-tunes from it.
  # `patience`: evaluations of the metric without a new best after which the run stops early (saving
  # its checkpoint; started again, it only evaluates); unset: it trains to the end.
  config.best_checkpoint = ml_collections.ConfigDict(
      dict(
          metric=config_dict.placeholder(str),
          mode=config_dict.placeholder(str),
          patience=config_dict.placeholder(int),
      )
  )
  # Weights & Biases (optional: pip install "wandb==0.31.0"): with `project` set, the process that
  # writes the event files also logs the scalars and the config to a W&B run of `entity` (unset:
  # W&B's default), `name` (unset: the workdir's name), `group` and `tags`; a run started again in
  # its workdir logs to the same W&B run. W&B's own variables (WANDB_MODE=offline, ...) apply.
  config.wandb = ml_collections.ConfigDict(
      dict(
          project=config_dict.placeholder(str),
          entity=config_dict.placeholder(str),
          name=config_dict.placeholder(str),
          group=config_dict.placeholder(str),
          tags=(),
      )
  )
  # A profiler trace (TensorBoard's Profile tab) of this many steps into the workdir, from the third
  # step of each start on (the first compiles); 0: none.
  config.profile_steps = 0

  # Evaluators (vit_jax/evaluators) run every N steps and at the end, on the parameters and on their
  # Polyak average (<name>_polyak_<metric>). `eval`: the task's top1/top5/loss on eval_split every
  # eval_every_steps, logged as eval_top1...
  # Few-shot linear evaluation of the frozen pre-logits features (paper Sec. 4), every `every_steps`
  # steps (unset: off): `shots` unaugmented images per class of train_split (unset: config.train_split),
  # ridge regression to {-1, 1} targets with `l2_reg`, accuracy on eval_split (unset:
  # config.eval_split), the mean over `seeds` draws of the shots; logged as fewshot_<shots>shot.
  config.fewshot = ml_collections.ConfigDict(
      dict(
          every_steps=config_dict.placeholder(int),
          shots=(1, 5, 10, 25),
          seeds=3,
          # Features are standardised before the fit, so one value serves features of any scale. Of
          # 2^-4..2^14, 2^2 is within 1% of the best at 1-25 shots on the digits, for the demo model and a
          # barely trained tiny one (the best grows with the shots; big_vision's configs fix 2^10).
          l2_reg=4.0,
          train_split=config_dict.placeholder(str),
          eval_split=config_dict.placeholder(str),
      )
  )
  # DINO's weighted k-NN of the same frozen features, every `every_steps` steps (unset: off): each image
  # of eval_split classified by its k most similar (cosine) images of train_split, their votes weighed
  # exp(similarity / temperature); logged as knn_<k>nn for each k of `ks` (unset splits: the run's).
  config.knn = ml_collections.ConfigDict(
      dict(
          every_steps=config_dict.placeholder(int),
          ks=(10, 20),
          temperature=0.07,
          train_split=config_dict.placeholder(str),
          eval_split=config_dict.placeholder(str),
      )
  )
  # More evaluators, by name: dict(type='classification' (or the run's task) | 'fewshot',
  # every_steps=N, ...its fields), e.g. a minival held out of train, logged as minival_top1...:
  #   config.evals.minival = dict(type='classification', split='train[98%:]', every_steps=500)
  config.evals = ml_collections.ConfigDict()
  return config


def changed(config: ml_collections.ConfigDict, section: str) -> list[str]:
  """The fields of `config.<section>` that differ from the defaults': what a run that does not use
  the section would silently ignore."""
  default = get_config()[section]
  return [name for name in config[section] if config[section][name] != default[name]]
