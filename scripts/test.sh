#!/usr/bin/env bash
# Run the whole depsi test suite on a fresh machine: install the package with its test extras,
# then run pytest. Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e ".[test]"

# GPU tests skip by themselves where no CUDA device works.
python -m pytest -p no:cacheprovider --timeout=900 "$@"
