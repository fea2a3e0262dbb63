# Sourced by the other scripts: picks the Python (and so the torch) torch_spmd is built and run
# with, installing what that needs the first time. Sets PYTHON.
#
#   Debian 13 (trixie) and later: Debian's python3-torch (torch 2.6) with /usr/bin/python3.
#   Debian 12 (bookworm): Debian's torch is 1.13, which torch_spmd does not support; the main
#     path there is PyPI's torch 2.13.0 (CPU) in a virtual environment ($SPMD_VENV, default
#     .venv) over the Python 3.11 on PATH.
# SPMD_PYTHON=/path/to/python overrides both (that interpreter must already have torch >= 2.6).

_spmd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_debian_major() { cut -d. -f1 /etc/debian_version 2>/dev/null | grep -E '^[0-9]+$' || echo 0; }

_spmd_python_debian12() {
  local venv="${SPMD_VENV:-$_spmd_root/.venv}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, pytest, pybind11, matplotlib' 2>/dev/null; then
    local base=""
    for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11 python3; do
      if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
        base="$cand"; break
      fi
    done
    if [ -z "$base" ]; then
      echo "Debian 12: need a Python 3.11 for PyPI's torch 2.13.0 wheel (none found)" >&2
      return 1
    fi
    echo "Debian 12 detected: Debian's torch is 1.13 (unsupported); using PyPI's torch 2.13.0 in $venv" >&2
    [ -x "$venv/bin/python" ] || "$base" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check torch==2.13.0 2>&1 | grep -v "^WARNING: Location" >&2 || true
    "$venv/bin/pip" install -q --disable-pip-version-check numpy pytest hypothesis rich scikit-learn tqdm \
      matplotlib pybind11 setuptools wheel 2>&1 | grep -v "^WARNING: Location" >&2 || true
    "$venv/bin/python" -c 'import torch, pytest, pybind11' || return 1
  fi
  PYTHON="$venv/bin/python"
}

if [ -n "${SPMD_PYTHON:-}" ]; then
  PYTHON="$SPMD_PYTHON"
elif [ "$(_debian_major)" -ge 13 ] || [ "$(_debian_major)" -eq 0 ]; then
  PYTHON=/usr/bin/python3
else
  _spmd_python_debian12 || exit 1
fi
export PYTHON
