"""configs/demo.py's recipe as a timm user writes the training loop (folder_vs_timm.py's timm side),
read from the same config: `timm.create_model('vit_tiny_patch16_224', ...)` of the same shape and
dropout (model.head_dropout_rate as `drop_rate`, train.py's --drop; model.dropout_rate as
`pos_drop_rate` and `proj_drop_rate`), `timm.data.create_transform` (RandomResizedCrop of the same
scale range, no flip, no colour jitter, mean = std = 0.5 so that pixels land in [-1, 1] as ours),
torchvision's ImageFolder (RGB) in a DataLoader (shuffle, drop_last, 2 persistent workers: train.py
-j 2), `timm.optim.create_optimizer_v2('adamw')` (no decay on biases, norms, class token and position
embeddings, as ours), `timm.scheduler.CosineLRScheduler` stepped per update (warmup_prefix: the same
per-step schedule as ours), `timm.loss.LabelSmoothingCrossEntropy`, `timm.utils.dispatch_clip_grad`;
evaluated and checkpointed (torch.save of the model and the optimizer) at the same steps as ours. It
runs in a child process with the C library's malloc (`run_timm`), seeded with `timm.utils.random_seed`.
"""

import os  # pylint: disable=g-bad-import-order
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)  # Run as the child: `python benchmarks/timm_loop.py REQUEST`.

import json
import math
import statistics
import subprocess
import time
from typing import Any

from vit_jax.runtime import allocator  # pylint: disable=wrong-import-position
import timm_peer  # pylint: disable=wrong-import-position

RESULT = 'timm result: '  # The timm child's answer on its stdout.


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
      # head_dropout_rate; its pos_drop_rate and proj_drop_rate are where ours' dropout_rate drops;
      # its patch_drop_rate is ours' patch_dropout (named where set).
      'dropout': {
          'drop_rate': model['head_dropout_rate'],
          'pos_drop_rate': model['dropout_rate'],
          'proj_drop_rate': model['dropout_rate'],
          **({'patch_drop_rate': model['patch_dropout']} if model['patch_dropout'] else {}),
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


def check_exit(process: subprocess.CompletedProcess, what: str, log: str) -> None:
  if process.returncode != 0:
    with open(log) as f:
      tail = f.read()[-3000:]
    raise RuntimeError(
        f'{what} ended with status {process.returncode}; the end of its output:\n{tail}'
    )


def run_timm(
    root: str, seed: int, recipe: dict[str, Any], threads: int, workdir: str
) -> dict[str, float]:
  """`train_timm` in a child process with the C library's malloc, timed as a whole."""
  command = [
      sys.executable,
      os.path.abspath(__file__),
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
  check_exit(process, 'the timm child', log)
  reply = next(line for line in process.stdout.splitlines() if line.startswith(RESULT))
  return {**json.loads(reply[len(RESULT) :]), 'wall_s': wall_s}


def train_timm(
    root: str, seed: int, recipe: dict[str, Any], threads: int, workdir: str
) -> dict[str, float]:
  """The recipe as a timm user writes the loop: timm's model, transforms, optimizer, scheduler, loss."""
  timm, torch = timm_peer.load()
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


if __name__ == '__main__':  # The child of `run_timm`.
  print(RESULT + json.dumps(train_timm(**json.loads(sys.argv[1]))), flush=True)
