#!/usr/bin/env bash
# Build a wheelhouse of everything the recipe needs beyond torch, for a target Python and platform, so that
# air-gapped GPU nodes install without an index.
#
#   scripts/build_wheelhouse.sh [--out wheelhouse] [--python 3.12] [--platform manylinux_2_28_x86_64]
#                               [--extras train] [--exclude torch] [--with SPEC ...]
#
# Then, on the node, from the repository checkout, in an environment that already has torch:
#   python -m pip install --no-index --find-links wheelhouse -e ".[train]"
#
# How: the project's own wheel is built; pip resolves it with its extras for the target without installing
# anything (`pip install --dry-run --report`); every package reachable from it except through an excluded
# one (torch: its CUDA libraries and triton come with the torch you install) is downloaded as a binary
# wheel for the target, together with the build backend (so `pip install -e .` builds offline).
# wheelhouse/requirements.txt pins the set. Environment markers are evaluated on this machine, as pip does:
# build on Linux with the target's Python version when the set must match exactly.
set -euo pipefail

die() {
    echo "build_wheelhouse.sh: $*" >&2
    exit 2
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=${PYTHON:-python3}
out=wheelhouse
python_version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
platform="manylinux_2_28_$(uname -m)"
extras=train
exclude=torch
with=()
while (($#)); do
    case $1 in
    --out | --python | --platform | --extras | --exclude | --with)
        (($# >= 2)) || die "$1 needs a value"
        case $1 in
        --out) out=$2 ;;
        --python) python_version=$2 ;;
        --platform) platform=$2 ;;
        --extras) extras=$2 ;;
        --exclude) exclude=$2 ;;
        --with) with+=("$2") ;;
        esac
        shift 2
        ;;
    -h | --help)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}"  # the header comment
        exit 0
        ;;
    *) die "unknown argument: $1 (see --help)" ;;
    esac
done
[[ $python_version =~ ^3\.[0-9]+$ ]] || die "--python $python_version: give major.minor, e.g. 3.12"
[[ -n $platform ]] || die "--platform '': give a wheel platform tag, e.g. manylinux_2_28_x86_64"
# pip only warns of an extra the project lacks and builds a wheelhouse without it: name it here instead.
problem=$("$py" - "$repo/pyproject.toml" "$extras" <<'PY'
import sys

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomli, if installed; without either, pip's own warning remains
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        sys.exit()
with open(sys.argv[1], "rb") as f:
    known = tomllib.load(f)["project"].get("optional-dependencies", {})
unknown = [e for e in sys.argv[2].split(",") if e.strip() and e.strip() not in known]
if unknown:
    print(f"the project has no extra {', '.join(map(repr, unknown))} (it has: {', '.join(known)})", end="")
PY
)
[[ -z $problem ]] || die "--extras $extras: $problem"
"$py" -c 'import sys; from pip import __version__ as v; sys.exit(tuple(map(int, v.split(".")[:2])) < (22, 2))' ||
    die "pip >= 22.2 is needed for --report: $py -m pip install -U pip"
host_version=$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [[ $host_version != "$python_version" || $platform != *"$(uname -m)" ]]; then
    echo "note: building for Python $python_version on $platform from Python $host_version on $(uname -m):" \
        "dependencies behind environment markers follow this machine" >&2
fi

# A manylinux_2_X tag also accepts wheels for every older glibc (pip takes only the tags it is given).
platform_flags=()
if [[ $platform =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
    glibc=${BASH_REMATCH[1]}
    arch=${BASH_REMATCH[2]}
    for ((minor = glibc; minor >= 5; minor--)); do
        platform_flags+=(--platform "manylinux_2_${minor}_${arch}")
    done
    ((glibc >= 17)) && platform_flags+=(--platform "manylinux2014_${arch}")
    ((glibc >= 12)) && platform_flags+=(--platform "manylinux2010_${arch}")
    platform_flags+=(--platform "manylinux1_${arch}")
else
    platform_flags+=(--platform "$platform")
fi
abi="cp${python_version/./}"
target=(--only-binary=:all: --python-version "$python_version" --implementation cp --abi "$abi" "${platform_flags[@]}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

echo "== building the project wheel"
# From a copy of the checkout's files: an in-tree build would reuse a stale build/ folder.
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    while IFS= read -r -d '' file; do
        if [[ -f $repo/$file ]]; then
            mkdir -p "$work/src/$(dirname "$file")"
            cp "$repo/$file" "$work/src/$file"
        fi
    done < <(git -C "$repo" ls-files -z --cached --others --exclude-standard)
else
    cp -r "$repo" "$work/src"
fi
"$py" -m pip wheel --no-deps --wheel-dir "$work/dist" "$work/src" >"$work/build.log" 2>&1 ||
    die "building the project wheel failed: $(cat "$work/build.log")"
project_wheel=$(echo "$work"/dist/*.whl)
[[ -f $project_wheel ]] || die "no wheel was built in $work/dist"
cp "$project_wheel" "$out/"
root=$project_wheel
install_target=.
if [[ -n $extras ]]; then
    root="${project_wheel}[$extras]"
    install_target=".[$extras]"
fi
mapfile -t build_requires < <("$py" - "$repo/pyproject.toml" <<'PY'
import sys
try:
    import tomllib
except ModuleNotFoundError:
    import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
)

echo "== resolving for Python $python_version on $platform (extras: ${extras:-none}; excluded: ${exclude:-none})"
"$py" -m pip install --quiet --dry-run --ignore-installed --report "$work/report.json" --target "$work/unused" \
    "${target[@]}" "$root" "${build_requires[@]}" "${with[@]}"

# Keep what the roots reach without passing through an excluded package; write the pins.
"$py" - "$work/report.json" "$project_wheel" "$exclude" "$out/requirements.txt" "$work/download.txt" <<'PY'
import json
import sys

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # pip vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name

report_path, project_wheel, exclude, requirements_path, download_path = sys.argv[1:]
with open(report_path) as f:
    installs = {canonicalize_name(item["metadata"]["name"]): item for item in json.load(f)["install"]}
excluded = {canonicalize_name(name) for name in exclude.split(",") if name.strip()}
project = canonicalize_name(project_wheel.rsplit("/", 1)[-1].split("-")[0])
todo = [(name, frozenset(item.get("requested_extras") or ())) for name, item in installs.items() if item["requested"]]
seen, kept = set(), set()
while todo:
    name, extras = todo.pop()
    if name in excluded or (name, extras) in seen:
        continue
    seen.add((name, extras))
    kept.add(name)
    for text in installs[name]["metadata"].get("requires_dist") or []:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
            dependency = canonicalize_name(requirement.name)
            if dependency in installs:
                todo.append((dependency, frozenset(requirement.extras)))
pins = sorted(f"{installs[name]['metadata']['name']}=={installs[name]['metadata']['version']}"
              for name in kept if name != project)
with open(requirements_path, "w") as f:
    f.write(f"# Everything {project} needs beyond {', '.join(sorted(excluded)) or 'nothing'}: "
            "the wheels beside this file.\n" + "\n".join(pins) + "\n")
with open(download_path, "w") as f:
    f.write("\n".join(pins) + "\n")
left_out = sorted(set(installs) - kept)
print(f"   {len(pins)} packages; left to the torch install: {', '.join(left_out) or 'none'}")
PY

echo "== downloading wheels into $out"
"$py" -m pip download --quiet --no-deps "${target[@]}" --dest "$out" -r "$work/download.txt"
echo "== $(find "$out" -name '*.whl' | wc -l) wheels, $(du -sh "$out" | cut -f1) in $out; install on the node with:"
echo "   python -m pip install --no-index --find-links $out -e \"$install_target\""
