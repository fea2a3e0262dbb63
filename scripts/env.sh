# Sourced by the other scripts: picks the Python (and so the torch) torch_spmd is built and run
# with, installing what that needs the first time. Sets PYTHON.
#
#   Debian 13 (trixie) and later: Debian's python3-torch (torch 2.6) with /usr/bin/python3, in
#     a virtual environment over Debian's packages ($SPMD_VENV, default .venv, made with
#     --system-site-packages) that adds only the test-only packages Debian lacks.
#   Debian 12 (bookworm): Debian's torch is 1.13, which torch_spmd does not support; the main
#     path there is PyPI's torch 2.13.0 (CPU) in a virtual environment ($SPMD_VENV, default
#     .venv) over the Python 3.11 on PATH.
# Test-only packages: Hugging Face transformers (test_hf_models.py), which needs no torch of
# its own. SPMD_PYTHON=/path/to/python overrides both (that interpreter must already have
# torch >= 2.6, and transformers for the Hugging Face tests).

# The pinned test-only packages (pip never brings a torch for them).
SPMD_TEST_PACKAGES=(transformers==5.24.0)

_spmd_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_debian_major() { cut -d. -f1 /etc/debian_version 2>/dev/null | grep -E '^[0-9]+$' || echo 0; }

_spmd_python_debian12() {
  local venv="${SPMD_VENV:-$_spmd_root/.venv}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, pytest, pybind11, matplotlib, transformers' 2>/dev/null; then
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
    "$venv/bin/pip" install -q --disable-pip-version-check numpy scipy pytest hypothesis rich scikit-learn tqdm \
      matplotlib pybind11 setuptools wheel "${SPMD_TEST_PACKAGES[@]}" 2>&1 | grep -v "^WARNING: Location" >&2 || true
    "$venv/bin/python" -c 'import torch, pytest, pybind11, transformers' || return 1
  fi
  PYTHON="$venv/bin/python"
}

_spmd_python_debian13() {
  local venv="${SPMD_VENV:-$_spmd_root/.venv}"
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch, pytest, transformers' 2>/dev/null; then
    echo "Debian 13: Debian's torch with the test-only packages Debian lacks in $venv" >&2
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$venv" || return 1
    "$venv/bin/pip" install -q --disable-pip-version-check "${SPMD_TEST_PACKAGES[@]}" 2>&1 \
      | grep -v "^WARNING: Location" >&2 || true
    "$venv/bin/python" -c 'import transformers' || return 1
  fi
  # Debian's torch, never one a pip install brought into the venv.
  if ! "$venv/bin/python" -c 'import sys, torch; sys.exit(not torch.__file__.startswith("/usr/"))'; then
    echo "Debian 13: $venv has a torch of its own; remove it (rm -rf $venv) to use Debian's" >&2
    return 1
  fi
  PYTHON="$venv/bin/python"
}

if [ -n "${SPMD_PYTHON:-}" ]; then
  PYTHON="$SPMD_PYTHON"
elif [ "$(_debian_major)" -ge 13 ] || [ "$(_debian_major)" -eq 0 ]; then
  _spmd_python_debian13 || exit 1
else
  _spmd_python_debian12 || exit 1
fi
export PYTHON
