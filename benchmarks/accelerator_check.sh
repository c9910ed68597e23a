#!/usr/bin/env bash
# The framework end to end on one accelerator, one command of at most 8 minutes (issues 38, 39):
#
#   bash benchmarks/accelerator_check.sh                            # on a GPU machine
#   JAX_PLATFORMS=cpu bash benchmarks/accelerator_check.sh --small  # the same steps, tiny, on CPU
#
# First the wheels in .whl/ (benchmarks/accelerator_wheels.sh makes them; git ignores them, so a
# device run names .whl in its carry) go into /tmp/site, unless the packages import already.
# Then each step runs, timed, and its status is recorded; a failed step does not stop the others:
#   env             the device, the driver and the packages' versions
#   normalize       uint8 batches normalised on the device: every level to the host's bits
#   demo            configs/demo.py through `python3 -m vit_jax.main`: its final eval top-1
#   resume          a shortened demo killed (SIGKILL) after its first checkpoint and resumed by the
#                   same command: its final parameters bit-identical to an uninterrupted run's
#   export_predict  vit_jax.tools.export of the demo's workdir; vit_jax.tools.predict on test digits from the
#                   workdir and from the export
#   finetune        configs/demo_finetune.py from the demo's workdir
#   input_pipeline  benchmarks/input_pipeline.py on generated 500x375 JPEGs at 224 px, batch 256,
#                   inception crop + flip, on all host cores
#   jpegs           a folder of 2048 such JPEGs, for b16_folder
#   b16_synthetic   benchmarks/train_step.py: ViT-B/16 bf16 batch 256 on synthetic batches, steps in
#                   flight as the training loop runs them (--in-flight)
#   b16_folder      the same model and batch trained through the CLI from the JPEG folder: its
#                   images/s beside the synthetic batches'
#   l16_synthetic   benchmarks/train_step.py: ViT-L/16 bf16 batch 128 on synthetic batches
# and, only where ONLY names them or with ALL=1 (the default run stays within 8 minutes):
#   b16_fp8         b16_synthetic with model.matmul='fp8' (FP8 products: cuBLASLt's on GPUs of
#                   compute capability 8.9+), the first of ATTENTIONS
#   l16_fp8         l16_synthetic with model.matmul='fp8'
#   b16_folder_at_step  b16_folder with config.device_prefetch=0 (each batch copied at its step),
#                   the first of ATTENTIONS (after jpegs and that attention's b16_synthetic)
#   lora            configs/demo_finetune.py from the demo's workdir with low-rank adapters (rank 8,
#                   every layer) and the Polyak average of what trains: its final eval top-1 and the
#                   average's, then its export (the adapters folded) predicting the test digits
#   soup            vit_jax.tools.soup of finetune's and lora's runs (the adapters folded) scored on
#                   the test digits, and the confusion tool's calibration of the soup (after both)
#   flexi           configs/demo_flexi.py (the demo as a FlexiViT: patches of 2, 4 or 8 px, a branch
#                   of the step each): its final eval top-1 at each patch size
#   mae             configs/mae_demo.py (the demo's ViT pretrained as a masked autoencoder: the
#                   encoder's gather of the visible patches, the decoder's unshuffle): its eval_loss
#   b16_lora        b16_synthetic with --lora_rank=16 (query and value): the adapters and the head
#                   train, no gradient of the frozen weights
#   b16_patch_dropout  b16_synthetic with model.patch_dropout=0.5: the blocks see half the patches
#   out_of_memory   the demo at 1024 px (65,536 patches: attention scores no device holds) through
#                   the CLI: exit status 1 before its first step, with one line giving the sizes and
#                   the fields that lower them (train/memory_fit.py)
#   tests           the test suite's fast tier (make test's tests; TESTS='tests/models ...' another
#                   selection) on the accelerator, every matmul at float32's full precision
#                   (JAX_DEFAULT_MATMUL_PRECISION=highest, as the CPU computes), a worker per two
#                   cores: the counts, and each failure under its cause in tests_failures.md beside
#                   the summary (tests.xml: pytest's JUnit XML); tests that need more devices than
#                   there are (`devices(8)`) are skipped, modules that do not import (TensorFlow's,
#                   where it is absent) are errors and the rest run
#   revisions       only with REVISIONS=DIR (what `benchmarks/revisions.sh prepare` wrote, carried):
#                   b16_synthetic's step in each commit prepared there, one after the other
# ATTENTIONS (default 'xla') lists the model.attention values b16_synthetic and b16_folder measure,
# each a step of its own, named after it (e.g. ATTENTIONS='xla dot_product_attention': cuDNN's
# fused attention on a GPU, steps b16_synthetic_dot_product_attention...); l16_synthetic takes the
# first.
# The summary table is printed and written to $OUT/summary.md (else to a temporary folder, named at
# the end), with every step's log in logs/ beside it. Exit status: 0 if every step passed.
# PYTHON (default python3) is the interpreter; WORK (default: a temporary folder, removed at the
# end) holds the workdirs and images; ONLY='demo finetune' runs only those steps (and the wheels').
set -u
cd "$(dirname "$0")/.."

SMALL=0
[[ ${1:-} == --small ]] && SMALL=1
PY=${PYTHON:-python3}
RESULTS=${OUT:-$(mktemp -d -t accelerator_check.XXXXXX)}
LOGS=$RESULTS/logs
mkdir -p "$LOGS"
: > "$LOGS/steps.tsv"
if [[ -z ${WORK:-} ]]; then
  WORK=$(mktemp -d -t accelerator_work.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT
fi
CORES=$(nproc)
ATTENTIONS=(${ATTENTIONS:-xla})

if ((SMALL)); then  # Minutes on a 2-core CPU: tiny step counts, ViT-Ti, small images, few JPEGs.
  DEMO=(--config.total_steps=60 --config.log_every_steps=20 --config.eval_every_steps=60
        --config.checkpoint_every_steps=60)
  DEMO_BAR=0
  RESUME=(--config.total_steps=100 --config.log_every_steps=10 --config.eval_every_steps=100
          --config.checkpoint_every_steps=10)
  KILL_AT=10
  FINETUNE=(--config.total_steps=20 --config.log_every_steps=10 --config.eval_every_steps=20
            --config.checkpoint_every_steps=20)
  DIGITS=20
  INPUT=(--image_size=64 --batch=32 --num_images=64 --warmup=1 --batches=4)
  JPEGS=64
  MODEL=(--variant=ViT-Ti_16 --image_size=32 --batch=16)
  LARGE=(--variant=ViT-Ti_16 --image_size=32 --batch=8)
  SYNTHETIC=(--warmup=1 --steps=1 --rounds=2)
  B16=(--config.variant=ViT-Ti_16 --config.image_size=32 --config.batch_size=16
       --config.num_epochs=2 --config.log_every_steps=2 --config.lr.warmup_steps=2)  # 8 steps
else
  DEMO=()
  DEMO_BAR=0.97  # The README's "above 97%".
  RESUME=(--config.total_steps=500 --config.log_every_steps=100 --config.eval_every_steps=500
          --config.checkpoint_every_steps=100)
  KILL_AT=100
  FINETUNE=()
  DIGITS=200
  INPUT=(--image_size=224 --batch=256 --num_images=2048)
  JPEGS=2048
  MODEL=(--variant=ViT-B_16 --image_size=224 --batch=256)
  LARGE=(--variant=ViT-L_16 --image_size=224 --batch=128)
  SYNTHETIC=(--steps=10 --rounds=3)  # 10 steps in flight a round.
  # The recipe counts epochs (total_steps cannot be set beside it): 200 steps of 256 JPEGs.
  B16=(--config.batch_size=256 --config.num_epochs=25 --config.log_every_steps=50
       --config.lr.warmup_steps=30)
fi
OPTIONAL='b16_fp8 l16_fp8 b16_folder_at_step lora soup flexi mae b16_lora b16_patch_dropout'
OPTIONAL+=' out_of_memory tests'
# The input pipeline's worker processes, where it has them (the TensorFlow-free pipeline).
WORKERS=()
grep -q -- "'--workers'" benchmarks/input_pipeline.py && WORKERS=(--workers="$CORES")

# step NAME LIMIT_S FUNCTION: runs FUNCTION with its output in logs/NAME.log and its commands
# bounded to LIMIT_S seconds in all, and records its status, seconds and what it noted.
step() {
  local name=$1 start=$SECONDS rc status=ok
  [[ -n ${ONLY:-} && $name != wheels && " $ONLY " != *" $name "* ]] && return
  [[ -z ${ONLY:-} && ${ALL:-0} != 1 && " $OPTIONAL " == *" $name "* ]] && return
  DEADLINE=$((SECONDS + $2)) NOTE=$LOGS/$name.note
  : > "$NOTE"
  echo "== $name (at most $2 s)" >&2
  "$3" > "$LOGS/$name.log" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && status="FAIL (out of time, exit $rc)"
  ((rc && rc != 124 && rc != 137)) && status="FAIL (exit $rc)"
  ((rc)) && echo "last line: $(grep -v '^\s*$' "$LOGS/$name.log" | tail -1 | cut -c1-300)" \
    >> "$NOTE"
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" $((SECONDS - start)) "$(paste -sd' ' "$NOTE")" \
    >> "$LOGS/steps.tsv"
  echo "   $status in $((SECONDS - start)) s: $(paste -sd' ' "$NOTE")" >&2
}

note() { echo "$*" >> "$NOTE"; }
# A command within the step's time left.
bounded() { timeout -k 10 $((DEADLINE - SECONDS > 1 ? DEADLINE - SECONDS : 1)) "$@"; }
py() { bounded "$PY" "$@"; }
# A line from benchmarks/accelerator_check.py, noted (its status is the pipeline's: pipefail).
helper() { py benchmarks/accelerator_check.py "$@" | tee -a "$NOTE"; }
main() { py -m vit_jax.main --config="$1" --workdir="$2" "${@:3}"; }  # main CONFIG WORKDIR FLAGS...
# running PID: the process has not ended (nor is it a zombie, which kill -0 still finds).
running() { [[ $(awk '{print $3}' "/proc/$1/stat" 2> /dev/null) =~ ^[^ZX]$ ]]; }

install_wheels() {  # In this shell (not a subshell): PYTHONPATH is for every later step.
  if "$PY" -c 'import ml_collections, clu, grain, array_record, tensorflow_datasets' 2> /dev/null
  then
    note 'the packages import already: nothing installed'
    return
  fi
  bounded "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return
  export PYTHONPATH=/tmp/site:$PWD
  note "installed $(ls .whl/*.whl | wc -l) wheels into /tmp/site"
}

check_env() ( set -eo pipefail; helper environment; )

check_normalize() ( set -eo pipefail; helper normalize_bits; )

check_demo() (
  set -eo pipefail
  local start=$SECONDS
  main configs/demo.py "$WORK/demo" "${DEMO[@]}"
  note "wall $((SECONDS - start)) s;"
  helper metric "$WORK/demo" eval_top1 --at_least="$DEMO_BAR"
)

check_resume() (
  set -eo pipefail
  local total killed=$WORK/resume_killed last
  total=$(printf '%s\n' "${RESUME[@]}" | sed -n 's/^--config.total_steps=//p')
  main configs/demo.py "$WORK/resume_reference" "${RESUME[@]}"
  # In its own process group (setsid): worker processes it leaves behind are counted, then ended.
  setsid "$PY" -m vit_jax.main --config=configs/demo.py --workdir="$killed" "${RESUME[@]}" &
  local pid=$!
  until [[ -d $killed/checkpoints/$KILL_AT ]] || ! running "$pid"; do
    ((SECONDS < DEADLINE)) || {
      note "no checkpoint $KILL_AT in time"
      kill -KILL "$pid"
      exit 124
    }
    sleep 0.05
  done
  running "$pid" && kill -KILL "$pid" || { note 'the run ended before it was killed'; exit 1; }
  wait "$pid" || true
  sleep 1
  local left
  left=$(pgrep -g "$pid" | wc -l || true)
  if ((left)); then
    note "$left processes of the killed run were left;"
    pkill -KILL -g "$pid" || :
  fi
  last=$(ls "$killed/checkpoints" | grep -E '^[0-9]+$' | sort -n | tail -1)
  note "killed after checkpoint $last of $total;"
  ((last < total)) || { note 'the run had finished'; exit 1; }
  main configs/demo.py "$killed" "${RESUME[@]}"
  helper same_params "$killed" "$WORK/resume_reference"
)

check_export_predict() (
  set -eo pipefail
  py -m vit_jax.tools.export --workdir="$WORK/demo" --out="$WORK/export"
  py benchmarks/accelerator_check.py digits "$WORK/digits" --count="$DIGITS"
  for source in --workdir="$WORK/demo" --export="$WORK/export"; do
    py -m vit_jax.tools.predict "$source" --top_k=1 "$WORK/digits" | tee "$WORK/predictions.txt"
    note "${source%%=*}:"
    helper predictions "$WORK/predictions.txt"
  done
)

check_finetune() (
  set -eo pipefail
  main configs/demo_finetune.py "$WORK/demo_finetune" --config.init_from="$WORK/demo" \
    "${FINETUNE[@]}"
  helper metric "$WORK/demo_finetune" eval_top1
  helper metric "$WORK/demo_finetune" eval_polyak_top1
)

check_lora() (
  set -eo pipefail
  main configs/demo_finetune.py "$WORK/demo_lora" --config.init_from="$WORK/demo" \
    --config.model.lora_rank=8 --config.model.lora_targets="('query', 'key', 'value', 'out', \
'mlp_in', 'mlp_out')" --config.lr.base=0.01 "${FINETUNE[@]}"
  helper metric "$WORK/demo_lora" eval_top1
  helper metric "$WORK/demo_lora" eval_polyak_top1
  py -m vit_jax.tools.export --workdir="$WORK/demo_lora" --out="$WORK/export_lora"
  [[ -d $WORK/digits ]] || py benchmarks/accelerator_check.py digits "$WORK/digits" --count="$DIGITS"
  py -m vit_jax.tools.predict --export="$WORK/export_lora" --top_k=1 "$WORK/digits" \
    | tee "$WORK/predictions_lora.txt"
  note 'export:'
  helper predictions "$WORK/predictions_lora.txt"
)

check_flexi() (
  set -eo pipefail
  main configs/demo_flexi.py "$WORK/demo_flexi" "${DEMO[@]}"
  for metric in eval_top1 p2_top1 p8_top1; do helper metric "$WORK/demo_flexi" "$metric"; done
)

check_out_of_memory() (
  local rc=0 last
  main configs/demo.py "$WORK/out_of_memory" --config.image_size=1024 --config.batch_size=8 \
    --config.total_steps=1 2> "$WORK/out_of_memory.err" || rc=$?
  last=$(grep -v '^\s*$' "$WORK/out_of_memory.err" | tail -1)
  note "exit $rc: ${last:0:120}"
  [[ $rc == 1 && $last == 'error: the train step needs '* ]]
)

check_mae() (
  set -eo pipefail
  main configs/mae_demo.py "$WORK/demo_mae" "${DEMO[@]}"
  helper metric "$WORK/demo_mae" eval_loss
)

check_soup() (
  set -eo pipefail
  py -m vit_jax.tools.soup --out="$WORK/soup" --split=test "$WORK/demo_finetune" \
    "$WORK/demo_lora" | tee "$WORK/soup.txt"
  note "$(grep ' soup of ' "$WORK/soup.txt")"
  py -m vit_jax.tools.confusion --workdir="$WORK/soup" --top=1 | tee "$WORK/soup_confusion.txt"
  note "$(grep -o '^calibration: ECE [0-9.]*' "$WORK/soup_confusion.txt")"
)

check_input_pipeline() (
  set -eo pipefail
  py benchmarks/input_pipeline.py --source=folder "${INPUT[@]}" "${WORKERS[@]}" --header \
    | tee "$WORK/input_pipeline.md"
  helper table_value "$WORK/input_pipeline.md" '' images/s
  note "images/s on $CORES cores${WORKERS[*]:+ (${WORKERS[*]})}"
)

check_jpegs() ( set -eo pipefail; helper jpegs "$WORK/jpegs" --num_images="$JPEGS"; )

# synthetic NAME MODEL_FLAGS...: train_step.py's ViT on synthetic batches, with $ATTENTION.
synthetic() {
  py benchmarks/train_step.py "${@:2}" --dtype=bfloat16 --attention="$ATTENTION" "${SYNTHETIC[@]}" \
    --in-flight --header | tee "$WORK/$1.md"
  note "images/s:"
  helper table_value "$WORK/$1.md" vit_jax 'img/s (median)'
  note "MFU:"
  helper table_value "$WORK/$1.md" vit_jax MFU
}

check_b16_synthetic() ( set -eo pipefail; synthetic "synthetic_$ATTENTION" "${MODEL[@]}"; )

check_l16_synthetic() ( set -eo pipefail; synthetic l16_synthetic "${LARGE[@]}"; )

check_b16_fp8() ( set -eo pipefail; synthetic b16_fp8 "${MODEL[@]}" --matmul=fp8; )

check_b16_lora() ( set -eo pipefail; synthetic b16_lora "${MODEL[@]}" --lora_rank=16; )

check_b16_patch_dropout() (
  set -eo pipefail
  synthetic b16_patch_dropout "${MODEL[@]}" --patch_dropout=0.5
)

check_l16_fp8() ( set -eo pipefail; synthetic l16_fp8 "${LARGE[@]}" --matmul=fp8; )

check_revisions() (
  set -eo pipefail
  REVISIONS_DIR=$REVISIONS PYTHON=$PY bounded bash benchmarks/revisions.sh run "${MODEL[@]}" \
    --dtype=bfloat16 --attention="$ATTENTION" "${SYNTHETIC[@]}" --in-flight | tee "$WORK/revisions.md"
  note "$(grep -c '^| vit_jax@' "$WORK/revisions.md") revisions timed"
)

# folder RUN FLAGS...: ViT-B/16 trained through the CLI from the JPEG folder in $WORK/RUN, with
# $ATTENTION and FLAGS; its images/s against b16_synthetic's (run before it).
folder() {
  main configs/vit_b16_i1k.py "$WORK/$1" --config.dataset=folder \
    --config.data_dir="$WORK/jpegs" --config.train_split=train --config.eval_split=test \
    --config.dtype=bfloat16 --config.eval_batch_size=32 --config.eval_every_steps=100000 \
    --config.checkpoint_every_steps=100000 --config.model.attention="$ATTENTION" "${B16[@]}" \
    "${@:2}"
  local synthetic
  synthetic=$(py benchmarks/accelerator_check.py table_value "$WORK/synthetic_$ATTENTION.md" \
    vit_jax 'img/s (median)')
  helper train_rate "$WORK/$1" --synthetic="$synthetic"
}

check_b16_folder() ( set -eo pipefail; folder "b16_$ATTENTION"; )

check_b16_folder_at_step() ( set -eo pipefail; folder b16_at_step --config.device_prefetch=0; )

# The suite on the accelerator: an unset JAX_PLATFORMS passed on empty is JAX's own choice
# (tests/conftest.py sets cpu otherwise); device memory taken as needed, by a process a worker.
check_tests() (
  set -o pipefail
  local tests=(${TESTS:-tests}) rc=0
  JAX_PLATFORMS=${JAX_PLATFORMS-} JAX_DEFAULT_MATMUL_PRECISION=highest \
    XLA_PYTHON_CLIENT_PREALLOCATE=false \
    timeout -s INT -k 30 $((DEADLINE - SECONDS - 30)) "$PY" -m pytest -q -p no:cacheprovider -rfE \
    -n $((CORES / 2 > 1 ? CORES / 2 : 1)) --dist loadgroup -m 'not slow' \
    --continue-on-collection-errors --junitxml="$RESULTS/tests.xml" "${tests[@]}" || rc=$?
  ((rc == 124)) && note 'stopped at the time limit;'
  note "${tests[*]}:"
  helper test_results "$RESULTS/tests.xml" "$RESULTS/tests_failures.md"
)

step wheels 120 install_wheels
step env 60 check_env
step normalize 60 check_normalize
step demo 180 check_demo
step resume 150 check_resume
step export_predict 90 check_export_predict
step finetune 120 check_finetune
step lora 150 check_lora
step soup 90 check_soup
step flexi 240 check_flexi
step mae 150 check_mae
step input_pipeline 120 check_input_pipeline
step jpegs 60 check_jpegs
for ATTENTION in "${ATTENTIONS[@]}"; do
  suffix=${ATTENTION/#xla/}
  step "b16_synthetic${suffix:+_$suffix}" 150 check_b16_synthetic
  step "b16_folder${suffix:+_$suffix}" 240 check_b16_folder
done
ATTENTION=${ATTENTIONS[0]}
step b16_fp8 150 check_b16_fp8
step b16_lora 150 check_b16_lora
step b16_patch_dropout 150 check_b16_patch_dropout
step l16_synthetic 150 check_l16_synthetic
step l16_fp8 150 check_l16_fp8
step b16_folder_at_step 240 check_b16_folder_at_step
step out_of_memory 150 check_out_of_memory
[[ -n ${REVISIONS:-} ]] && step revisions 240 check_revisions
step tests 540 check_tests

for run in demo demo_finetune demo_lora "${ATTENTIONS[@]/#/b16_}" b16_at_step; do  # The runs' curves (a few KB each).
  mkdir -p "$RESULTS/events/$run"
  cp "$WORK/$run"/{events.out.tfevents.*,config.json} "$RESULTS/events/$run/" 2> /dev/null
done
{
  echo "# benchmarks/accelerator_check.sh$( ((SMALL)) && echo ' --small')," \
    "$(date -u '+%Y-%m-%d %H:%M UTC'), git $(git rev-parse --short HEAD 2> /dev/null)" \
    "$(git diff --quiet HEAD 2> /dev/null || echo '(with changes)'), $CORES cores"
  echo
  echo '| step | status | s | result |'
  echo '|---|---|---|---|'
  awk -F'\t' '{gsub(/\|/, "\\|", $4); printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' \
    "$LOGS/steps.tsv"
} > "$RESULTS/summary.md"
cat "$RESULTS/summary.md"
echo "summary and logs: $RESULTS" >&2
! grep -q FAIL "$LOGS/steps.tsv"
