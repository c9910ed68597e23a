#!/bin/bash
# Model soups on the digits (vit_jax.tools.soup): the demo's checkpoint fine-tuned as
# configs/demo_finetune.py (24x24, SGD, Polyak average) in five settings of learning rate, label
# smoothing and seed on train[:90%]; then each run, their uniform soup and their greedy soup (picked
# on the held-out train[90%:]) measured on the test split. Run from the repository root:
#   bash benchmarks/soup_digits.sh            # ROOT=workdirs/soup_digits; trains workdirs/demo if missing
set -euo pipefail
ROOT=${ROOT:-workdirs/soup_digits}
PY=${PY:-.venv/bin/python}
[ -d workdirs/demo/checkpoints ] || $PY -m vit_jax.main --config=configs/demo.py --workdir=workdirs/demo
settings=(
  "lr.base=0.01 seed=1"
  "lr.base=0.03 seed=2"
  "lr.base=0.03 seed=3 label_smoothing=0.0"
  "lr.base=0.1 seed=4"
  "lr.base=0.1 seed=5 label_smoothing=0.0"
)
for setting in "${settings[@]}"; do
  name=$(echo "$setting" | tr ' =' '_-')
  args=()
  for field in $setting; do args+=("--config.$field"); done
  [ -d "$ROOT/runs/$name/checkpoints" ] ||
    $PY -m vit_jax.main --config=configs/demo_finetune.py --workdir="$ROOT/runs/$name" \
      --config.train_split='train[:90%]' "${args[@]}" > "$ROOT.$name.log" 2>&1
done
rm -rf "$ROOT/uniform" "$ROOT/greedy"
echo "== uniform soup, each run and the soup on the test split"
$PY -m vit_jax.tools.soup --out="$ROOT/uniform" --split=test "$ROOT/runs"
echo "== greedy soup, picked on train[90%:]"
$PY -m vit_jax.tools.soup --out="$ROOT/greedy" --recipe=greedy --split='train[90%:]' "$ROOT/runs"
echo "== the greedy soup on the test split"
$PY -m vit_jax.tools.confusion --workdir="$ROOT/greedy" --split=test --top=1 | grep -i accuracy
