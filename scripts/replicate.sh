#!/usr/bin/env bash
# One-GPU replication of the paper's recoverability result (results in docs/results.md).
#
#   scripts/replicate.sh all                   # corpus, the three arms, evaluations, report
#   STEPS=800 scripts/replicate.sh dense       # or one part at a time: corpus | dense | lighthouse | report
#   scripts/replicate.sh report --publish      # also write docs/records/results.json and docs/records/replicate_loss.png
#
# The report (results.json, replicate_loss.png, report.md) goes to $RUN; only --publish (after `report` or
# `all`) writes the tracked files in docs/records/. A CPU smoke run of the whole pipeline, the debug flavor at
# sequence 256 for 80 steps (17 Python processes, about 5 CPU-minutes; 8 minutes on 2 busy cores):
#
#   RUN=/tmp/replicate-smoke STEPS=80 NIAH_LENGTHS=256 NIAH_LIGHTHOUSE_LENGTHS=256 HELDOUT_WINDOWS=2 \
#   EXTRA="--model.flavor debug --training.seq_len 256 --lighthouse.pool 2 --lighthouse.topk 16 \
#   --lighthouse.tile_budget 8 --lighthouse.dense_layers 0 3 --training.local_batch_size 2 \
#   --training.global_batch_size 2 --training.mixed_precision_param float32" scripts/replicate.sh all
#
# Three arms at matched tokens: the same initial weights, the same batches at every step and one LR
# schedule over STEPS steps. `dense`: dense attention from scratch. `switch_<A>`: Lighthouse for steps
# 1..A = 5/8 of STEPS (the paper's 10k of 16k), then dense. `switch_<B>`: Lighthouse to B = 3/4 of STEPS (its
# 12k of 16k), then dense. Stage 1 runs once: to A (checkpoint), continued to B (checkpoint); each stage 2
# resumes one of those checkpoints with Lighthouse off. Every final checkpoint gets held-out loss and NIAH;
# the stage-1 checkpoints get held-out loss with Lighthouse and with dense attention on the same weights.
#
# Environment: STEPS (a multiple of 80, default 800), RUN (output folder), SEED, PYTHON, CONFIG, CORPUS_SOURCES
# (folders of .py files, space-separated; default this Python's standard library), NIAH_LENGTHS, NIAH_LIGHTHOUSE_LENGTHS,
# HELDOUT_WINDOWS, EXTRA (more job arguments for every run, e.g. a smaller flavor for a CPU smoke run).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/corpus.sh

STEPS=${STEPS:-800}
RUN=${RUN:-outputs/replicate}
SEED=${SEED:-0}
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/replicate/small.toml}
NIAH_LENGTHS=${NIAH_LENGTHS:-2048,4096,8192,16384}
NIAH_LIGHTHOUSE_LENGTHS=${NIAH_LIGHTHOUSE_LENGTHS:-4096,8192,16384}
HELDOUT_WINDOWS=${HELDOUT_WINDOWS:-32}
read -r -a EXTRA <<< "${EXTRA:-}"

if [[ -n ${REPORT_OUT:-} ]]; then
  echo "REPORT_OUT=$REPORT_OUT is not read: the report goes to RUN=$RUN; 'report --publish' also writes docs/records/" >&2
  exit 2
fi
whole_numbers STEPS HELDOUT_WINDOWS
if (( STEPS % 80 != 0 )); then
  echo "STEPS=$STEPS must be a positive multiple of 80 (so both switch points fall on stage-1 log steps)" >&2
  exit 2
fi
SWITCH_A=$(( STEPS * 5 / 8 ))
SWITCH_B=$(( STEPS * 3 / 4 ))
CORPUS=$RUN/corpus
# training.steps: the schedule's length, which the evaluations' start-up checks compare total_steps with (train
# sets each stage's own).
JOB=(--job.config_file "$CONFIG" --debug.seed "$SEED" --training.dataset_path "$CORPUS/train/*.jsonl"
     --training.steps "$STEPS" --lr_scheduler.warmup_steps "$(( STEPS / 20 ))" --lr_scheduler.total_steps "$STEPS"
     ${EXTRA[@]+"${EXTRA[@]}"})

now() { date +%s.%N; }

# timed <name> <command...>: run it and append {"name", "start", "end"} to $RUN/walltime.jsonl.
timed() {
  local name=$1 start
  shift
  start=$(now)
  "$@"
  printf '{"name": "%s", "start": %s, "end": %s}\n' "$name" "$start" "$(now)" >> "$RUN/walltime.jsonl"
}

# train <folder> <steps> [job arguments]: one training process (resumes from <folder>'s latest checkpoint).
train() {
  local folder=$1 steps=$2
  shift 2
  timed "$(basename "$folder")-to-$steps" "$PYTHON" train.py "${JOB[@]}" \
    --job.dump_folder "$folder" --training.steps "$steps" "$@"
}

# evaluate <name> <step folder> [job arguments]: held-out loss and NIAH of one checkpoint.
evaluate() {
  local name=$1 ckpt=$2 lengths=$NIAH_LENGTHS
  shift 2
  [[ " $* " == *" --lighthouse.no-enable "* ]] || lengths=$NIAH_LIGHTHOUSE_LENGTHS
  "$PYTHON" scripts/heldout_loss.py --checkpoint "$ckpt" --data "$CORPUS/heldout/*.jsonl" \
    --windows "$HELDOUT_WINDOWS" --out "$RUN/eval/heldout_$name" "${JOB[@]}" "$@"
  "$PYTHON" scripts/niah.py --checkpoint "$ckpt" --lengths "$lengths" --out "$RUN/eval/niah_$name" \
    --title "$name" "${JOB[@]}" "$@"
}

part_corpus() {
  mkdir -p "$RUN"
  make_corpus "$CORPUS"
}

part_dense() {
  train "$RUN/dense" "$STEPS" --lighthouse.no-enable
  evaluate dense "$RUN/dense/checkpoint/step-$STEPS" --lighthouse.no-enable
}

part_lighthouse() {
  # Stage 1 logs every 10 steps: each logged step also re-runs selection for the Lighthouse statistics.
  train "$RUN/lighthouse" "$SWITCH_A" --metrics.log_freq 10
  train "$RUN/lighthouse" "$SWITCH_B" --metrics.log_freq 10
  for switch in "$SWITCH_A" "$SWITCH_B"; do
    train "$RUN/switch_$switch" "$STEPS" --lighthouse.no-enable \
      --checkpoint.initial_load_path "$RUN/lighthouse/checkpoint/step-$switch" --checkpoint.no-initial-load-model-only
  done
  evaluate "stage1_$SWITCH_A" "$RUN/lighthouse/checkpoint/step-$SWITCH_A"
  evaluate "stage1_$SWITCH_B" "$RUN/lighthouse/checkpoint/step-$SWITCH_B"
  for switch in "$SWITCH_A" "$SWITCH_B"; do
    evaluate "switch_$switch" "$RUN/switch_$switch/checkpoint/step-$STEPS" --lighthouse.no-enable
  done
}

# part_report [--publish]: the report into $RUN; with --publish, its results and plot into docs/records/ as well.
part_report() {
  "$PYTHON" scripts/replicate_report.py --run "$RUN" --steps "$STEPS" --config "$CONFIG" "$@" \
    ${EXTRA[@]+"${EXTRA[@]}"}
}

case "$# ${1:-} ${2:-}" in
  "1 corpus " | "1 dense " | "1 lighthouse ") "part_$1" ;;
  "1 report " | "2 report --publish") part_report "${@:2}" ;;
  "1 all " | "2 all --publish") part_corpus; part_dense; part_lighthouse; part_report "${@:2}" ;;
  *) echo "usage: $0 corpus|dense|lighthouse|report|all, or $0 report|all --publish" >&2; exit 2 ;;
esac
