#!/usr/bin/env bash
# Configures (once per interpreter) and builds torch_spmd: the torch-free core library, its
# GoogleTest suite, and the Python extension torch_spmd/_C*.so (written into the source tree),
# against the torch of $PYTHON (scripts/env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
BUILD_DIR=${BUILD_DIR:-build}
# CMake takes torch's headers and libraries from $PYTHON (cmake/TorchFromPython.cmake). A build
# directory is reused only for the interpreter and torch it was configured for, and only after
# a configure that succeeded (the stamp is written last); otherwise it starts afresh.
stamp="$PYTHON|$("$PYTHON" -c 'import torch; print(torch.__file__, torch.__version__)')"
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ "$(cat "$BUILD_DIR/.spmd_python" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$BUILD_DIR"
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython3_EXECUTABLE="$PYTHON"
  echo "$stamp" > "$BUILD_DIR/.spmd_python"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
