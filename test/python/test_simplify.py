"""Whole-graph simplifications applied before partitioning (csrc/partition/simplify.cc). A sum
of gradients that each fill one part of the same zeros tensor (select_backward or
slice_backward, as autograd emits for q, k and v taken out of one fused projection) and cover
its whole dim runs as one stack or cat. Each test compares with CPU eager (spmd_diff.check) and
reads the JoinedGradientSums counter to see whether the rewrite applied."""
import pytest
import torch

from torch_spmd.debug import metrics
from spmd_diff import check, mesh_of


def T(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def joined(fn):
    metrics.clear_counters()
    fn()
    return metrics.counter_value("JoinedGradientSums") or 0


def qkv_by_select(x, w, index=(0, 1, 2)):
    # [batch, seq, 3, d]: q, k, v by index (negative indices too), combined non-linearly.
    h = (x @ w).view(x.shape[0], x.shape[1], 3, -1)
    parts = [h.select(2, i) for i in index]
    out = parts[0].tanh()
    for p in parts[1:]:
        out = out * p.sigmoid()
    return out


@pytest.mark.parametrize("specs", [
    [("data", None, None), None],            # data parallel
    [("data", None, None), (None, "model")],  # fused projection's features sharded
])
def test_sum_of_select_gradients_covering_the_dim_is_one_stack(specs):
    mesh = mesh_of((4, 2))
    n = joined(lambda: check(qkv_by_select, [T(8, 5, 6, seed=1), T(6, 12, seed=2)], specs, mesh,
                             grad=True))
    assert n == 1


def test_negative_select_indices_are_joined_too():
    mesh = mesh_of((4, 2))
    f = lambda x, w: qkv_by_select(x, w, (-3, 1, -1))
    assert joined(lambda: check(f, [T(4, 3, 6, seed=3), T(6, 9, seed=4)],
                                [("data", None, None), None], mesh, grad=True)) == 1


def test_select_gradients_that_leave_part_of_the_dim_unset_stay_a_sum():
    mesh = mesh_of((4, 2))
    f = lambda x, w: qkv_by_select(x, w, (0, 2))
    assert joined(lambda: check(f, [T(4, 3, 6, seed=5), T(6, 9, seed=6)],
                                [("data", None, None), None], mesh, grad=True)) == 0


def slices(x, w, bounds):
    h = x @ w
    parts = [h[..., a:b] for a, b in bounds]
    out = parts[0].tanh()
    for p in parts[1:]:
        out = out + (p * p).sum(-1, keepdim=True)
    return out


@pytest.mark.parametrize("specs", [
    [("data", None), None],
    [("data", None), (None, "model")],  # the sliced dim itself sharded
])
def test_sum_of_slice_gradients_covering_the_dim_is_one_cat(specs):
    mesh = mesh_of((4, 2))
    f = lambda x, w: slices(x, w, [(0, 3), (3, 4), (4, None)])
    assert joined(lambda: check(f, [T(8, 6, seed=7), T(6, 10, seed=8)], specs, mesh,
                                grad=True)) == 1


@pytest.mark.parametrize("bounds", [
    [(0, 6), (4, None)],   # overlapping
    [(0, 3), (5, None)],   # a gap
])
def test_slice_gradients_that_overlap_or_leave_a_gap_stay_a_sum(bounds):
    mesh = mesh_of((4, 2))
    f = lambda x, w: slices(x, w, bounds)
    assert joined(lambda: check(f, [T(8, 6, seed=9), T(6, 10, seed=10)], [("data", None), None],
                                mesh, grad=True)) == 0
