#!/usr/bin/env bash
# Trains on a Cloud TPU VM slice (a pod slice runs one process per host, all started here).
#   launch/tpu_pod.sh NAME ZONE ACCELERATOR_TYPE -- --config=configs/vit_l16_i21k.py --workdir=gs://B/run
# Creates the TPU VM if it does not exist (set TPU_VERSION for the runtime image), copies this checkout
# as it is (uncommitted changes and new files too, not what git ignores) to every worker, installs
# the pinned environment with jax[tpu], and runs the same command on all workers with
# `gcloud compute tpus tpu-vm ssh --worker=all`; jax.distributed finds the peers itself.
# The workdir should be a gs:// bucket (or other storage every worker can reach). When the slice is
# preempted or goes into maintenance, every host gets SIGTERM: the run saves the step it is at on all
# hosts and exits with status 75; run this same command again (it re-creates a deleted VM) to resume.
# Status 70 is the watchdog's (no progress for config.hang_timeout_s): the same command resumes too.
# DRY_RUN=1 prints the gcloud commands (shell-quoted) instead of running them.
set -euo pipefail
if [[ $# -lt 4 || "$4" != "--" ]]; then
  sed -n '2,12p' "$0"; exit 2
fi
DRY_RUN=${DRY_RUN:-0}
run() {
  if [[ $DRY_RUN == 1 ]]; then printf '%q ' "$@" | sed 's/ $//'; echo; else "$@"; fi
}
# The checkout as it is, not its last commit: tracked files with their changes, and the files git
# does not ignore that it does not track yet (a new config), into the archive $1.
pack() {
  git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' file; do [[ -e $file ]] && printf '%s\0' "$file"; done |
    tar --null -czf "$1" -T -
}
NAME=$1 ZONE=$2 TYPE=$3
shift 4
VERSION=${TPU_VERSION:-tpu-ubuntu2204-base}
cd "$(dirname "$0")/.."

# A dry run cannot ask whether the VM exists: it shows the create command too.
if [[ $DRY_RUN == 1 ]] || ! gcloud compute tpus tpu-vm describe "$NAME" --zone="$ZONE" >/dev/null 2>&1; then
  run gcloud compute tpus tpu-vm create "$NAME" --zone="$ZONE" --accelerator-type="$TYPE" --version="$VERSION"
fi

archive=$([[ $DRY_RUN == 1 ]] && echo vit_jax.tgz || mktemp --suffix=.tgz)
run pack "$archive"
run gcloud compute tpus tpu-vm scp "$archive" "$NAME":vit_jax.tgz --zone="$ZONE" --worker=all
run rm -f "$archive"

run gcloud compute tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all --command="
  set -e
  mkdir -p vit_jax && tar xzf vit_jax.tgz -C vit_jax && cd vit_jax
  make install-tpu PYTHON=\${PYTHON:-python3}
  .venv/bin/python -m vit_jax.main --distributed=on $(printf '%q ' "$@")
"
