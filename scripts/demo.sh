#!/usr/bin/env bash
# From a bare Debian machine: installs the dependencies, builds torch_spmd and runs the demo
# (a small model trained on the spmd device, its losses printed next to CPU eager's).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_deps.sh
source scripts/env.sh
scripts/build.sh
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PYTHON" examples/demo.py "$@"
