#!/usr/bin/env bash
# Run the whole depsi test suite on a fresh machine: install the package with its test extras,
# lint with ruff (the version pinned in the test extra), then run pytest: the tests and the
# docstring examples of depsi/ (testpaths and --doctest-modules in pyproject.toml). Extra
# arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`, the quick subset).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[test,docs]"

python -m ruff check depsi tests benchmarks scripts

# the type checker over the package (mypy, configured in pyproject.toml: pydantic plugin)
python -m mypy depsi

# A one-node SLURM cluster for tests/test_slurm.py. Where it cannot start (not root, no apt-get)
# those tests skip and print why; a SLURM that was already running is left running.
slurm_state="${DEPSI_SLURM_DIR:-/tmp/depsi-slurm}"
slurm_was_up=0
if [[ -s "$slurm_state/slurmctld.pid" ]] && kill -0 "$(cat "$slurm_state/slurmctld.pid")" 2>/dev/null; then
    slurm_was_up=1
fi
bash scripts/slurm-up.sh || echo "test.sh: SLURM not started; tests/test_slurm.py will say why" >&2
trap '[[ $slurm_was_up == 1 ]] || bash scripts/slurm-down.sh || true' EXIT

# Headless Chromium and its WebDriver for tests/test_view.py; where they cannot be installed
# (not root, no apt-get) those tests skip and print why.
bash scripts/browser-up.sh || echo "test.sh: Chromium not installed; tests/test_view.py will say why" >&2

# GPU tests skip by themselves where no CUDA device works; real-data tests read tests/data.
# On DEPSI_TEST_WORKERS processes (pytest-xdist, default 2: the suite waits on subprocesses,
# clusters and files much of its time); the modules of tests/conftest.py's SERIAL_MODULES run
# one test at a time in one of them. DEPSI_TEST_WORKERS=0 runs everything in this process.
# The elapsed time of the pytest run is printed last, with the load average before and after
# (the quick subset's time in the README is measured so).
workers=${DEPSI_TEST_WORKERS:-2}
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
started=$SECONDS
status=0
python -m pytest -p no:cacheprovider --timeout=600 -n "$workers" --dist loadgroup "$@" || status=$?
echo "test.sh: pytest took $((SECONDS - started)) s on $workers workers (load average" \
     "$load_before before, $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?") after)" >&2
exit "$status"
