#!/usr/bin/env bash
# The pre-registered study of docs/studies/time_to_quality_long.md: time to quality and the exchange rate at 131,072
# tokens, every arm and seed queued over the GPUs of one machine, one arm part per GPU at a time.
#
#   scripts/time_to_quality_long.sh corpus     # the package-folder corpus (stdlib + the packages below)
#   scripts/time_to_quality_long.sh tasks      # print the queue (name, waits, command)
#   scripts/time_to_quality_long.sh run        # run the queue on GPUS (default 0,1,2,3); rerun to continue
#   scripts/time_to_quality_long.sh report     # the tables, json and plot under $RUN/report
#
# Arms, each for SEEDS (default "0 1"): dense; causal (the recipe's defaults) switching at 50%; causal with every
# 4th stage-1 step dense ([lighthouse] dense_every = 4) switching at 50% and at 75% (one stage 1 serves both).
# Environment: RUN, SEEDS, GPUS, PYTHON, CORPUS_SOURCES (default: this Python's standard library and the
# installed packages named in PACKAGES), STEPS (720; the switches follow at 50% and 75%, warm-up 10%) and EXTRA
# (more job arguments for every arm: a CPU-sized rehearsal).
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=/dev/null
source scripts/corpus.sh

export RUN=${RUN:-outputs/time_to_quality_long}
export CONFIG=configs/time_to_quality/tiny_128k.toml STEPS=${STEPS:-720}
whole_numbers STEPS
export WARMUP=$((STEPS / 10))
SEEDS=${SEEDS:-"0 1"}
GPUS=${GPUS:-0,1,2,3}
PYTHON=${PYTHON:-python3}
PACKAGES=(numpy scipy pandas networkx matplotlib sympy sklearn transformers)
TTQ=scripts/time_to_quality.sh
EVERY=4 HALF=$((STEPS / 2)) LATE=$((STEPS * 3 / 4))

default_sources() {
  "$PYTHON" - "${PACKAGES[@]}" <<'PY'
import importlib.util
import sys
import sysconfig
from pathlib import Path

folders = [sysconfig.get_paths()["stdlib"]]
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"time_to_quality_long.sh: package {name!r} is not installed (set CORPUS_SOURCES)")
    folders.append(str(Path(next(iter(spec.submodule_search_locations)))))
print(" ".join(folders))
PY
}

# task <name> <waits> <command>: one line of the queue.
task() { printf '%s\t%s\t%s\n' "$1" "$2" "$3"; }

tasks() {
  local s
  for s in $SEEDS; do task "causal_s$s" - "SWITCHES=$HALF $TTQ stage1 causal $s"; done
  for s in $SEEDS; do task "dense_s$s" - "$TTQ dense $s"; done
  for s in $SEEDS; do
    task "causal_s${s}_every$EVERY" - "DENSE_EVERY=$EVERY SWITCHES='$HALF $LATE' $TTQ stage1 causal $s"
  done
  for s in $SEEDS; do
    task "causal_s${s}_switch$HALF" "causal_s$s" "SWITCHES=$HALF $TTQ stage2 causal $s $HALF"
  done
  for s in $SEEDS; do
    task "causal_s${s}_every${EVERY}_switch$HALF" "causal_s${s}_every$EVERY" \
      "DENSE_EVERY=$EVERY SWITCHES='$HALF $LATE' $TTQ stage2 causal $s $HALF"
  done
  for s in $SEEDS; do
    task "causal_s${s}_every${EVERY}_switch$LATE" "causal_s${s}_every$EVERY" \
      "DENSE_EVERY=$EVERY SWITCHES='$HALF $LATE' $TTQ stage2 causal $s $LATE"
  done
  # Loss by position of the first seed's final models, dense attention, 8 held-out windows.
  local arm first=${SEEDS%% *}
  for arm in "dense_s$first" "causal_s${first}_switch$HALF" "causal_s${first}_every${EVERY}_switch$HALF" \
    "causal_s${first}_every${EVERY}_switch$LATE"; do
    task "positions_$arm" "$arm" "$PYTHON scripts/heldout_loss.py --checkpoint $RUN/$arm/checkpoint/step-$STEPS \
--data '$RUN/corpus/heldout/*.jsonl' --windows 8 --by-position --out $RUN/positions/$arm \
--job.config_file $CONFIG --lighthouse.no-enable ${EXTRA:-}"
  done
}

case "${1:-}" in
  corpus)
    # Assigned apart: a failed command substitution inside another command's assignments does not stop the script
    # (a missing package built the standard library's corpus alone, another corpus than the study's).
    sources=${CORPUS_SOURCES:-$(default_sources)} || exit 2
    CORPUS_SOURCES=$sources RUN=$RUN "$TTQ" corpus ;;
  tasks) tasks ;;
  run)
    mkdir -p "$RUN"
    tasks > "$RUN/tasks.tsv"
    "$PYTHON" scripts/gpu_queue.py --tasks "$RUN/tasks.tsv" --gpus "$GPUS" --logs "$RUN/queue" ;;
  report)
    "$PYTHON" scripts/time_to_quality.py --run "$RUN" --out "$RUN/report/time_to_quality_long" --seq-len 131072 \
      --device "${DEVICE:-unknown}" --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" \
      --command "scripts/time_to_quality_long.sh run ($CONFIG)" ;;
  *) echo "usage: $0 corpus | tasks | run | report" >&2; exit 2 ;;
esac
