# shellcheck shell=bash
# Sourced by the study scripts (replicate.sh, causality_study.sh, time_to_quality.sh, time_to_quality_long.sh), from
# the repository root: the corpus they train on, and the check of the counts they read from the environment.

# whole_numbers NAME...: each named environment variable holds a whole number >= 1 (digits, no leading zero: bash
# arithmetic reads 080 as octal and "abc" as a variable), else one line naming it and exit code 2.
whole_numbers() {
  local name
  for name in "$@"; do
    [[ ${!name} =~ ^[1-9][0-9]*$ ]] || { echo "$name=${!name} must be a whole number >= 1" >&2; exit 2; }
  done
}

# make_corpus <out folder> [make_corpus.py options]: the byte corpus of scripts/make_corpus.py, from the folders
# of the CORPUS_SOURCES environment variable (space-separated; unset: this Python's standard library).
make_corpus() {
  local out=$1 sources=() folder folders
  shift
  read -r -a folders <<< "${CORPUS_SOURCES:-}"
  for folder in ${folders[@]+"${folders[@]}"}; do sources+=(--source "$folder"); done
  "${PYTHON:-python3}" scripts/make_corpus.py --out "$out" ${sources[@]+"${sources[@]}"} "$@"
}
