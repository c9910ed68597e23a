"""Our side of folder_vs_timm.py: `python -m vit_jax.main` on the folder as a user runs it, timed as a
whole, its metrics read back from the event files of its workdir."""

import os
import subprocess
import sys
import time

import timm_loop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
  timm_loop.check_exit(process, ' '.join(command), log)
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
