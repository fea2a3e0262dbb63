#!/usr/bin/env bash
# Installs torch_spmd the way a pip user does, into a fresh venv with PyPI's torch 2.13.0 (CPU),
# then runs the demo and a smoke subset of the tests against the installed package (from a copy
# of the tests outside the source tree, so that the source tree's build is not what is tested).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=$(mktemp -d /tmp/spmd_pip_smoke.XXXXXX)
trap 'rm -rf "$work"' EXIT
base=""
for cand in python3.11 /root/.pyenv/versions/3.11*/bin/python3.11; do
  if command -v "$cand" >/dev/null 2>&1; then base="$cand"; break; fi
done
[ -n "$base" ] || { echo "pip smoke test: no Python 3.11 for the torch 2.13.0 wheel"; exit 1; }
"$base" -m venv "$work/venv"
pip=("$work/venv/bin/pip" install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0 2>&1 | grep -v "^WARNING: Location" || true
"${pip[@]}" numpy pytest tqdm setuptools wheel 2>&1 | grep -v "^WARNING: Location" || true
echo "== pip install --no-build-isolation . (torch $("$work/venv/bin/python" -c 'import torch; print(torch.__version__)'))"
(cd "$root" && "$work/venv/bin/pip" install -q --no-build-isolation . 2>&1 | grep -v "^WARNING: Location") || true
cd "$work"
"$work/venv/bin/python" -c 'import torch, torch_spmd; print(torch.randn(2, device="spmd").device)'
echo "== demo"
"$work/venv/bin/python" "$root/examples/demo.py" --steps 20
echo "== smoke tests against the installed package"
mkdir -p "$work/t/test" && cp -r "$root/test/python" "$work/t/test/python"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$work/t/test/python/test_api.py" \
  "$work/t/test/python/test_mark_step.py" "$work/t/test/python/test_errors.py"
