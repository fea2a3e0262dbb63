"""The device-batched executor (docs/architecture.md, "Device-batched execution"): every value is
held as one stack of its devices' shards and each local op runs once over all rows. Each test
compares with CPU eager (spmd_diff.check) and asserts, through the executor's counters, which
path ran: folded contractions, ops run per row, views sharing their input's bytes."""
import os
import sys

import pytest
import torch

from torch_spmd import _C
from torch_spmd.debug import metrics
from spmd_diff import check, constrain, dev, ensure_devices, mesh_of, step, to_device

N = 8


def T(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def counters(fn):
    """fn() with the executor's counters cleared first; returns (fn's result, counters)."""
    metrics.clear_counters()
    out = fn()
    return out, {n: metrics.counter_value(n) for n in metrics.counter_names()}


# ---------------------------------------------------------------------------------------------
# folded contractions: a partial sum over a summed factor, reduced by the next collective


def test_data_parallel_weight_gradient_is_one_folded_contraction():
    # dW = x^T dy over a batch sharded 8 ways: partial over 'x', all-reduced. Folded, it is
    # one mm over all 8 devices' tokens; the all-reduce still runs and is counted.
    mesh = mesh_of((8,))
    r, c = counters(lambda: check(lambda x, w: (x @ w).tanh(), [T(32, 6, seed=1), T(6, 5, seed=2)],
                                  [("x", None), None], mesh, grad=True,
                                  bwd=[("all-reduce", ("x",))]))
    assert c.get("FoldedContractions", 0) >= 1, c
    assert c.get("CollectiveAllReduce", 0) >= 1, c


@pytest.mark.parametrize("shape,specs", [
    # Megatron row-parallel: k over 'model', 4 groups of 2 (the fold runs under vmap over groups).
    ((4, 2), [("data", "model"), ("model", None)]),
    # k over 'data', groups of 4 strided through the device ids.
    ((4, 2), [(None, "data"), ("data", "model")]),
    # uneven k: 10 cut 4 ways, the padding masked to zero before the fold.
    ((4, 2), [(None, "data"), ("data", None)]),
    ((2, 2, 2), [(None, ("a", "c")), (("a", "c"), "b")]),
])
def test_folded_contraction_over_groups_equals_cpu(shape, specs):
    mesh = mesh_of(shape)
    k = 10 if specs == [(None, "data"), ("data", None)] else 8
    r, c = counters(lambda: check(lambda x, w: x @ w, [T(6, k, seed=3), T(k, 4, seed=4)], specs,
                                  mesh))
    assert c.get("FoldedContractions", 0) == 1, c


def test_folded_contraction_into_reduce_scatter_equals_cpu():
    # The result is wanted tiled over the axis its sum runs over: a reduce-scatter, whose
    # folded form computes the sum once and cuts the members' tiles from it.
    mesh = mesh_of((8,))
    r, c = counters(lambda: check(lambda x, w: constrain(x.t() @ w, ("x", None)),
                                  [T(16, 12, seed=5), T(16, 3, seed=6)], [("x", None), ("x", None)],
                                  mesh, fwd=[("reduce-scatter", ("x",))]))
    assert c.get("FoldedContractions", 0) == 1, c


@pytest.mark.parametrize("shape,specs,out_spec", [
    # Megatron row-parallel linear with a bias: k over 'model', all-reduced.
    ((4, 2), [("data", "model"), (None, "model"), None], None),
    # k over all 8 devices, uneven (10 cut 8 ways), into a reduce-scatter of the result.
    ((8,), [(None, "x"), (None, "x"), None], ("x", None)),
])
def test_row_parallel_linear_with_bias_folds_through_the_bias_add(shape, specs, out_spec):
    # addmm with a sharded contraction is mm + add(bias / n): the partial sum passes the add.
    # Folded, the mm runs once per group on the group's whole contraction and the add once
    # per group on the group sums (the bias share summed over the members: the bias once).
    mesh = mesh_of(shape)
    k = 10 if out_spec else 8

    def fn(x, w, b):
        y = torch.nn.functional.linear(x, w, b)
        return constrain(y, out_spec) if out_spec else y

    _, c = counters(lambda: check(fn, [T(12, k, seed=20), T(5, k, seed=21), T(5, seed=22)],
                                  specs, mesh))
    assert c.get("FoldedContractions", 0) == 1, c
    assert c.get("GroupSumOps", 0) == 1, c


def test_sum_of_two_partial_contractions_folds_both():
    # x1 @ w1 + x2 @ w2 with both contractions sharded over 'x': one pending sum passes the
    # add; each mm folds and the add runs on the two group sums.
    mesh = mesh_of((8,))
    _, c = counters(lambda: check(lambda a, b, p, q: a @ b + p @ q,
                                  [T(6, 16, seed=23), T(16, 4, seed=24), T(6, 8, seed=25),
                                   T(8, 4, seed=26)],
                                  [(None, "x"), ("x", None), (None, "x"), ("x", None)], mesh,
                                  fwd=[("all-reduce", ("x",))]))
    assert c.get("FoldedContractions", 0) == 2, c
    assert c.get("GroupSumOps", 0) == 1, c


def test_partial_sum_that_does_not_fold_is_summed_over_the_members_at_the_add():
    # x @ w folds; y.mean(0) (a rescaled partial, never folded) reaches the same add with one
    # partial value per member, which the add sums over each group itself.
    mesh = mesh_of((8,))
    _, c = counters(lambda: check(lambda x, w, y: x @ w + y.mean(0),
                                  [T(6, 16, seed=27), T(16, 4, seed=28), T(16, 6, 4, seed=29)],
                                  [(None, "x"), ("x", None), ("x", None, None)], mesh,
                                  fwd=[("all-reduce", ("x",))]))
    assert c.get("FoldedContractions", 0) == 1, c
    assert c.get("GroupSumOps", 0) == 1, c


def test_sum_over_a_sharded_dim_folds_and_mean_does_not():
    mesh = mesh_of((8,))
    _, c = counters(lambda: check(lambda x: x.sum(0), [T(16, 5, seed=7)], [("x", None)], mesh))
    assert c.get("FoldedContractions", 0) == 1, c
    # A mean is no plain sum of its tiles' means (the rule rescales): never folded.
    _, c = counters(lambda: check(lambda x: x.mean(0), [T(16, 5, seed=7)], [("x", None)], mesh))
    assert c.get("FoldedContractions", 0) == 0, c


# ---------------------------------------------------------------------------------------------
# elementwise ops and the vmap path


def test_zero_dim_partial_times_a_double_scalar_keeps_type_promotion():
    # Per device the partial sum is a 0-dim float tensor; stacked it has a dim. Against a
    # 0-dim double, promotion must treat it as the 0-dim tensor it is (result: float64).
    mesh = mesh_of((8,))
    scale = torch.tensor(2.5, dtype=torch.float64)
    # (The float32 sum is rounded per device first: float32 tolerances on the float64 result.)
    r = check(lambda x, s: x.sum() * s, [T(16, 3, seed=8), scale], [("x", None), None], mesh,
              rtol=1e-6, atol=1e-6)
    assert r.dev_out[0].dtype == torch.float64


def test_op_without_batching_rule_runs_per_row_and_equals_cpu():
    # nll_loss has no functorch batching rule: each device's shard is a call of its own.
    mesh = mesh_of((8,))
    target = torch.randint(0, 5, (16,), generator=torch.Generator().manual_seed(9))
    _, c = counters(lambda: check(
        lambda x, t: torch.nn.functional.nll_loss(x.log_softmax(-1), t, reduction="sum"),
        [T(16, 5, seed=10), target], [("x", None), ("x",)], mesh, grad=[0]))
    assert c.get("UnbatchedOps", 0) >= 1, c


@pytest.mark.parametrize("shape,specs", [
    ((8,), [("x", None), None]),
    ((4, 2), [("data", None), (None, "model")]),      # rows regrouped: 4 x 2 combinations
    ((2, 4), [("data", "model"), ("model", None)]),
])
def test_mlp_step_equals_cpu_on_several_meshes(shape, specs):
    mesh = mesh_of(shape)

    def mlp(x, w1, w2):
        h = torch.nn.functional.gelu(x @ w1)
        return torch.nn.functional.layer_norm(h @ w2.t(), (5,)).sum(-1)

    w2_spec = None if specs[1] is None else tuple(reversed(specs[1]))
    check(mlp, [T(16, 8, seed=11), T(8, 12, seed=12), T(5, 12, seed=13)],
          [specs[0], specs[1], w2_spec], mesh, grad=True)


def test_gpt_step_batches_every_op_but_the_loss():
    # A data-parallel transformer step: only nll_loss (no batching rule) runs per row.
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
    from bench_model import GPT, GPTConfig
    ensure_devices()
    mesh = mesh_of((8,))
    cfg = GPTConfig(layers=1, dim=16, heads=2, seq=8, vocab=11, batch=8)
    torch.manual_seed(0)
    cpu = GPT(cfg)
    model = GPT(cfg)
    model.load_state_dict(cpu.state_dict())
    model = model.to(dev())
    tok = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=torch.Generator().manual_seed(1))
    want = cpu.loss(tok[:, :-1], tok[:, 1:])
    want.backward()
    x, y = to_device(tok[:, :-1], mesh, ("x", None)), to_device(tok[:, 1:], mesh, ("x", None))
    step([])
    metrics.clear_counters()
    loss = model.loss(x, y)
    loss.backward()
    step([loss] + [p.grad for p in model.parameters()])
    unbatched = metrics.counter_value("UnbatchedOps") or 0
    assert unbatched <= 2, unbatched  # nll_loss forward and backward
    assert (metrics.counter_value("FoldedContractions") or 0) >= 4
    torch.testing.assert_close(loss.cpu(), want.detach(), rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------------------------
# views and memory


def test_select_outliving_its_input_borrows_its_bytes_and_charges_them():
    # q = (x * 2).select(1, 0) is read by its matmul after the last reader of x * 2 (its sum):
    # q borrows those bytes (no copy) and charges its own, as the copy it stands for would.
    ensure_devices()
    mesh = mesh_of((8,))
    xh, wh = T(64, 3, 16, seed=21), T(16, 4, seed=22)
    x = to_device(xh, mesh, ("x", None, None))
    w = to_device(wh, mesh, None)
    step([])

    def f(x, w):
        doubled = x * 2
        q = doubled.select(1, 0)
        return (doubled.sum(1) * 0 + 1).sum() + (q @ w).sum()

    metrics.clear_counters()
    y = f(x, w)  # (its intermediates are gone: not outputs of the step)
    step([y])
    assert (metrics.counter_value("BorrowedViews") or 0) == 1
    torch.testing.assert_close(y.cpu(), f(xh, wh))


def test_transposed_weight_shares_its_bytes_and_memory_is_exact():
    # w.t() feeding mm dies before w (read again by the sum): it is w's memory seen
    # transposed (no copy, no charge). Each device's peak above what it held before the step:
    # its [8, 16] tile of the product and the sum, nothing for w.t().
    ensure_devices()
    mesh = mesh_of((8,))
    x = to_device(T(64, 32, seed=14), mesh, ("x", None))
    w = to_device(T(16, 32, seed=15), mesh, (None, None))  # (on the devices now, not held)
    step([])
    before = [_C._memory_info(d)["bytes_used"] for d in range(N)]
    _C._reset_peak_memory()
    metrics.clear_counters()
    y = x @ w.t()
    total = w.sum()
    step([y, total])
    assert (metrics.counter_value("SharedViews") or 0) >= 1
    result_bytes = 8 * 16 * 4 + 4
    for d in range(N):
        info = _C._memory_info(d)
        assert info["peak_bytes_used"] - before[d] == result_bytes, d
    torch.testing.assert_close(y.cpu(), T(64, 32, seed=14) @ T(16, 32, seed=15).t())


@pytest.mark.parametrize("specs", [
    [("data", None, None, None), ("data", None, None, None)],    # batch sharded (uneven: 6 by 4)
    [(None, "model", None, None), (None, "model", None, None)],  # heads
    [("data", None, "model", None), None],                        # rows of one, other replicated
    [(None, None, None, "model"), (None, None, "model", None)],  # contraction: partial sums
])
def test_matmul_runs_on_stacked_shards_and_equals_cpu(specs):
    # matmul's batch dims broadcast like pointwise dims: it runs once over the stacked devices
    # (rule elementwise), uneven padding and partial sums included.
    mesh = mesh_of((4, 2))
    check(lambda a, b: (a @ b).tanh(), [T(6, 4, 5, 8, seed=13), T(6, 4, 8, 3, seed=14)], specs,
          mesh, grad=True)


def test_a_slice_read_by_a_kernel_shares_its_bytes():
    # x[:, :16] feeding mm dies before x (read again by the sum): a strided view of x's rows
    # (kSubset, as select), no copy and no charge: each device's peak above what it held is its
    # tile of the product and the sum (its partial and the reduced one), nothing for the slice
    # (a copy would add its 8 x 16 tile).
    ensure_devices()
    mesh = mesh_of((8,))
    xh, wh = T(64, 48, seed=31), T(16, 8, seed=32)
    x = to_device(xh, mesh, ("x", None))
    w = to_device(wh, mesh, (None, None))  # (on the devices now, not held)
    step([])
    before = [_C._memory_info(d)["bytes_used"] for d in range(N)]
    _C._reset_peak_memory()
    metrics.clear_counters()
    y = x[:, :16] @ w
    total = x.sum()
    step([y, total])
    assert (metrics.counter_value("SharedViews") or 0) >= 1
    for d in range(N):
        info = _C._memory_info(d)
        assert info["peak_bytes_used"] - before[d] == 8 * 8 * 4 + 2 * 4, d
    torch.testing.assert_close(y.cpu(), xh[:, :16] @ wh)
    torch.testing.assert_close(total.cpu(), xh.sum())
