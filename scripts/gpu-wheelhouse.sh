#!/usr/bin/env bash
# Wheels of depsi's dependencies that the lent GPU machine lacks, for scripts/gpu-check.sh to
# install there without a network (`run` with carry [".whl"]).
#
#   bash scripts/gpu-wheelhouse.sh [DIR]      (default DIR: .whl in the repository, git-ignored)
#
# Run here, where pip reaches the package index. It resolves depsi's dependencies for that
# machine's Python (CPython 3.12, manylinux x86-64), then keeps only the wheels of projects its
# image does not hold: PRESENT below is its package list as read on 2026-11-17 (KINDS.md of the
# device tool), so the copy stays small (about 17 MB against 68 MB for all of them; what travels
# is limited to 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.whl}
PY_VERSION=${DEPSI_WHEEL_PYTHON:-3.12}

# projects already on the GPU machine's image (normalised names)
PRESENT="numpy scipy pandas xarray matplotlib psutil tqdm filelock threadpoolctl pyyaml toolz
cloudpickle fsspec msgpack sortedcontainers jinja2 markupsafe urllib3 click packaging
typing-extensions zipp python-dateutil six pyparsing pillow kiwisolver fonttools cycler contourpy
certifi idna requests charset-normalizer"
# left out on purpose: Numba and llvmlite (61 MB of wheels for 3.12: with the rest, past the 64 MiB
# that travels); without them depsi's periodogram runs its array-namespace kernel
OPTIONAL="numba llvmlite"

if [[ $DIR == .whl ]] && ! grep -qx '/.whl/' .git/info/exclude 2>/dev/null; then
    mkdir -p .git/info && echo '/.whl/' >>.git/info/exclude
fi
ALL=$(mktemp -d)
trap 'rm -rf "$ALL"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
         manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_12_x86_64 manylinux2010_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do
    platforms+=(--platform "$p")
done
# depsi's own requirements, read from pyproject.toml
mapfile -t REQUIREMENTS < <(python3 - <<'EOF'
import tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
EOF
)
python3 -m pip download -q --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${platforms[@]}" -d "$ALL" "${REQUIREMENTS[@]}"
mkdir -p "$DIR"
kept=0
for wheel in "$ALL"/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1 | tr '[:upper:]_.' '[:lower:]--')
    if [[ " $(echo "$PRESENT $OPTIONAL" | tr '\n' ' ') " == *" $name "* ]]; then
        continue
    fi
    cp "$wheel" "$DIR/"
    kept=$((kept + 1))
done
echo "gpu-wheelhouse: $kept wheels in $DIR ($(du -sh "$DIR" | cut -f1)):"
ls "$DIR"
