#!/usr/bin/env bash
# The train step of several commits on one machine: a change's speed beside its parent's, in the
# same session (figures from different machines or sessions do not compare).
#
#   bash benchmarks/revisions.sh prepare 94935ad 1f4cdd0 9d952bd   # where git is: build/revisions/
#   bash benchmarks/revisions.sh run --variant=ViT-B_16 --batch=256 --dtype=bfloat16 --in-flight
#
# `prepare` writes build/revisions/N-REV/ (REVISIONS_DIR: another folder): the commit's vit_jax/ and
# benchmarks/ (--in-flight is in the harness from 94935ad on). `run` needs no git (a device
# machine: carry build/revisions): it runs benchmarks/train_step.py with the given flags in each
# prepared revision, in order, REPEAT times over (default 1; 2 shows the drift), and prints the rows
# with the framework cell naming the revision, and the lines starting with '# cu' (cuDNN's and
# cuBLASLt's kernels in the compiled step). PYTHON (default python3) is the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${REVISIONS_DIR:-build/revisions}

case ${1:-} in
  prepare)
    shift
    rm -rf "$DIR"
    n=0
    for rev in "$@"; do
      n=$((n + 1))
      dest=$DIR/$n-$(git rev-parse --short "$rev")
      mkdir -p "$dest"
      git archive "$rev" vit_jax benchmarks | tar -x -C "$dest"
      find "$dest" -name __pycache__ -prune -exec rm -rf {} +
      echo "$dest: $(git log -1 --format='%h %s' "$rev" | cut -c1-100)"
    done
    ;;
  run)
    shift
    header=--header
    for ((i = 0; i < ${REPEAT:-1}; i++)); do
      for dest in "$DIR"/*/; do
        name=$(basename "$dest")
        (cd "$dest" && "${PYTHON:-python3}" benchmarks/train_step.py "$@" $header) \
          | grep -E '^\||^# cu' | sed "s/^| vit_jax |/| vit_jax@${name#*-} |/"
        header=
      done
    done
    ;;
  *)
    sed -n '2,12p' "$0"
    exit 2
    ;;
esac
