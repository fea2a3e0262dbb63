"""Fresh fuzz cases on every CI run (tools/fuzz.py; issue 51): random training sessions and the
property suite's random programs, drawn from a seed taken from the clock (printed, so that a
failure is reproduced with ``tools/fuzz.py sessions|programs --seed S``), and the fuzzer's own
machinery: it finds a planted bug and shrinks it to a small session."""
import os
import random
import sys
import time

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(_HERE)), "tools"))

import fuzz  # noqa: E402
import fuzz_sessions  # noqa: E402

SEED = int(os.environ.get("SPMD_FUZZ_SEED", time.time_ns() % 1_000_000))


@pytest.mark.slow
def test_fresh_training_sessions_equal_cpu(tmp_path):
    print(f"tools/fuzz.py sessions --seed {SEED} --cases 200")
    failures = fuzz_sessions.sessions(SEED, 200, str(tmp_path), max_actions=12)
    assert not failures, (f"seed {SEED}: " + "; ".join(
        f"case {f['case']}: {f['reason']}" for f in failures))


@pytest.mark.slow
def test_fresh_random_programs_equal_cpu(tmp_path):
    print(f"tools/fuzz.py programs --seed {SEED} --cases 300")
    assert fuzz.run_programs(SEED, 300, str(tmp_path)) == 0, (
        f"seed {SEED}: see {tmp_path}/programs_seed{SEED}.txt")


def test_a_planted_bug_is_found_and_shrunk(tmp_path, monkeypatch):
    # The device forgets every other micro-batch: the fuzzer must see it, and shrink the
    # session to one step of two micro-batches on replicated layouts.
    step = fuzz_sessions._Side.step

    def lossy(self, micro, zero, clip=None):
        return step(self, 1 if self.device else micro, zero, clip)

    monkeypatch.setattr(fuzz_sessions._Side, "step", lossy)
    rng = random.Random(3)
    s = next(s for s in (fuzz_sessions.draw_session(rng) for _ in range(100))
             if any(a[0] == "step" and a[1] > 1 for a in s["actions"]))
    reason = fuzz_sessions.failure_of(s)
    assert reason and reason.startswith("AssertionError"), reason
    small = fuzz_sessions.shrink(s, reason)
    steps = [a for a in small["actions"] if a[0] == "step"]
    assert len(small["actions"]) <= 2 and steps and steps[-1][1] > 1, small["actions"]
    assert all(d is None for spec in small["specs"] for d in spec), small["specs"]
    path = tmp_path / "test_case.py"
    path.write_text(fuzz_sessions.regression_test(small, reason, "a planted bug"))
    assert "SESSION = " in path.read_text() and "replay(SESSION)" in path.read_text()


def test_a_session_replays_equal_cpu():
    rng = random.Random(0)
    for _ in range(5):
        fuzz_sessions.replay(fuzz_sessions.draw_session(rng))
