# shellcheck shell=bash
# Sourced by the study scripts (replicate.sh, causality_study.sh, time_to_quality.sh), from the repository root.

# make_corpus <out folder> [make_corpus.py options]: the byte corpus of scripts/make_corpus.py, from the folders
# of the CORPUS_SOURCES environment variable (space-separated; unset: this Python's standard library).
make_corpus() {
  local out=$1 sources=() folder folders
  shift
  read -r -a folders <<< "${CORPUS_SOURCES:-}"
  for folder in ${folders[@]+"${folders[@]}"}; do sources+=(--source "$folder"); done
  "${PYTHON:-python3}" scripts/make_corpus.py --out "$out" ${sources[@]+"${sources[@]}"} "$@"
}
