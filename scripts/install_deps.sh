#!/usr/bin/env bash
# Installs what torch_spmd needs to build and test (run as root on Debian). Skips apt entirely
# when everything is already installed, so it is cheap to call before every build.
# On Debian 13 torch itself comes from Debian (python3-torch, libtorch-dev: torch 2.6); on
# Debian 12, whose torch is 1.13, scripts/env.sh installs PyPI's torch 2.13.0 into a venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(cmake ninja-build g++ libgtest-dev libgmock-dev chromium)
major=$(cut -d. -f1 /etc/debian_version 2>/dev/null | grep -E '^[0-9]+$' || echo 0)
if [ "$major" -ge 13 ] || [ "$major" -eq 0 ]; then
  PACKAGES+=(
    python3-torch libtorch-dev python3-dev pybind11-dev libopenblas0-pthread python3-numpy python3-scipy
    python3-pytest python3-hypothesis python3-rich python3-sklearn python3-tqdm python3-matplotlib python3-venv
    python3-setuptools python3-wheel
  )
fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
source scripts/env.sh
echo "torch_spmd uses $PYTHON (torch $("$PYTHON" -c 'import torch; print(torch.__version__)'))"
