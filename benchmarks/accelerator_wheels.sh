#!/usr/bin/env bash
# (Re)creates .whl/: the wheels that the accelerator machines' Python lacks, which
# benchmarks/accelerator_check.sh installs there (--no-index --no-deps: they reach no registry).
#
#   bash benchmarks/accelerator_wheels.sh   # on a machine that reaches PyPI
#
# Those machines (Python 3.12, x86-64, CUDA; their image lists its packages) have
# jax, flax, optax, orbax-checkpoint, chex, etils, numpy, pillow, protobuf, pyarrow, psutil,
# requests, tqdm, wrapt, attrs, six, einops, fsspec, zipp, typing-extensions..., but none of the
# packages below: vit_jax's own dependencies and theirs (each wheel's Requires-Dist), one version
# each: the version requirements.lock pins.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  ml_collections clu grain array_record tensorflow-datasets
  portpicker                                                      # grain's
  dm-tree immutabledict promise simple-parsing docstring_parser   # tensorflow-datasets'
  termcolor toml tensorflow-metadata googleapis-common-protos     # tensorflow-datasets'
)
# promise has no wheel on PyPI, only its sdist: it is built here into a pure-Python wheel.
SDIST_ONLY=(promise)

normal() { echo "$1" | tr 'A-Z_.' 'a-z--'; }  # A name as pip compares them.

pinned() {  # pinned NAME: its version in requirements.lock
  local line
  while IFS= read -r line; do
    if [[ $line == *==* && $(normal "${line%%==*}") == "$(normal "$1")" ]]; then
      line=${line#*==}
      echo "${line%% *}"
      return
    fi
  done < requirements.lock
  echo "$1 is not in requirements.lock" >&2
  exit 1
}

binary=() built=()
for name in "${WHEELS[@]}"; do
  if [[ " ${SDIST_ONLY[*]} " == *" $name "* ]]; then
    built+=("$name==$(pinned "$name")")
  else
    binary+=("$name==$(pinned "$name")")
  fi
done
rm -rf .whl && mkdir .whl
# (pip's warnings about this machine's configured local indexes are left out.)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl "${binary[@]}" 2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
python3 -m pip wheel -q --no-deps -w .whl "${built[@]}" \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
ls -l .whl
echo "$(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1) in all"
