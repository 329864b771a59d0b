#!/usr/bin/env bash
# FlashAttention-4 beside cuDNN on one GPU, every record of docs/benchmarks.md's FlashAttention-4 section:
#
#   scripts/flash_attn_measure.sh OUT [check] [train] [bench]     # default: all three, in that order
#
#   check  python scripts/flash_attn_check.py --out OUT: parity, layer latency, a training step, and attention alone
#          from 4K to 128K with the kernel `backend = "auto"` takes at each (OUT/flash_attn_check.json: auto_from,
#          the length for lighthouse.flash_attn.AUTO_FROM, and auto_ok)
#   train  python scripts/train_throughput.py: the paper model at 98,304 tokens, compiled, full activation
#          checkpointing, Lighthouse and dense, each on cuDNN and on FlashAttention-4: tok/s and peak memory
#          (OUT/train_throughput_flash_attn.json)
#   bench  python scripts/bench_attention.py: the one-layer table with the FlashAttention-4 dense column and the
#          speed-ups against the faster dense kernel (OUT/bench_attention/)
#
# Each part writes its own record with the card, versions, commit and command; nothing under docs/ is written
# (copy the records there by hand). Needs CUDA and `pip install -e ".[train,kernels,flash]"` (docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."

die() {
    echo "flash_attn_measure.sh: $*" >&2
    exit 2
}

(($# >= 1)) || die "usage: scripts/flash_attn_measure.sh OUT [check] [train] [bench]"
OUT=$1
shift
case $OUT in
"" | check | train | bench) die "OUT='$OUT' names no output folder: give it first, then the parts" ;;
esac
[[ ! -e $OUT || -d $OUT ]] || die "OUT=$OUT is a file, not a folder"
PARTS=("$@")
((${#PARTS[@]})) || PARTS=(check train bench)
PYTHON=${PYTHON:-python3}
for part in "${PARTS[@]}"; do
    case $part in
    check | train | bench) ;;
    *) die "unknown part: $part (check, train or bench)" ;;
    esac
done
mkdir -p "$OUT"
for part in "${PARTS[@]}"; do
    echo "flash_attn_measure.sh: $part" >&2
    case $part in
    check) "$PYTHON" scripts/flash_attn_check.py --out "$OUT" ;;
    train) "$PYTHON" scripts/train_throughput.py --compile on --ac full --backend cudnn,flash_attn \
        --json "$OUT/train_throughput_flash_attn.json" ;;
    bench) "$PYTHON" scripts/bench_attention.py --stages '' --out "$OUT/bench_attention" ;;
    esac
done
