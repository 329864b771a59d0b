#!/usr/bin/env bash
# Time to quality at long context: dense from scratch against Lighthouse -> dense, on one GPU (docs/results.md).
#
#   scripts/time_to_quality.sh corpus                    # package-folder documents (hundreds of KB)
#   scripts/time_to_quality.sh dense 0                   # an arm: dense | paper | causal, then the seed
#   scripts/time_to_quality.sh paper 0                   # stage 1 to the last switch, then each stage 2
#   LATE_TOPK=2048 LATE_FROM=250 SWITCHES=400 scripts/time_to_quality.sh causal 0   # a larger k late in stage 1
#   python scripts/time_to_quality.py --run outputs/time_to_quality --out outputs/time_to_quality/report
#
# Every arm: configs/time_to_quality/tiny_64k.toml, the same initial weights for a seed, the same data order and
# one LR schedule over STEPS steps. A Lighthouse arm runs stage 1 once with SELECTION (its checkpoints every 50
# steps) and resumes each switch point (SWITCHES, steps) with dense attention to STEPS. Each training process
# resumes from its folder's latest checkpoint, so a part stopped midway continues where it stopped. With LATE_TOPK
# and LATE_FROM, stage 1 runs with k = LATE_TOPK from step LATE_FROM on (folder <selection>_s<seed>_k<K>from<F>).
# Environment: RUN (output folder), STEPS, SWITCHES (default 50% and 80% of STEPS), LATE_TOPK, LATE_FROM, PYTHON,
# CORPUS_SOURCES, EXTRA.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/corpus.sh

RUN=${RUN:-outputs/time_to_quality}
STEPS=${STEPS:-500}
SWITCHES=${SWITCHES:-"$(( STEPS / 2 )) $(( STEPS * 4 / 5 ))"}
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/time_to_quality/tiny_64k.toml}
read -r -a EXTRA <<< "${EXTRA:-}"
read -r -a SWITCH_STEPS <<< "$SWITCHES"
CORPUS=$RUN/corpus
JOB=(--job.config_file "$CONFIG" --training.dataset_path "$CORPUS/train" --validation.dataset_path "$CORPUS/heldout"
     --lr_scheduler.warmup_steps "$(( STEPS / 20 ))" --lr_scheduler.total_steps "$STEPS" --lighthouse.no-log-stats
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

# lighthouse <selection> <seed>: stage 1 to the last switch point, then every stage 2.
lighthouse() {
  local selection=$1 seed=$2 stage1=$RUN/$1_s$2 switch
  if [[ -n ${LATE_TOPK:-} ]]; then
    stage1+=_k${LATE_TOPK}from${LATE_FROM:?LATE_FROM goes with LATE_TOPK}
    train "$stage1" "$LATE_FROM" "$seed" --lighthouse.selection "$selection"
    train "$stage1" "${SWITCH_STEPS[-1]}" "$seed" --lighthouse.selection "$selection" --lighthouse.topk "$LATE_TOPK"
  else
    train "$stage1" "${SWITCH_STEPS[-1]}" "$seed" --lighthouse.selection "$selection"
  fi
  for switch in "${SWITCH_STEPS[@]}"; do
    train "${stage1}_switch$switch" "$STEPS" "$seed" --lighthouse.no-enable \
      --checkpoint.initial_load_path "$stage1/checkpoint/step-$switch" --checkpoint.no-initial-load-model-only
  done
}

case "${1:-}" in
  corpus) part_corpus ;;
  dense) train "$RUN/dense_s${2:?seed}" "$STEPS" "$2" --lighthouse.no-enable ;;
  paper | causal) lighthouse "$1" "${2:?seed}" ;;
  *) echo "usage: $0 corpus | dense SEED | paper SEED | causal SEED" >&2; exit 2 ;;
esac
