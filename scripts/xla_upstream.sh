#!/usr/bin/env bash
# Runs PyTorch/XLA's own SPMD tests (test/spmd/test_*.py of a pytorch/xla checkout) unmodified on
# torch_spmd, through `python -m torch_spmd.xla -m pytest`, one pytest per file, and prints a
# table: file, passed, failed, skipped, errors (plus deselected = excluded).
#
#   scripts/xla_upstream.sh PATH_TO_PYTORCH_XLA_CHECKOUT [test_file.py ...]
#
# Tests listed in scripts/xla_upstream_excluded.txt (file::Class::test  # reason) can only apply
# to a real XLA backend (HLO text, XLA internals, TPU topology); they are deselected and counted
# separately. Environment:
#   SPMD_NUM_DEVICES   emulated devices (default 8: upstream's multi-device asserts need > 1,
#                      most are written for 4 or 8; its CPU CI runs them with 1 device)
#   XLA_UPSTREAM_DEVICES=ci  each file with the device count upstream's CPU CI gives it
#                      (test/run_tests.sh: run_test_multi_devices* 4, run_test 1), to compare
#                      with upstream on the same tests
#   PJRT_DEVICE        default CPU, as upstream's CPU CI sets it
#   XLA_TEST_TIMEOUT   seconds per file (default 300)
#   XLA_TEST_LOGS      where the per-file logs and junit files go (default: a temp dir)
#   XLA_UPSTREAM_REAL  a Python with a real PyTorch/XLA (e.g. a throw-away venv with
#                      torch==2.9.0 torch_xla==2.9.0): the same files on the real thing, on its
#                      CPU backend (PJRT_DEVICE=CPU, CPU_NUM_DEVICES = the device count),
#                      nothing deselected; the `excluded` column then counts this list's
#                      tests, and the note names those that pass there
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 1 ] || [ ! -d "$1/test/spmd" ]; then
  echo "usage: $0 PATH_TO_PYTORCH_XLA_CHECKOUT [test_file.py ...]" >&2
  exit 2
fi
XLA="$(cd "$1" && pwd)"; shift
source "$ROOT/scripts/env.sh"
REAL="${XLA_UPSTREAM_REAL:-}"
[ -n "$REAL" ] && PYTHON="$REAL"
# Test-only packages upstream's tests import (test_dtensor_redistribute.py: absl's
# parameterized), installed into the environment env.sh picked, only for this runner.
"$PYTHON" -c "import absl.testing.parameterized" 2>/dev/null ||
  "$PYTHON" -m pip install -q --disable-pip-version-check absl-py
# (and, in a real PyTorch/XLA's venv, pytest itself and rich, which the real
# visualize_sharding draws with: test_spmd_debugging.py imports it)
"$PYTHON" -c "import pytest" 2>/dev/null ||
  "$PYTHON" -m pip install -q --disable-pip-version-check pytest
[ -n "$REAL" ] && { "$PYTHON" -c "import rich" 2>/dev/null ||
  "$PYTHON" -m pip install -q --disable-pip-version-check rich; }
EXCLUDED="$ROOT/scripts/xla_upstream_excluded.txt"
TIMEOUT="${XLA_TEST_TIMEOUT:-300}"
LOGS="${XLA_TEST_LOGS:-$(mktemp -d /tmp/xla_upstream.XXXXXX)}"
mkdir -p "$LOGS"
export SPMD_NUM_DEVICES="${SPMD_NUM_DEVICES:-8}"
# Upstream CI's device count for a test file: 4 for run_test_multi_devices*, 1 for run_test.
ci_devices() {
  local line
  line=$(grep -E 'run_test[a-z_]* "\$_TEST_DIR/spmd/'"$1"'"' "$XLA/test/run_tests.sh" 2>/dev/null | head -1)
  case "$line" in
    *run_test_multi_devices*) echo 4 ;;
    *run_test*) echo 1 ;;
    *) echo "$SPMD_NUM_DEVICES" ;;
  esac
}
# As upstream's CPU CI runs these files (test/run_tests.sh: PJRT_DEVICE=CPU): the tests read it
# back, and branch on xr.device_type() == 'CPU', which it makes the emulated devices report.
export PJRT_DEVICE="${PJRT_DEVICE:-CPU}"
# The tests import their helpers as top-level modules (test_xla_sharding_base, args_parse, and
# utils.* from test/).
export PYTHONPATH="$ROOT:$XLA/test/spmd:$XLA/test${PYTHONPATH:+:$PYTHONPATH}"

cd "$XLA/test/spmd"
if [ $# -gt 0 ]; then files=("$@"); else files=(test_*.py); fi

# Upstream files that are scripts, not pytest modules: they parse their own flags at import, so
# pytest cannot collect them (on the real PyTorch/XLA either). They run as their authors run
# them, with small sizes on `devices` devices: a clean exit is one test passed, anything else
# one failed (the log says why).
script_args() {
  case "$1" in
    test_sharding_strategies.py)
      echo "--batch_size 4 --embedding_dimension 64 --num_layers 2 --ici_fsdp_parallelism $2" ;;
  esac
}

printf '%-44s %6s %6s %7s %6s %8s %s\n' file passed failed skipped errors excluded note
tot=(0 0 0 0 0)
for f in "${files[@]}"; do
  f="$(basename "$f")"
  [ "$f" = test_xla_sharding_base.py ] && continue
  deselect=""
  nex=0
  if [ -f "$EXCLUDED" ]; then
    while read -r id; do
      deselect+="$id"$'\n'; nex=$((nex + 1))
    done < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' "$EXCLUDED" | grep "^$f::" || true)
  fi
  devices="$SPMD_NUM_DEVICES"
  [ "${XLA_UPSTREAM_DEVICES:-}" = ci ] && devices=$(ci_devices "$f")
  xml="$LOGS/${f%.py}.xml"; log="$LOGS/${f%.py}.log"
  rm -f "$xml"
  args=$(script_args "$f" "$devices")
  if [ -n "$args" ]; then
    if [ -n "$REAL" ]; then
      PYTHONPATH="$XLA/test/spmd:$XLA/test" CPU_NUM_DEVICES="$devices" \
        timeout -k 10 "$TIMEOUT" "$PYTHON" "$f" $args >"$log" 2>&1
    else
      SPMD_NUM_DEVICES="$devices" timeout -k 10 "$TIMEOUT" "$PYTHON" -m torch_spmd.xla "$f" $args \
        >"$log" 2>&1
    fi
    rc=$?
    p=$((rc == 0)); fl=$((rc != 0))
    printf '%-44s %6s %6s %7s %6s %8s %s\n' "$f" "$p" "$fl" 0 0 0 "run as a script ($args), exit $rc"
    tot=($((tot[0] + p)) $((tot[1] + fl)) "${tot[2]}" "${tot[3]}" "${tot[4]}")
    continue
  fi
  # --rootdir=.: node ids are then file::Class::test as the exclusion list writes them, also in
  # a checkout with a setup.py at its root (pytest would otherwise root them there, as
  # test/spmd/file::..., and no exclusion would match). The exclusions are deselected by exact
  # id (scripts/xla_upstream_deselect.py; pytest's --deselect matches prefixes).
  if [ -n "$REAL" ]; then  # the real thing: torch_spmd off the path, nothing deselected
    PYTHONPATH="$XLA/test/spmd:$XLA/test" CPU_NUM_DEVICES="$devices" \
      timeout -k 10 "$TIMEOUT" "$PYTHON" -m pytest -p no:cacheprovider -q -rfE --rootdir=. \
      --junitxml="$xml" "$f" >"$log" 2>&1
  else
    XLA_UPSTREAM_DESELECT="$deselect" PYTHONPATH="$ROOT/scripts:$PYTHONPATH" SPMD_NUM_DEVICES="$devices" \
      timeout -k 10 "$TIMEOUT" "$PYTHON" -m torch_spmd.xla -m pytest -p no:cacheprovider \
      -p xla_upstream_deselect -q -rfE --rootdir=. --junitxml="$xml" "$f" >"$log" 2>&1
  fi
  rc=$?
  note=""
  # What pytest really deselected: an exclusion that matches no test is a stale entry.
  got=$(grep -Eo '[0-9]+ deselected' "$log" | tail -1 | cut -d' ' -f1)
  [ -z "$REAL" ] && [ "${got:-0}" -ne "$nex" ] && note="deselected ${got:-0} of $nex excluded (stale entries?)"
  if [ -n "$REAL" ] && [ "$nex" -gt 0 ] && [ -f "$xml" ]; then
    passing=$("$PYTHON" - "$xml" "$deselect" <<'EOF'
import sys, xml.etree.ElementTree as ET
ids = {i.split("::")[-1] for i in sys.argv[2].split()}
names = [c.get("name") for c in ET.parse(sys.argv[1]).iter("testcase")
         if c.get("name") in ids and not any(x.tag in ("failure", "error", "skipped") for x in c)]
print(" ".join(sorted(names)))
EOF
)
    [ -n "$passing" ] && note="excluded here, pass there: $passing"
  fi
  [ $rc -eq 124 ] || [ $rc -eq 137 ] && note="timeout (${TIMEOUT}s)"
  [ $rc -eq 5 ] && note="no tests collected"
  if [ -f "$xml" ]; then
    read -r p fl s e < <("$PYTHON" - "$xml" <<'EOF'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) for s in suites)
e = sum(int(s.get("errors", 0)) for s in suites)
k = sum(int(s.get("skipped", 0)) for s in suites)
print(t - f - e - k, f, k, e)
EOF
)
  else
    p=0; fl=0; s=0; e=1; note="${note:-no junit output (see log)}"
  fi
  if [ "${XLA_UPSTREAM_DEVICES:-}" = ci ]; then
    grep -q "spmd/$f\"" "$XLA/test/run_tests.sh" 2>/dev/null || devices="$devices, not in CI"
    note="$devices device(s)${note:+; $note}"
  fi
  printf '%-44s %6s %6s %7s %6s %8s %s\n' "$f" "$p" "$fl" "$s" "$e" "$nex" "$note"
  tot=($((tot[0] + p)) $((tot[1] + fl)) $((tot[2] + s)) $((tot[3] + e)) $((tot[4] + nex)))
done
printf '%-44s %6s %6s %7s %6s %8s\n' TOTAL "${tot[@]}"
echo "upstream: $(git -C "$XLA" rev-parse HEAD 2>/dev/null || echo "$XLA")  devices: ${XLA_UPSTREAM_DEVICES:-$SPMD_NUM_DEVICES}  logs: $LOGS"
