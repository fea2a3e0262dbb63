#!/usr/bin/env bash
# Configures (once per interpreter) and builds torch_spmd: the torch-free core library, its
# GoogleTest suite, and the Python extension torch_spmd/_C*.so (written into the source tree),
# against the torch of $PYTHON (scripts/env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
BUILD_DIR=${BUILD_DIR:-build}
prefix="$("$PYTHON" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
pybind_dir="$("$PYTHON" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null || true)"
[ -n "$pybind_dir" ] && prefix="$prefix;$pybind_dir"
stamp="$PYTHON|$prefix"
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$(cat "$BUILD_DIR/.spmd_python" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PYTHON" \
    -DCMAKE_PREFIX_PATH="$prefix"
  echo "$stamp" > "$BUILD_DIR/.spmd_python"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
