#!/usr/bin/env bash
# Builds torch_spmd and runs every test: the C++ GoogleTest suite (ctest) and the Python suite
# (pytest). Extra arguments go to pytest, e.g. scripts/test.sh -k sharding
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
source scripts/env.sh
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
(cd "$BUILD_DIR" && ctest --output-on-failure)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# Everything, the suites marked slow included (plain `pytest test/python` leaves them out);
# `scripts/test.sh -m "not slow"` is the quick loop, later -m options win.
"$PYTHON" -m pytest -q test/python -m "slow or not slow" "$@"
