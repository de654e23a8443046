#!/usr/bin/env bash
# The GPU check: the CuPy tests, NumPy against CuPy for every kernel, and the PS chain
# on the CPU and on the GPU for one scene (or several sizes), each chain step timed on both,
# inside 8 minutes on one GPU; figures into OUTDIR.
#
#   bash scripts/gpu-check.sh OUTDIR
#
# Where CuPy or a GPU does not work it is a dry run: the CuPy parts are skipped (and say why),
# the rest runs at a small size, and it exits 0 when everything that ran passed. Files written
# to OUTDIR (six, so that a device run's $OUT brings them all back): summary.md, summary.json,
# kernels.json, chain.json, tests.log, gpu-check.log. Exit status: 0 all parts that ran passed,
# 1 a part failed or ran out of time, 2 depsi or its dependencies cannot be imported.
#
# Environment (all optional):
#   DEPSI_GPU_CHECK_POINTS  PS in the chain's scene: default "1e6 3e6" with a GPU (3e6 where
#                           the time left covers it), 3000 without; a list runs each size in
#                           order, skipping (and saying so) a size the time left cannot cover
#   DEPSI_GPU_CHECK_SCALE   kernel benchmark sizes x this: default 1 with a GPU, 0.02 without
#   DEPSI_GPU_CHECK_BUDGET  seconds for the whole check (default 480); each part gets at most its
#                           own share below and never more than what is left
#   DEPSI_GPU_CHECK_WORK    scratch folder (scene, chain results); default $TMPDIR/depsi-gpu-check
#   DEPSI_GPU_CHECK_COMMIT  the commit to record where the tree has no .git (a device copy)
#   DEPSI_GPU_CHECK_TESTS   the CuPy test modules to run (space-separated paths); default every
#                           module of tests/ that touches CuPy or CUDA
#   DEPSI_WHEELHOUSE        wheels of missing dependencies (default .whl in the repository)
#   PYTHON                  the interpreter (default python3)
#
# Dependencies: this script never reaches the network. On a machine that lacks some of depsi's
# dependencies (the lent GPU machine has NumPy, SciPy, xarray, pandas, CuPy and pytest but not
# Dask, Zarr, shapely, pydantic, cholespy or qdldl), make a wheelhouse here first with
# `bash scripts/gpu-wheelhouse.sh` (it writes .whl/, ignored by git) and carry it: the
# script installs those wheels with `pip install --no-index --no-deps --target` into a scratch
# folder and puts it on PYTHONPATH. depsi itself is used from the working tree (PYTHONPATH).
# Through the device tool's `run` (the tree travels without .git, so name the commit):
#   command: DEPSI_GPU_CHECK_COMMIT=<sha> bash scripts/gpu-check.sh $OUT
#   carry: [".whl"], timeout_s: 560 (8 minutes of check and a margin)
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [[ $# -ne 1 ]]; then
    echo "usage: bash scripts/gpu-check.sh OUTDIR" >&2
    exit 64
fi
OUTDIR=$(mkdir -p "$1" && cd "$1" && pwd) || { echo "gpu-check: cannot create $1" >&2; exit 64; }
WORK=${DEPSI_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/depsi-gpu-check}
mkdir -p "$WORK"
rm -f "$WORK/parts.tsv" "$WORK/chain-sizes.txt" "$WORK"/chain*.json "$WORK"/chain*.npz \
    "$WORK"/chain*.jsonl "$OUTDIR"/*.json \
    "$OUTDIR"/*.md "$OUTDIR"/*.log
PYTHON=${PYTHON:-python3}
BUDGET=${DEPSI_GPU_CHECK_BUDGET:-480}
START=$SECONDS
RESERVE=20  # seconds kept for the comparison and the report
export PYTHONUNBUFFERED=1
exec > >(tee -a "$OUTDIR/gpu-check.log") 2>&1
TEE_PID=$!
# finish STATUS: let tee write the log's last lines before the caller collects OUTDIR
finish() { exec 1>&- 2>&-; wait "$TEE_PID" 2>/dev/null; exit "$1"; }

log() { echo "gpu-check [$((SECONDS - START))s]: $*"; }
# part NAME STATUS SECONDS NOTE: one line of the summary's table
part() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "${4//$'\t'/ }" >>"$WORK/parts.tsv"; }
left() { echo $((BUDGET - RESERVE - (SECONDS - START))); }
# limit SHARE: seconds a part may take, its share or what is left, whichever is less
limit() { local rest; rest=$(left); echo $(( $1 < rest ? $1 : rest )); }

# run_part NAME SHARE MIN_SECONDS LOGFILE CMD...: run CMD under a time limit, record the outcome
run_part() {
    local name=$1 share=$2 min=$3 logfile=$4 seconds status rc t0 note
    shift 4
    seconds=$(limit "$share")
    if (( seconds < min )); then
        log "$name SKIPPED: ${seconds}s left of the budget, it needs at least ${min}s"
        part "$name" skipped 0 "no time left (${seconds}s of the ${BUDGET}s budget)"
        return 3
    fi
    log "$name: starting (limit ${seconds}s): $*"
    t0=$SECONDS
    timeout --kill-after=10 "$seconds" "$@" 2>&1 | tee -a "$logfile"
    rc=${PIPESTATUS[0]}
    if (( rc == 0 )); then
        status=ok
    elif (( rc == 124 || rc == 137 )); then
        status=timeout
    else
        status=failed
    fi
    note="exit $rc"
    if [[ -n ${SUMMARY_RE:-} ]]; then  # e.g. pytest's closing line, for the summary's table
        note+="; $(grep -E "$SUMMARY_RE" "$logfile" | tail -1 | tr -d '=' | xargs)"
    fi
    log "$name: $status ($note) in $((SECONDS - t0))s"
    part "$name" "$status" $((SECONDS - t0)) "$note"
    [[ $status == ok ]]
}

# ---- dependencies -------------------------------------------------------------------------
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
IMPORTS="import depsi, dask, distributed, zarr, xarray, shapely, pydantic, cholespy, qdldl"
DEPS_NOTE="all importable"
if ! "$PYTHON" -c "$IMPORTS" 2>/dev/null; then
    WHEELS=${DEPSI_WHEELHOUSE:-$REPO/.whl}
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        SITE="$WORK/site"
        log "dependencies missing; installing the wheels of $WHEELS into $SITE (no network)"
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --upgrade --target "$SITE" "$WHEELS"/*.whl
        export PYTHONPATH="$REPO:$SITE${PYTHONPATH#"$REPO"}"
        DEPS_NOTE="installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS"
    else
        log "dependencies missing and no wheelhouse at $WHEELS (bash scripts/gpu-wheelhouse.sh)"
    fi
fi
if ! "$PYTHON" -c "$IMPORTS"; then
    log "FAILED: depsi or its dependencies cannot be imported with $PYTHON"
    part dependencies failed 0 "cannot import: $IMPORTS"
    "$PYTHON" "$REPO/benchmarks/_gpu_check_report.py" "$WORK" "$OUTDIR" 2>/dev/null || true
    finish 2
fi
part dependencies ok $((SECONDS - START)) "$DEPS_NOTE"

# ---- environment ----------------------------------------------------------------------------
GPU_REASON=$("$PYTHON" - <<'EOF'
from depsi.kernels.backend import get_namespace
try:
    cupy = get_namespace("cupy")
except RuntimeError as err:
    print(err)
else:
    try:
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
        name = name.decode() if isinstance(name, bytes) else name
    except Exception as err:  # the name is only for the report
        name = f"a GPU whose name cannot be read ({type(err).__name__})"
    print(f"ok: CuPy {cupy.__version__} on {name}")
EOF
)
[[ $GPU_REASON == ok:* ]] && GPU=1 || GPU=0
COMMIT=${DEPSI_GPU_CHECK_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
POINTS=${DEPSI_GPU_CHECK_POINTS:-$( ((GPU)) && echo "1000000 3000000" || echo 3000)}
SCALE=${DEPSI_GPU_CHECK_SCALE:-$( ((GPU)) && echo 1 || echo 0.02)}
SMI=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
      || echo "no nvidia-smi")
"$PYTHON" - "$WORK/env.json" "$COMMIT" "$GPU_REASON" "$SMI" "$POINTS" "$SCALE" "$BUDGET" <<'EOF'
import json, os, platform, sys
import numpy
path, commit, gpu, smi, points, scale, budget = sys.argv[1:]
json.dump({"commit": commit, "gpu": gpu, "nvidia_smi": smi, "python": platform.python_version(),
           "numpy": numpy.__version__, "cpus": os.cpu_count(), "host": platform.node(),
           "points": [int(float(p)) for p in points.split()], "kernel_scale": float(scale),
           "budget_s": int(budget)},
          open(path, "w"), indent=1)
EOF
log "commit $COMMIT; $(${PYTHON} -V 2>&1); GPU: $GPU_REASON; nvidia-smi: $SMI"
if ((GPU)); then
    log "GPU run: chain at $POINTS points, kernels at scale $SCALE, budget ${BUDGET}s"
else
    log "DRY RUN (no usable GPU): CuPy parts are skipped; chain at $POINTS points, kernels at" \
        "scale $SCALE"
fi
FAILED=0

# ---- 1. the CuPy tests ----------------------------------------------------------------------
# every test module that touches CuPy or a CUDA device, but not this script's own test
if [[ -n ${DEPSI_GPU_CHECK_TESTS:-} ]]; then
    read -r -a TESTS <<<"$DEPSI_GPU_CHECK_TESTS"
else
    mapfile -t TESTS < <(grep -l -E "cupy|cuda" tests/test_*.py | grep -v test_gpu_check.py)
fi
PYTEST=("$PYTHON" -m pytest -q -p no:cacheprovider -o addopts="" -ra --strict-markers)
PYTEST_RE="[0-9]+ (passed|failed|skipped|errors?|tests? collected)|no tests ran"
if ((GPU)); then
    SUMMARY_RE=$PYTEST_RE run_part "CuPy tests" 90 20 "$OUTDIR/tests.log" \
        "${PYTEST[@]}" --timeout=80 "${TESTS[@]}" || FAILED=1
else
    log "CuPy tests SKIPPED: $GPU_REASON; collecting them only: ${TESTS[*]}"
    SUMMARY_RE=$PYTEST_RE run_part "CuPy tests (collected only)" 30 5 "$OUTDIR/tests.log" \
        "${PYTEST[@]}" --timeout=80 --collect-only "${TESTS[@]}" || FAILED=1
    part "CuPy tests" skipped 0 "$GPU_REASON"
fi

# ---- 2. every kernel, NumPy against CuPy ----------------------------------------------------
((GPU)) || log "kernels: CuPy columns SKIPPED ($GPU_REASON); NumPy timed at scale $SCALE"
run_part "kernels" 120 10 "$WORK/kernels.log" "$PYTHON" benchmarks/bench_gpu_kernels.py \
    --scale "$SCALE" --json "$OUTDIR/kernels.json" || FAILED=1

# ---- 3. the chain on the CPU and on the GPU -------------------------------------------------
# each size of DEPSI_GPU_CHECK_POINTS in order ("1e6 3e6"); a later size runs only where the
# time left covers the last size's time scaled by the points (the chain grows about linearly),
# else it is reported skipped. The first size's parts keep the plain names ("chain: cpu"),
# later ones name their size ("chain 3000000: cpu").
CHAIN=("$PYTHON" benchmarks/bench_gpu_chain.py)
if ((GPU)); then
    SECOND=cuda:0
else
    SECOND=cpu:1  # no GPU: a second CPU device stands in, so that the comparison itself runs
fi
read -r -a SIZES <<<"$POINTS"
LAST_N=0 LAST_S=0
for SIZE in "${SIZES[@]}"; do
    N=$("$PYTHON" -c "import sys; print(int(float(sys.argv[1])))" "$SIZE")
    if ((LAST_N == 0)); then P="chain" TAG="" ; else P="chain $N" TAG="-$N"; fi
    if ((LAST_N > 0)); then
        NEEDED=$((LAST_S * N / LAST_N))
        if (( $(left) < NEEDED )); then
            log "$P SKIPPED: about ${NEEDED}s needed (${LAST_S}s at $LAST_N points), $(left)s left"
            part "$P: scene" skipped 0 "about ${NEEDED}s needed, $(left)s left of the budget"
            echo "$N skipped about ${NEEDED}s needed, $(left)s left of the ${BUDGET}s budget" \
                >>"$WORK/chain-sizes.txt"
            continue
        fi
    fi
    T_SIZE=$SECONDS
    SCENE="$WORK/scene-$N"
    echo "$N ran" >>"$WORK/chain-sizes.txt"
    if run_part "$P: scene" 90 5 "$WORK/chain.log" \
            "${CHAIN[@]}" scene "$N" "$SCENE" --json "$WORK/chain$TAG-scene.json"; then
        if ! ((GPU)); then
            log "$P on cuda:0 SKIPPED: $GPU_REASON; comparing against cpu:1 instead (a stand-in)"
            part "$P: cuda:0" skipped 0 "$GPU_REASON"
        fi
        run_part "$P: $SECOND" 200 10 "$WORK/chain.log" \
            "${CHAIN[@]}" run "$SCENE" "$SECOND" "$WORK/chain$TAG-second.npz" || FAILED=1
        run_part "$P: cpu" 400 10 "$WORK/chain.log" \
            "${CHAIN[@]}" run "$SCENE" cpu "$WORK/chain$TAG-cpu.npz" || FAILED=1
        if [[ -s $WORK/chain$TAG-cpu.npz && -s $WORK/chain$TAG-second.npz ]]; then
            RESERVE=0 run_part "$P: compare" 30 1 "$WORK/chain.log" "${CHAIN[@]}" compare \
                "$WORK/chain$TAG-cpu.npz" "$WORK/chain$TAG-second.npz" \
                --json "$WORK/chain$TAG-compare.json" || FAILED=1
        else
            log "$P comparison SKIPPED: a run has no result"
            part "$P: compare" skipped 0 "a run has no result"
        fi
    else
        FAILED=1
    fi
    LAST_N=$N LAST_S=$((SECONDS - T_SIZE))
done

# ---- report ---------------------------------------------------------------------------------
"$PYTHON" benchmarks/_gpu_check_report.py "$WORK" "$OUTDIR" || FAILED=1
log "done in $((SECONDS - START))s; files in $OUTDIR: $(cd "$OUTDIR" && echo *)"
finish "$FAILED"
