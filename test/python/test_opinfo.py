"""PyTorch's own OpInfo database (``op_db``) on the spmd device, compared with CPU eager.

Runs ``tools/opinfo_sweep.py`` on every OpInfo with CPU samples of float32 (677 on torch 2.13),
bfloat16, float16, int64 and bool, up to 3 samples each, in two modes: ``unsharded`` (every
tensor input on the device) and ``sharded`` (every tensor input with an even ``size(0) >= 2``
sharded on dim 0 over an 8-device 1-D mesh, padding of uneven shards poisoned with NaN). Each
mode and dtype must agree with CPU on at least 98% of the ops it could try. The sweep runs in
worker subprocesses (two at a time, about a minute and a half on 2 cores), so a crash or hang
in one op is recorded as that op's failure instead of taking the test down. See docs/opinfo.md
for the numbers and the disagreeing ops.
"""
import os
import sys

import pytest

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_ROOT, "tools"))

import opinfo_sweep  # noqa: E402

# Minutes of work (processes, examples, sweeps): scripts/test.sh runs it, plain pytest does not.
pytestmark = pytest.mark.slow

MIN_PERCENT = 98.0
# A harness that silently tries (almost) nothing must not pass: torch 2.13 has 672 OpInfos
# whose CPU float32 samples run (torch 2.6 about 660), 546 bfloat16, 541 float16, 463 int64 and
# 344 bool ones.
MIN_TRIED = {"float32": 600, "bfloat16": 450, "float16": 450, "int64": 380, "bool": 280}
MODES = ("unsharded", "sharded")
DTYPES = tuple(MIN_TRIED)


@pytest.fixture(scope="module")
def sweep():
    return opinfo_sweep.sweep(modes=MODES, max_samples=3, timeout=60, dtypes=DTYPES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_opinfo_agrees_with_cpu(sweep, mode, dtype):
    s = sweep[opinfo_sweep.run_key(mode, dtype)]
    what = f"{mode}, {dtype}"
    assert not s["fatal"], f"{what}: the sweep's worker failed: {s['fatal']}"
    assert not s["not_run"], f"{what}: {len(s['not_run'])} ops never ran: {s['not_run'][:20]}"
    assert s["tried"] >= MIN_TRIED[dtype], f"{what}: only {s['tried']} ops tried"
    failures = "\n".join(f"  {f['op']}: [{f['status']}] {f['reason']}" for f in s["failures"])
    assert s["percent"] >= MIN_PERCENT, (
        f"{what}: {s['agreed']}/{s['tried']} OpInfo ops agree with CPU ({s['percent']:.2f}% < "
        f"{MIN_PERCENT}%); disagreeing:\n{failures}")
