#!/usr/bin/env bash
# The causality audit of docs/causality.md: stage-1 models trained with each selection mode, then audited.
#
#   scripts/causality_study.sh all            # corpus, train (paper, causal), audit, combine
#   RUN=/tmp/audit STEPS=600 scripts/causality_study.sh train
#   CPU smoke run (minutes): RUN=/tmp/audit STEPS=4 SAMPLES=4 WINDOWS=2 LOOKAHEADS=1,4 \
#     CORPUS_SOURCES="lighthouse recipe lighthouse_kernels scripts" EXTRA="--model.flavor debug \
#     --training.seq_len 1024 --lighthouse.pool 2 --lighthouse.topk 32 --lighthouse.tile_budget 16 \
#     --lighthouse.dense_layers 0 3 --training.local_batch_size 1 --training.global_batch_size 1" \
#     scripts/causality_study.sh all
#
# Model and data: configs/replicate/small.toml (the `small` flavor, seq 16,384, L=3 p=4 k=256 m=64, layers 0
# and 11 dense) on the Python-source corpus of scripts/make_corpus.py (CORPUS_SOURCES: folders, default this
# Python's standard library). Each mode trains STEPS steps from the same seed and data order; the audit samples
# SAMPLES block starts (seed 0) in WINDOWS held-out windows, at each of LOOKAHEADS, for the model with its own
# selection and, as a control, with dense attention on the paper-trained weights. Everything goes under RUN;
# the combined record is RUN/causality.json (+ .png), copied to docs/records/ only by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=/dev/null
source scripts/corpus.sh

RUN=${RUN:-outputs/causality}
STEPS=${STEPS:-600}
SAMPLES=${SAMPLES:-192}
WINDOWS=${WINDOWS:-16}
whole_numbers STEPS SAMPLES WINDOWS
LOOKAHEADS=${LOOKAHEADS:-1,4,16,64,256}
PYTHON=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/replicate/small.toml}
read -r -a EXTRA <<< "${EXTRA:-}"
CORPUS=$RUN/corpus
JOB=(--job.config_file "$CONFIG" --training.dataset_path "$CORPUS/train/*.jsonl" ${EXTRA[@]+"${EXTRA[@]}"})

part_corpus() {
  make_corpus "$CORPUS"
}

part_train() {
  local mode
  for mode in paper causal; do
    "$PYTHON" train.py "${JOB[@]}" --lighthouse.selection "$mode" --job.dump_folder "$RUN/$mode" \
      --training.steps "$STEPS" --lr_scheduler.warmup_steps "$(( (STEPS + 19) / 20 ))" \
      --lr_scheduler.total_steps "$STEPS" --metrics.log_freq 10 --lighthouse.no-log-stats
  done
}

# audit <name> <mode> [job arguments]: one checkpoint, one attention setting.
audit() {
  local name=$1 mode=$2
  shift 2
  "$PYTHON" scripts/causality_audit.py --checkpoint "$RUN/$mode/checkpoint/step-$STEPS" \
    --data "$CORPUS/heldout/*.jsonl" --windows "$WINDOWS" --samples "$SAMPLES" --lookaheads "$LOOKAHEADS" \
    --out "$RUN/audit/$name" "${JOB[@]}" "$@"
}

part_audit() {
  audit paper paper --lighthouse.selection paper
  audit causal causal --lighthouse.selection causal
  audit dense_on_paper_weights paper --lighthouse.no-enable
  "$PYTHON" scripts/causality_audit.py --combine "$RUN/audit/paper.json" "$RUN/audit/causal.json" \
    "$RUN/audit/dense_on_paper_weights.json" --out "$RUN/causality"
}

case "${1:-}" in
  corpus | train | audit) "part_$1" ;;
  all) part_corpus; part_train; part_audit ;;
  *) echo "usage: $0 corpus|train|audit|all" >&2; exit 2 ;;
esac
