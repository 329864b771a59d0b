#!/usr/bin/env bash
# Submit one training job, or a chain of stages where each starts only after the previous one succeeded.
#
#   slurm/submit.sh [--dry-run] [sbatch options] STAGE1.toml [STAGE2.toml ...] [-- --section.key value ...]
#
# e.g. the two-stage recipe on 4 nodes (stage 2 resumes stage 1's checkpoint folder with dense attention):
#   slurm/submit.sh --nodes=4 --partition=gpu configs/<stage1>.toml configs/<stage2>.toml
#
# Every stage gets the same sbatch options (a resumed checkpoint needs the same data-parallel degree) and
# the same overrides after `--`. Each job is named after its TOML file. A stage starts after the previous
# one exits 0 (--dependency=afterok), and is cancelled if that one fails (--kill-on-invalid-dep=yes); a
# requeued stage keeps its job id, so the chain waits for it. Prints "<job id> <job name> <config>" per job.
# --dry-run prints the chain's sbatch commands instead, as run from the repository root (a later stage's
# dependency names JOB<N> for the id the N-th stage would get), and submits nothing; it needs no SLURM.
set -euo pipefail

die() {
    echo "submit.sh: $*" >&2
    exit 2
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dry_run=""
sbatch_opts=()
configs=()
overrides=()
while (($#)); do
    case $1 in
    --)
        shift
        overrides=("$@")
        break
        ;;
    --dry-run)
        dry_run=1
        ;;
    *.toml)
        [[ -f $1 ]] || die "config file not found: $1"
        configs+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")")
        ;;
    *)
        [[ -n $1 ]] || die "an empty argument: give sbatch options, then config files (.toml), then -- and overrides"
        option=${1%%=*}
        [[ ! ($option == --* && $option == *.*) ]] ||
            die "$option is a train.py override, not an sbatch option: put overrides after --"
        [[ $option != --dependency ]] ||
            die "$1: submit.sh sets each stage's --dependency itself (afterok on the stage before)"
        [[ ! -f $1.toml ]] || die "$1 is not a config file name (configs end in .toml): did you mean $1.toml?"
        sbatch_opts+=("$1")
        ;;
    esac
    shift
done
usage="usage: slurm/submit.sh [--dry-run] [sbatch options] STAGE1.toml [STAGE2.toml ...] [-- overrides]"
((${#configs[@]})) || die "$usage"
[[ -n $dry_run ]] || command -v sbatch >/dev/null ||
    die "sbatch not found: this machine has no SLURM (--dry-run prints the chain's sbatch commands)"

# Jobs start in the submit directory: the repository root, where train.py and logs/ are.
cd "$repo"
[[ -n $dry_run ]] || mkdir -p logs
previous=""
stage=0
for config in "${configs[@]}"; do
    stage=$((stage + 1))
    name=$(basename "$config" .toml)
    args=(--parsable --job-name="$name")
    if [[ -n $previous ]]; then
        args+=(--dependency="afterok:$previous" --kill-on-invalid-dep=yes)
    fi
    command=(sbatch "${args[@]}" "${sbatch_opts[@]}" slurm/train.sbatch "$config" "${overrides[@]}")
    if [[ -n $dry_run ]]; then
        line=$(printf '%q ' "${command[@]}")
        echo "${line% }"
        previous="JOB$stage"
        continue
    fi
    job=$("${command[@]}")
    job=${job%%;*} # --parsable prints "id" or "id;cluster"
    [[ $job =~ ^[0-9]+$ ]] || die "sbatch did not return a job id for $config: '$job'"
    echo "$job $name $config"
    previous=$job
done
