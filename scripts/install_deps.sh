#!/usr/bin/env bash
# Installs the Debian packages torch_spmd needs (run as root on Debian 12). Skips apt entirely
# when everything is already installed, so it is cheap to call before every build.
set -euo pipefail
PACKAGES=(
  python3-torch libtorch-dev python3-dev pybind11-dev libabsl-dev libgtest-dev libgmock-dev
  libopenblas0-pthread cmake ninja-build g++ python3-numpy python3-pytest python3-hypothesis
  python3-rich python3-sklearn python3-tqdm
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "Installing: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
