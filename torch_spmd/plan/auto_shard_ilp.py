"""The layout ILP of ``auto_shard`` (docs/auto_sharding.md, "The ILP"): Alpa's and XLA's
auto-sharding formulation over the search's decisions, solved by HiGHS (``scipy.optimize.milp``).

The coefficients come from ``_C._pending_layout_costs`` (plan/layout_costs.h): per tuple
of decisions that some ops' strategies depend on, every valid combination of their options with
its seconds (the ops at their local shapes and the all-reduces of partial results, summed over
those ops) and, per memory row (a point of the step with many live bytes), its bytes per
device. The program:

    minimise   sum_T sum_s seconds[T][s] y[T][s]              (+ the fixed ops' seconds)
    subject to sum_o x[j][o] = 1                              every decision j
               sum_s y[T][s] = 1                              every tuple T of 2+ decisions
               sum_{s: s_j = o} y[T][s] = x[j][o]             every j in T, option o
               sum_T sum_s bytes[r][T][s] y[T][s] <= budget - fixed bytes[r]   every row r
               x binary, y in [0, 1]

(a tuple of one decision puts its coefficients on x directly). With x integral the marginal
rows leave one y[T] at 1, the combination the decisions chose, so y needs no integrality; a
combination that uses a mesh axis twice has no y, which forbids it. HiGHS returns the best
incumbent at its time limit and its dual bound, hence the gap. The objective leaves out overlap,
resharding where propagation resolves a conflict, and fusion; ``auto_shard`` plans the solution
for real and descends from it with its other seeds.
"""
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np


@dataclass
class IlpResult:
    """One mesh shape's ILP: the option index per decision (None: no solution), the objective
    (seconds, the fixed ops' included), HiGHS's dual bound and relative gap, its status and the
    seconds it took."""
    mesh_shape: tuple
    choice: Optional[List[int]]
    objective: float
    bound: float
    gap: float
    status: str
    seconds: float
    # its layout as auto_shard planned it (None: not planned)
    planned_step_seconds: Optional[float] = None
    planned_fits: Optional[bool] = None

    def describe(self) -> str:
        shape = "x".join(map(str, self.mesh_shape)) or "ILP"
        if self.choice is None:
            return f"{shape}: {self.status} ({self.seconds:.2f} s)"
        planned = "" if self.planned_step_seconds is None else (
            f"; planned {self.planned_step_seconds * 1e3:.2f} ms"
            f"{'' if self.planned_fits else ' (over budget)'}")
        return (f"{shape}: {self.objective * 1e3:.2f} ms (bound {self.bound * 1e3:.2f} ms, gap "
                f"{self.gap:.1%}), {self.status} in {self.seconds:.2f} s{planned}")


def solver_available() -> bool:
    try:
        from scipy.optimize import milp  # noqa: F401  (scipy >= 1.9)
        return True
    except ImportError:
        return False


def solve(costs: dict, num_options: Sequence[int], budget: float, time_limit: float,
          mesh_shape=()) -> IlpResult:
    """Solves one mesh shape's ILP (``costs``: one entry of ``_C._pending_layout_costs``;
    ``num_options``: per decision) within ``time_limit`` seconds."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    t0 = time.perf_counter()
    offset = np.concatenate([[0], np.cumsum(num_options)]).astype(int)
    n_vars = int(offset[-1])
    cost = [0.0] * n_vars
    rows = len(costs["row_positions"])  # (a small step may have fewer points than asked)
    mem = [dict() for _ in range(rows)]  # row -> {var: bytes}
    a_i, a_j, a_v, lo, hi = [], [], [], [], []

    def equation(terms, value):
        r = len(lo)
        for j, v in terms:
            a_i.append(r)
            a_j.append(j)
            a_v.append(v)
        lo.append(value)
        hi.append(value)

    for j, n in enumerate(num_options):
        equation([(offset[j] + o, 1.0) for o in range(n)], 1.0)
    for decisions, combos, seconds, row_bytes in costs["tuples"]:
        if not combos:  # no valid combination: the ILP is infeasible as the program is
            return IlpResult(tuple(mesh_shape), None, 0.0, 0.0, 0.0, "infeasible",
                             time.perf_counter() - t0)
        if len(decisions) == 1:
            var = [offset[decisions[0]] + c[0] for c in combos]
        else:
            var = list(range(n_vars, n_vars + len(combos)))
            n_vars += len(combos)
            cost += [0.0] * len(combos)
            equation([(v, 1.0) for v in var], 1.0)
            for p, j in enumerate(decisions):
                for o in range(num_options[j]):
                    terms = [(v, 1.0) for v, c in zip(var, combos) if c[p] == o]
                    equation(terms + [(offset[j] + o, -1.0)], 0.0)
        for v, s in zip(var, seconds):
            cost[v] += s
        for r in range(rows):
            for v, b in zip(var, row_bytes[r]):
                if b:
                    mem[r][v] = mem[r].get(v, 0.0) + b
    for r in range(rows):
        room = budget - costs["fixed_bytes"][r]
        for v, b in mem[r].items():
            a_i.append(len(lo))
            a_j.append(v)
            a_v.append(b / budget)  # (scaled: bytes next to seconds would strain the solver)
        lo.append(-np.inf)
        hi.append(room / budget)
    integrality = np.zeros(n_vars)
    integrality[:offset[-1]] = 1
    matrix = coo_matrix((a_v, (a_i, a_j)), shape=(len(lo), n_vars)).tocsr()
    res = milp(np.asarray(cost), integrality=integrality, bounds=Bounds(0, 1),
               constraints=LinearConstraint(matrix, lo, hi),
               options=dict(time_limit=max(time_limit, 0.01), disp=False, mip_rel_gap=1e-4))
    status = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded"}.get(
        res.status, f"status {res.status}")
    seconds = time.perf_counter() - t0
    if res.x is None:
        return IlpResult(tuple(mesh_shape), None, 0.0, 0.0, 0.0, status, seconds)
    x = res.x
    choice = [int(np.argmax(x[offset[j]:offset[j + 1]])) for j in range(len(num_options))]
    fixed = costs["fixed_seconds"]
    bound = getattr(res, "mip_dual_bound", None)
    bound = res.fun if bound is None or not np.isfinite(bound) else bound
    gap = getattr(res, "mip_gap", None)
    gap = 0.0 if gap is None or not np.isfinite(gap) else float(gap)
    return IlpResult(tuple(mesh_shape), choice, float(res.fun) + fixed, float(bound) + fixed,
                     gap, status, seconds)
