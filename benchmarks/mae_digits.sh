#!/bin/bash
# The masked autoencoder on the digits: configs/mae_demo.py pretrains the demo ViT on the train
# split's images (no labels), then configs/demo.py fine-tunes it, and trains it from scratch, on a
# share of the train split's labels (LABELLED, default train[:10%]: about 144 images) for STEPS
# steps, three seeds each; prints each run's test top-1 and the pretraining's eval_loss. Run from
# the repository root:
#   bash benchmarks/mae_digits.sh        # ROOT=workdirs/mae_digits
set -euo pipefail
ROOT=${ROOT:-workdirs/mae_digits}
PY=${PY:-.venv/bin/python}
LABELLED=${LABELLED:-'train[:10%]'}
STEPS=${STEPS:-1000}
mkdir -p "$ROOT"
[ -d "$ROOT/mae/checkpoints" ] ||
  $PY -m vit_jax.main --config=configs/mae_demo.py --workdir="$ROOT/mae" > "$ROOT/mae.log" 2>&1
echo "pretraining: $(grep -o 'Final eval: .*' "$ROOT/mae.log")"
echo "| start | seed | test top-1 |"
echo "|---|---|---|"
for seed in 0 1 2; do
  for start in mae scratch; do
    run="$ROOT/${start}_$seed"
    init=()
    [ "$start" = mae ] && init=(--config.init_from="$ROOT/mae")
    [ -d "$run/checkpoints" ] ||
      $PY -m vit_jax.main --config=configs/demo.py --workdir="$run" --config.seed=$seed \
        --config.train_split="$LABELLED" --config.total_steps="$STEPS" "${init[@]}" > "$run.log" 2>&1
    echo "| $start | $seed | $(grep -o 'eval_top1=[0-9.]*' "$run.log" | tail -1 | cut -d= -f2) |"
  done
done
