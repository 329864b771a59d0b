#!/usr/bin/env bash
# Time to quality at long context: dense from scratch against Lighthouse -> dense (docs/results.md), one arm part
# per call, on the GPUs CUDA_VISIBLE_DEVICES names.
#
#   scripts/time_to_quality.sh corpus                    # package-folder documents (hundreds of KB)
#   scripts/time_to_quality.sh dense 0                   # an arm: dense | paper | causal, then the seed
#   scripts/time_to_quality.sh paper 0                   # stage 1 to the last switch, then each stage 2
#   scripts/time_to_quality.sh stage1 causal 0           # the same two parts alone (a queue runs them apart)
#   scripts/time_to_quality.sh stage2 causal 0 250
#   LATE_TOPK=2048 LATE_FROM=250 SWITCHES=400 scripts/time_to_quality.sh causal 0   # a larger k late in stage 1
#   DENSE_EVERY=4 scripts/time_to_quality.sh causal 0    # every 4th stage-1 step dense ([lighthouse] dense_every)
#   python scripts/time_to_quality.py --run outputs/time_to_quality --out outputs/time_to_quality/report
#
# Every arm: CONFIG (default configs/time_to_quality/tiny_64k.toml), the same initial weights for a seed, the same
# data order and one LR schedule over STEPS steps. A Lighthouse arm runs stage 1 once with SELECTION (checkpoints
# at the config's interval) and resumes each switch point (SWITCHES, steps) with dense attention to STEPS. Each
# training process resumes from its folder's latest checkpoint, so a part stopped midway continues where it
# stopped. Stage-1 variants get their own folder: <selection>_s<seed>_k<K>from<F> with LATE_TOPK and LATE_FROM
# (k = LATE_TOPK from step LATE_FROM on), <selection>_s<seed>_every<N> with DENSE_EVERY.
# Environment: RUN (output folder), CONFIG, STEPS, WARMUP (default STEPS/20), SWITCHES (default 50% and 80% of
# STEPS), LATE_TOPK, LATE_FROM, DENSE_EVERY, PYTHON, CORPUS_SOURCES, EXTRA.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/corpus.sh

RUN=${RUN:-outputs/time_to_quality}
STEPS=${STEPS:-500}
whole_numbers STEPS
SWITCHES=${SWITCHES:-"$(( STEPS / 2 )) $(( STEPS * 4 / 5 ))"}
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/time_to_quality/tiny_64k.toml}
read -r -a EXTRA <<< "${EXTRA:-}"
read -r -a SWITCH_STEPS <<< "$SWITCHES"
CORPUS=$RUN/corpus
JOB=(--job.config_file "$CONFIG" --training.dataset_path "$CORPUS/train" --validation.dataset_path "$CORPUS/heldout"
     --lr_scheduler.warmup_steps "${WARMUP:-$(( STEPS / 20 ))}" --lr_scheduler.total_steps "$STEPS" --lighthouse.no-log-stats
     ${EXTRA[@]+"${EXTRA[@]}"})

# train <folder> <steps> <seed> [job arguments]
train() {
  local folder=$1 steps=$2 seed=$3
  shift 3
  "$PYTHON" train.py "${JOB[@]}" --debug.seed "$seed" --job.dump_folder "$folder" --training.steps "$steps" "$@"
}

part_corpus() {
  make_corpus "$CORPUS" --documents packages
}

# stage1_folder <selection> <seed>: the folder of a stage-1 run, named after its variant.
stage1_folder() {
  local folder=$RUN/$1_s$2
  [[ -n ${LATE_TOPK:-} ]] && folder+=_k${LATE_TOPK}from${LATE_FROM:?LATE_FROM goes with LATE_TOPK}
  [[ -n ${DENSE_EVERY:-} ]] && folder+=_every$DENSE_EVERY
  echo "$folder"
}

# stage1 <selection> <seed>: Lighthouse to the last switch point.
stage1() {
  local selection=$1 seed=$2 folder variant=()
  folder=$(stage1_folder "$1" "$2")
  [[ -n ${DENSE_EVERY:-} ]] && variant=(--lighthouse.dense_every "$DENSE_EVERY")
  if [[ -n ${LATE_TOPK:-} ]]; then
    train "$folder" "$LATE_FROM" "$seed" --lighthouse.selection "$selection" ${variant[@]+"${variant[@]}"}
    variant+=(--lighthouse.topk "$LATE_TOPK")
  fi
  train "$folder" "${SWITCH_STEPS[-1]}" "$seed" --lighthouse.selection "$selection" ${variant[@]+"${variant[@]}"}
}

# stage2 <selection> <seed> <switch>: dense from stage 1's checkpoint at <switch> to STEPS.
stage2() {
  local stage1
  stage1=$(stage1_folder "$1" "$2")
  train "${stage1}_switch$3" "$STEPS" "$2" --lighthouse.no-enable \
    --checkpoint.initial_load_path "$stage1/checkpoint/step-$3" --checkpoint.no-initial-load-model-only
}

usage() {
  echo "usage: $0 corpus | dense SEED | paper|causal SEED | stage1 SELECTION SEED | stage2 SELECTION SEED SWITCH" >&2
  exit 2
}

# Each part takes its own arguments, no fewer and no more (an extra one was ignored without a word).
case "${1:-} $#" in
  "corpus 1") part_corpus ;;
  "dense 2") train "$RUN/dense_s$2" "$STEPS" "$2" --lighthouse.no-enable ;;
  "paper 2" | "causal 2")
    stage1 "$1" "$2"
    for switch in "${SWITCH_STEPS[@]}"; do stage2 "$1" "$2" "$switch"; done ;;
  "stage1 3") stage1 "$2" "$3" ;;
  "stage2 4") stage2 "$2" "$3" "$4" ;;
  *) usage ;;
esac
