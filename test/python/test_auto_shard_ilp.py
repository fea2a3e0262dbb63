"""The layout ILP (torch_spmd/plan/auto_shard_ilp.py): the program it builds from the C++
coefficients (plan/layout_costs.h), solved by HiGHS, and its place in auto_shard."""
import pytest

from torch_spmd.plan import auto_shard_ilp as ilp

pytestmark = pytest.mark.skipif(not ilp.solver_available(), reason="needs scipy >= 1.9")


def costs(tuples, fixed_seconds=0.0, fixed_bytes=(0.0,)):
    """A coefficients dict as _C._pending_layout_costs returns it, with one memory row."""
    return dict(tuples=tuples, fixed_seconds=fixed_seconds, fixed_bytes=list(fixed_bytes),
                row_positions=[0])


# Two decisions of two options each. Alone, option 1 is cheaper for both; together (the tuple
# of both) option 1 of each is expensive, and one of them on option 1 is cheapest.
PAIR = [
    ([0], [[0], [1]], [3.0, 1.0], [[10.0, 5.0]]),
    ([1], [[0], [1]], [3.0, 1.0], [[10.0, 5.0]]),
    ([0, 1], [[0, 0], [0, 1], [1, 0], [1, 1]], [0.0, 0.0, 0.5, 10.0], [[0.0] * 4]),
]


def test_the_optimum_of_a_pairwise_cost():
    r = ilp.solve(costs(PAIR, fixed_seconds=2.0), [2, 2], budget=100.0, time_limit=10)
    # (0, 1): 3 + 1 + 0 = 4; (1, 0): 1 + 3 + 0.5 = 4.5; (1, 1): 1 + 1 + 10 = 12; (0, 0): 6
    assert r.choice == [0, 1]
    assert r.status == "optimal"
    assert r.objective == pytest.approx(4.0 + 2.0)
    assert r.bound == pytest.approx(r.objective)
    assert r.gap == pytest.approx(0.0, abs=1e-6)


def test_memory_rows_bound_the_choice():
    # budget 16: (0, 1) and (1, 0) hold 10 + 5 + 2 fixed = 17, over; (1, 1) holds 5 + 5 + 2
    r = ilp.solve(costs(PAIR, fixed_bytes=(2.0,)), [2, 2], budget=16.0, time_limit=10)
    assert r.choice == [1, 1]
    assert r.objective == pytest.approx(12.0)
    # nothing fits 11 bytes: infeasible, no choice
    r = ilp.solve(costs(PAIR, fixed_bytes=(2.0,)), [2, 2], budget=11.0, time_limit=10)
    assert r.choice is None and r.status == "infeasible"


def test_a_combination_left_out_is_forbidden():
    # the tuple has no (1, 1): a mesh axis both would use
    tuples = [PAIR[0], PAIR[1], ([0, 1], [[0, 0], [0, 1], [1, 0]], [0.0, 0.0, 0.0], [[0.0] * 3])]
    r = ilp.solve(costs(tuples), [2, 2], budget=100.0, time_limit=10)
    assert r.choice in ([0, 1], [1, 0])
    assert r.objective == pytest.approx(4.0)
