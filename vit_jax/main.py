"""Entry point: `python -m vit_jax.main --config=configs/X.py[:arg] --workdir=DIR [--config.field=value]`."""

if (
    __name__ == '__main__'
):  # Before anything allocates or loads jax: see vit_jax/runtime/startup.py.
  from vit_jax.runtime import startup  # pylint: disable=g-import-not-at-top

  startup.prepare_process()
  startup.requeue_on_sigterm()

import logging as python_logging
import os
import socket
import sys
import time

from vit_jax.runtime import quiet  # pylint: disable=g-import-not-at-top

quiet.quiet_tensorflow()  # Before epath can load TensorFlow (for gs://, where it is installed).

from absl import flags, logging  # pylint: disable=g-import-not-at-top,wrong-import-position
from ml_collections import config_flags

from vit_jax.runtime import allocator, cli, config_files, cpu_kernels, slurm_gpus

_CONFIG = config_flags.DEFINE_config_file(
    'config',
    None,
    'Experiment config file, optionally with an argument: configs/X.py:arg.',
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Directory for checkpoints, metrics and exports.')
flags.mark_flags_as_required(['config', 'workdir'])
USAGE = (
    '--config=FILE[:ARG] --workdir=DIR [--config.FIELD=VALUE ...], e.g. '
    'python -m vit_jax.main --config=configs/demo.py --workdir=workdirs/demo'
)
# Multi-host. On TPU pods and SLURM, jax.distributed finds its peers by itself ('auto'); elsewhere
# (e.g. several processes on one machine, see launch/local.py) give the coordinator explicitly.
_DISTRIBUTED = flags.DEFINE_enum(
    'distributed',
    'auto',
    ['auto', 'on', 'off'],
    "jax.distributed.initialize(): 'auto' = when a coordinator is given or a TPU pod / multi-task "
    "SLURM job is detected; 'on' = always (cluster auto-detection); 'off' = single process.",
)
_COORDINATOR = flags.DEFINE_string('coordinator_address', None, 'host:port of process 0.')
_NUM_PROCESSES = flags.DEFINE_integer('num_processes', None, 'Processes in the run.')
_PROCESS_ID = flags.DEFINE_integer('process_id', None, 'This process, in [0, num_processes).')
_DISTRIBUTED_TIMEOUT = flags.DEFINE_integer(
    'distributed_timeout', 300, 'Seconds to wait for all processes to reach the coordinator.'
)


class _OwnInfoOnly(python_logging.Filter):
  """INFO lines from vit_jax and clu (its parameter overview) only; libraries speak from WARNING up."""

  def filter(self, record: python_logging.LogRecord) -> bool:
    if record.levelno >= python_logging.WARNING:
      return 'tensorflow_datasets' not in record.pathname or record.levelno >= python_logging.ERROR
    return any(f'{os.sep}{package}{os.sep}' in record.pathname for package in ('vit_jax', 'clu'))


def _cluster_detected() -> bool:
  slurm_tasks = int(os.environ.get('SLURM_NTASKS', '1'))
  tpu_workers = os.environ.get('TPU_WORKER_HOSTNAMES', '')
  return slurm_tasks > 1 or ',' in tpu_workers


def init_distributed() -> None:
  """Joins the multi-process run, or returns at once for a single process."""
  import jax  # pylint: disable=g-import-not-at-top

  explicit = _COORDINATOR.value is not None
  if _DISTRIBUTED.value == 'off' or (
      _DISTRIBUTED.value == 'auto' and not explicit and not _cluster_detected()
  ):
    return
  if explicit and (_NUM_PROCESSES.value is None or _PROCESS_ID.value is None):
    cli.fail('--coordinator_address needs --num_processes and --process_id too')
  if explicit and _PROCESS_ID.value > 0:
    _wait_for_coordinator(_COORDINATOR.value, _DISTRIBUTED_TIMEOUT.value)
  # Collectives between CPU processes (local multi-process runs and tests) go over gloo.
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  try:
    jax.distributed.initialize(
        coordinator_address=_COORDINATOR.value,
        num_processes=_NUM_PROCESSES.value,
        process_id=_PROCESS_ID.value,
        initialization_timeout=_DISTRIBUTED_TIMEOUT.value,
        local_device_ids=slurm_gpus.local_device_ids(),
    )
  except ValueError as e:  # jax's cluster detection found none: it cannot tell the coordinator.
    if explicit:
      raise
    cli.fail(
        f'--distributed={_DISTRIBUTED.value} found no cluster to join ({e}): run it in a TPU pod or '
        'a SLURM job, give --coordinator_address, --num_processes and --process_id, or leave '
        '--distributed=auto'
    )


def _wait_for_coordinator(address: str, timeout: float) -> None:
  """Fails in one line if nobody listens at `address` within `timeout` seconds.

  jax.distributed aborts the whole process (a C++ fatal error with a stack trace) when it cannot
  register with the coordinator, so the address is probed here first.
  """
  host, _, port = address.rpartition(':')
  deadline = time.time() + timeout
  while True:
    try:
      with socket.create_connection((host.strip('[]'), int(port)), timeout=1):
        return
    except (OSError, ValueError) as e:
      if time.time() > deadline:
        cli.fail(
            f'could not reach the coordinator at {address} within {timeout}s ({e}): start process 0 '
            'with the same --coordinator_address (it hosts the coordinator), or check the address, '
            'port and network'
        )
      time.sleep(0.5)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(f'unexpected arguments {argv[1:]}: config fields are set as --config.FIELD=VALUE')
  try:
    _train()
  except KeyboardInterrupt:  # Ctrl-C before the run catches it (train/preemption.py), or twice.
    cli.fail(
        'interrupted: stopped at once, without saving; the same command resumes from the last '
        'checkpoint, if there is one',
        status=130,
    )


def _train() -> None:
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
  init_distributed()
  import jax  # pylint: disable=g-import-not-at-top

  if jax.process_index() > 0:  # Process 0 speaks for the run.
    logging.set_verbosity(logging.WARNING)
  logging.debug(
      'malloc: %s (see vit_jax/runtime/allocator.py); XLA:CPU ops on YNNPACK: %s (see '
      'vit_jax/runtime/cpu_kernels.py); compilation cache: %s (see vit_jax/runtime/compile_cache.py)',
      allocator.in_effect(),
      cpu_kernels.in_effect(),
      jax.config.jax_compilation_cache_dir or 'off',
  )
  # Imported here so that `--help` and flag errors answer before TensorFlow and JAX load.
  from vit_jax.checkpoints import checkpoint  # pylint: disable=g-import-not-at-top
  from vit_jax.train import (  # pylint: disable=g-import-not-at-top
      loop,
      memory_fit,
      preemption,
      setup,
      state,
      wandb_writer,
      workdir_lock,
  )

  try:
    run = setup.prepare(_CONFIG.value, _WORKDIR.value)
  except ValueError as e:
    cli.fail(str(e))
  logging.debug('Config:\n%s', run.config)
  try:
    metrics = loop.train_and_evaluate(run)
  except (state.ResumeError, wandb_writer.CannotStart, workdir_lock.InUse) as e:
    cli.fail(str(e))
  except (loop.DivergedError, loop.InputError, checkpoint.SaveError, memory_fit.OutOfMemory) as e:
    cli.fail(str(e), status=1)
  except preemption.Preempted as e:
    logging.warning('%s', e)
    sys.exit(preemption.REQUEUE_STATUS)
  logging.info('Final eval: %s', ', '.join(f'{k}={v:.4f}' for k, v in sorted(metrics.items())))


if __name__ == '__main__':
  cli.run(main, flags_parser=config_files.flags_parser(USAGE))
