"""A single-node SLURM cluster for the tests: munged, slurmctld and slurmd of Debian's `slurm-wlm` and
`munge` packages, with all their state, sockets and logs in one temporary directory and their own
ports, stopped by their process ids. Commands reach it through SLURM_CONF (`Cluster.env`)."""

import os
import random
import shutil
import socket
import subprocess
import time
from typing import Optional

import local

DAEMONS = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'squeue', 'scontrol', 'scancel', 'sinfo')


def missing_programs() -> list[str]:
  return [
      name
      for name in DAEMONS
      if shutil.which(name) is None and not os.path.exists(f'/usr/sbin/{name}')
  ]


def _program(name: str) -> str:
  return shutil.which(name) or f'/usr/sbin/{name}'


_SLURM_CONF = """ClusterName=vitjaxtest
FirstJobId={first_job_id}
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/builtin
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=600
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


class Cluster:
  """`start()` brings it up (a minute at most), `stop()` ends its daemons; `env` for its commands."""

  def __init__(self, root: str, cpus: Optional[int] = None, env: Optional[dict[str, str]] = None):
    """`env`: added to the environment of every command, and so of the jobs (sbatch exports it)."""
    self.root = root
    self.host = socket.gethostname().split('.')[0]
    self.cpus = cpus or os.cpu_count()
    self.env = dict(os.environ, **(env or {}), SLURM_CONF=os.path.join(root, 'slurm.conf'))
    self._daemons: list[subprocess.Popen] = []

  def start(self) -> None:
    """Its jobs are numbered from a random first id: under SLURM, jax.distributed's coordinator port is
    61440 + job id % 4096, and gRPC binds it with SO_REUSEPORT, so two test clusters on one host (runs
    of the suite side by side) numbering from 1 would register each other's processes."""
    for name in ('state', 'spool'):
      os.makedirs(os.path.join(self.root, name), exist_ok=True)
    key = os.path.join(self.root, 'munge.key')
    with open(key, 'wb') as f:
      f.write(os.urandom(1024))
    os.chmod(key, 0o400)
    with open(self.env['SLURM_CONF'], 'w') as f:
      f.write(
          _SLURM_CONF.format(
              host=self.host,
              root=self.root,
              cpus=self.cpus,
              ctld_port=local.free_port(),
              d_port=local.free_port(),
              first_job_id=random.randint(1, 60_000_000),
          )
      )
    munge = [
        _program('munged'),
        '--foreground',
        '--force',
        f'--key-file={key}',
        f'--socket={self.root}/munge.socket',
        f'--pid-file={self.root}/munged.pid',
        f'--log-file={self.root}/munged.log',
        f'--seed-file={self.root}/munged.seed',
    ]
    self._spawn(munge)
    self._wait_for(lambda: os.path.exists(f'{self.root}/munge.socket'), 'munged')
    self._spawn([_program('slurmctld'), '-D', '-i'])
    self._spawn([_program('slurmd'), '-D', '-N', self.host])
    self._wait_for(self._node_idle, 'the node to be idle')

  def _spawn(self, command: list[str]) -> None:
    log = open(os.path.join(self.root, os.path.basename(command[0]) + '.out'), 'w')
    self._daemons.append(
        subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT)
    )

  def _node_idle(self) -> bool:
    out = self.run('sinfo', '-h', '-o', '%T', check=False).stdout
    return out.strip() in ('idle', 'mixed', 'allocated')

  def _wait_for(self, ready, what: str, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not ready():
      dead = [d.args[0] for d in self._daemons if d.poll() is not None]
      if dead or time.time() > deadline:
        raise RuntimeError(
            f'SLURM test cluster: waiting for {what}; {dead or "none"} exited; logs in '
            f'{self.root}: {self.logs()[-3000:]}'
        )
      time.sleep(0.5)

  def logs(self) -> str:
    return ''.join(
        f'--- {name}\n' + open(os.path.join(self.root, name)).read()
        for name in sorted(os.listdir(self.root))
        if name.endswith(('.log', '.out')) and os.path.isfile(os.path.join(self.root, name))
    )

  def run(self, *command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_program(command[0]), *command[1:]],
        env=self.env,
        capture_output=True,
        text=True,
        check=check,
        timeout=60,
        **kwargs,
    )

  def stop(self) -> None:
    for daemon in reversed(self._daemons):
      daemon.terminate()
    for daemon in reversed(self._daemons):
      try:
        daemon.wait(timeout=30)
      except subprocess.TimeoutExpired:
        daemon.kill()
