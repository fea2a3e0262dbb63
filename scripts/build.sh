#!/usr/bin/env bash
# Configures (once) and builds torch_spmd: the torch-free core library, its GoogleTest suite,
# and the Python extension torch_spmd/_C*.so (written into the source tree).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE=/usr/bin/python3
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
