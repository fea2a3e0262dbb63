#!/usr/bin/env python
"""Fuzzes torch_spmd against CPU eager with fresh random cases (issue 51; docs/testing.md).

    PYTHONPATH=$PWD python tools/fuzz.py sessions --seed 7 --cases 2000
    PYTHONPATH=$PWD python tools/fuzz.py programs --seed 7 --cases 100000
    PYTHONPATH=$PWD python tools/fuzz.py all --cases 500          # a fresh seed, both kinds

``sessions``: random training sessions (tools/fuzz_sessions.py: SGD/Adam/AdamW, gradient
accumulation, zero_grad inside or outside the step, checkpoint save and load in both formats,
parameters resharded between steps, random meshes and uneven layouts with poisoned padding),
each replayed on the device and on CPU in lockstep. A failure is shrunk and written to
``--out`` as a pytest file; moved into test/python/fuzz_regressions/ it is a regression test.

``programs``: the property suite's random programs (test/python/test_partition_properties.py:
forward, gradients, in-place updates, views, reshard chains, random constraints on
intermediates) drawn fresh from ``--seed`` instead of its fixed examples, in ``--cases`` cases
split over its three generators as the suite splits them. Hypothesis shrinks a failure to a
minimal program; the report (the program, its mesh and specs, and the ``@reproduce_failure``
line that replays it) is written to ``--out``.

Exit status 1 when any case failed. The same seed draws the same cases.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TESTS = os.path.join(ROOT, "test", "python")
# The property suite's cases per generator at SPMD_PROPERTY_SCALE=1 (reshard chains, forward
# programs, programs with gradients).
PROPERTY_CASES = 700 + 1000 + 450


def run_sessions(seed: int, cases: int, out: str, max_actions: int = 10) -> int:
    sys.path[:0] = [HERE, TESTS]
    import fuzz_sessions
    t = time.time()
    failures = fuzz_sessions.sessions(seed, cases, out, max_actions=max_actions)
    print(f"sessions: seed {seed}, {cases} sessions, {len(failures)} failed, "
          f"{time.time() - t:.0f} s")
    return len(failures)


def run_programs(seed: int, cases: int, out: str) -> int:
    env = dict(os.environ, SPMD_PROPERTY_RANDOM="1",
               SPMD_PROPERTY_SCALE=str(max(cases, 1) / PROPERTY_CASES))
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow",
           os.path.join(TESTS, "test_partition_properties.py"), f"--hypothesis-seed={seed}",
           "-k", "random_reshard_chains or random_programs"]
    t = time.time()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    print(f"programs: seed {seed}, {cases} programs: {tail} ({time.time() - t:.0f} s)")
    if r.returncode == 0:
        return 0
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"programs_seed{seed}.txt")
    with open(path, "w") as f:
        f.write(f"# {' '.join(cmd)}\n# with SPMD_PROPERTY_RANDOM=1 "
                f"SPMD_PROPERTY_SCALE={env['SPMD_PROPERTY_SCALE']}\n\n{r.stdout}\n{r.stderr}")
    print(f"  failures written to {path}")
    return 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=("sessions", "programs", "all"))
    p.add_argument("--seed", type=int, default=None, help="default: drawn from the clock")
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--out", default="fuzz_failures", help="where failures are written")
    p.add_argument("--max-actions", type=int, default=10, help="sessions: actions at most")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    failed = 0
    if args.kind in ("sessions", "all"):
        failed += run_sessions(seed, args.cases, args.out, args.max_actions)
    if args.kind in ("programs", "all"):
        failed += run_programs(seed, args.cases, args.out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
