"""Collective matmul (XLA's windowed einsum, partition/windowed_einsum.h): a tensor-parallel
matmul whose operand would be all-gathered first, or whose partial result would be
reduce-scattered after, runs as partial matmuls with the chunks passed around the group's ring
by collective-permutes, both directions at once. Every case equals CPU eager (forward and
backward), moves the bytes of the collective it replaces, plans as it executes, and is priced
with its overlap."""
import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
import torch_spmd.runtime as xr
from spmd_diff import constrain, mesh_of, run


def kinds(collectives):
    return [kind for kind, _ in collectives]


def permutes(collectives):
    return sum(1 for kind, _ in collectives if kind == "collective-permute")


def assert_close(r, atol=1e-4):
    for dev, cpu in zip(r.dev_out, r.cpu_out):
        torch.testing.assert_close(dev, cpu, atol=atol, rtol=1e-4)
    for dev, cpu in zip(r.dev_grads, r.cpu_grads):
        if cpu is not None:
            torch.testing.assert_close(dev, cpu, atol=atol, rtol=1e-4)


# The gathered operand is an activation (computed by an op that is neither pointwise nor a
# view: here a scan over its whole dim); a weight's gather is issued ahead instead.
def activation(t, dim):
    return t.cumsum(dim)


def gathered_on_contraction(x, w):  # x tiled on its hidden dim (MaxText's activation_embed)
    return constrain(activation(x, 0) @ w, (None, "model"))


def gathered_on_rows(x, w):  # Megatron's sequence parallelism before a column-parallel matmul
    return constrain(activation(x, 1) @ w, (None, "model"))


def gathered_on_columns(x, w):  # the gathered operand on the right (its columns: N)
    return constrain(x @ activation(w, 0), ("model", None))


def scattered_rows(x, w):  # a row-parallel matmul reduce-scattered onto the sequence
    return constrain(x @ w, ("model", None))


def scattered_columns(x, w):  # ... or onto the hidden dim (MaxText's residual stream)
    return constrain(x @ w, (None, "model"))


CASES = {
    "gather contraction": (gathered_on_contraction, [(64, 32), (32, 24)],
                           [(None, "model"), (None, "model")], "gather"),
    "gather rows": (gathered_on_rows, [(16, 32), (32, 64)], [("model", None), (None, "model")],
                    "gather"),
    "gather columns": (gathered_on_columns, [(64, 32), (32, 64)], [("model", None), (None, "model")],
                       "gather"),
    "scatter rows": (scattered_rows, [(64, 32), (32, 24)], [(None, "model"), ("model", None)],
                     "scatter"),
    "scatter columns": (scattered_columns, [(64, 32), (32, 32)], [(None, "model"), ("model", None)],
                        "scatter"),
}


@pytest.mark.parametrize("shape", [(2, 4), (4, 2), (1, 8)])
@pytest.mark.parametrize("case", sorted(CASES))
def test_collective_matmul_equals_cpu_and_replaces_the_collective(case, shape):
    fn, sizes, specs, kind = CASES[case]
    torch.manual_seed(0)
    inputs = [torch.randn(*s) for s in sizes]
    n = shape[1]
    with xr.collective_matmul(0, min_step_extent=1):
        r = run(fn, inputs, specs, mesh_of(shape), grad=True)
    assert_close(r)
    fwd = kinds(r.fwd)
    assert "all-gather" not in fwd and "reduce-scatter" not in fwd and "all-reduce" not in fwd, r.fwd
    # A gather: n - 1 chunks arrive (n/2 from the next member, the rest from the previous);
    # a scatter: each half of the running sum passes n - 1 members, one half each way (a ring
    # of two members has one direction).
    halves = 2 if n > 2 else 1
    assert permutes(r.fwd) == (n - 1 if kind == "gather" else halves * (n - 1)), r.fwd
    # Without it the same step gathers or scatters.
    plain = run(fn, inputs, specs, mesh_of(shape), grad=False)
    assert ("all-gather" if kind == "gather" else "reduce-scatter") in kinds(plain.fwd), plain.fwd
    assert_close(plain)


def test_bytes_moved_equal_the_collective_replaced():
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32), torch.randn(32, 64)]
    specs = [("model", None), (None, "model")]
    with xr.collective_matmul(0, min_step_extent=1):
        windowed = run(gathered_on_rows, inputs, specs, mesh_of((2, 4)))
    plain = run(gathered_on_rows, inputs, specs, mesh_of((2, 4)))
    moved = lambda stats: sum(c["bytes"] * (c["group_size"] - 1 if c["kind"] == "all-gather" else 1)
                              for c in stats["collectives"])
    # Each of the 3 others' row blocks (16 / 4 rows of 32 floats) reaches each device once.
    assert moved(windowed.fwd_stats) == moved(plain.fwd_stats) == 3 * (16 // 4) * 32 * 4


def test_uneven_dims_fall_back_and_stay_exact_with_poisoned_padding():
    torch.manual_seed(0)
    inputs = [torch.randn(10, 32), torch.randn(32, 64)]  # 10 rows over 4: padded tiles
    with xr.collective_matmul(0, min_step_extent=1):
        r = run(gathered_on_rows, inputs, [("model", None), (None, "model")], mesh_of((2, 4)),
                grad=True)
    assert "all-gather" in kinds(r.fwd)
    assert_close(r)


def test_a_weights_gather_is_not_windowed():
    # FSDP: the weight, cast to the compute dtype, is gathered; it waits for no compute and is
    # issued ahead, not windowed.
    torch.manual_seed(0)
    inputs = [torch.randn(64, 32), torch.randn(32, 16)]
    with xr.collective_matmul(0, min_step_extent=1):
        r = run(lambda x, w: activation(x, 1) @ w.double().float(), inputs,
                [("model", None), ("model", None)], mesh_of((2, 4)))
    assert permutes(r.fwd) == 0 and "all-gather" in kinds(r.fwd), r.fwd
    assert_close(r)


def test_steps_thinner_than_the_minimum_extent_are_not_windowed():
    torch.manual_seed(0)
    inputs = [torch.randn(64, 32), torch.randn(32, 256)]
    specs = [("model", None), (None, "model")]
    with xr.collective_matmul(0, min_step_extent=32):  # 64 rows over 4: 16 a step
        assert "all-gather" in kinds(run(gathered_on_rows, inputs, specs, mesh_of((2, 4))).fwd)
    with xr.collective_matmul(0, min_step_extent=16):
        assert permutes(run(gathered_on_rows, inputs, specs, mesh_of((2, 4))).fwd) == 3


def test_threshold_and_errors():
    torch.manual_seed(0)
    inputs = [torch.randn(16, 32), torch.randn(32, 64)]
    specs = [("model", None), (None, "model")]
    with xr.collective_matmul(1 << 30):  # above what this gather moves: not windowed
        assert "all-gather" in kinds(run(gathered_on_rows, inputs, specs, mesh_of((2, 4))).fwd)
    assert xr.collective_matmul_threshold() is None
    for bad in (-1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="threshold_bytes"):
            xr.set_collective_matmul(bad)
    with pytest.raises(ValueError, match="collective_matmul"):
        plan.Plan(num_devices=8, hardware="tpu-v5e", collective_matmul="yes")
    with pytest.raises(ValueError, match="collective_matmul_bytes"):
        plan.resolve(dict(plan.resolve("h100"), collective_matmul_bytes=-3))


def _tensor_parallel_mlp_step(mesh, tokens=2048, hidden=64, ffn=1024, seed=0):
    """A Megatron MLP with sequence parallelism: the residual stream split over the sequence,
    gathered into a column-parallel matmul, reduce-scattered out of a row-parallel one."""
    torch.manual_seed(seed)
    dev = torch_spmd.device()
    w1 = torch.randn(hidden, ffn, device=dev, requires_grad=True)
    w2 = torch.randn(ffn, hidden, device=dev, requires_grad=True)
    xs.mark_sharding(w1, mesh, (None, "model"))
    xs.mark_sharding(w2, mesh, ("model", None))
    x = torch.randn(tokens, hidden, device=dev)  # a random draw: an activation, not a weight
    xs.mark_sharding(x, mesh, ("model", None))
    y = (x @ w1).relu() @ w2
    xs.mark_sharding(y, mesh, ("model", None))
    y.pow(2).mean().backward()
    torch_spmd.sync()
    return torch_spmd.debug.last_step_stats()


def test_plan_equals_executed_and_the_overlap_is_priced():
    mesh = xs.Mesh(np.arange(8), (1, 8), ("data", "model"))
    with xr.collective_matmul(0):
        executed = _tensor_parallel_mlp_step(mesh)
        executed_report = plan.report_last_step("tpu-v5e").as_dict()
    with plan.Plan(num_devices=8, hardware="tpu-v5e", collective_matmul=True) as p:
        planned = _tensor_parallel_mlp_step(mesh)
        windowed = p.report().as_dict()
    for key in ("flops_per_device", "peak_bytes_per_device"):
        assert planned[key] == executed[key], key
    assert [(c["kind"], c["bytes"]) for c in planned["collectives"]] == \
        [(c["kind"], c["bytes"]) for c in executed["collectives"]]
    assert windowed["predicted_step_seconds"] == pytest.approx(
        executed_report["predicted_step_seconds"])
    # Priced with its overlap: a layer large enough for its transfers to hide behind its
    # partial matmuls (planned only), its tensor-parallel group one whole dimension of the
    # slice (64 v5e chips are 8 x 8), as MaxText lays its tensor axis out.
    big = dict(tokens=16384, hidden=1024, ffn=65536)
    reports = {}
    for on in (True, False):
        with plan.Plan(num_devices=64, hardware="tpu-v5e", collective_matmul=on) as p:
            _tensor_parallel_mlp_step(xs.Mesh(np.arange(64), (8, 8), ("data", "model")), **big)
            reports[on] = p.report().as_dict()
    windowed, gathered = reports[True], reports[False]
    assert [c["kind"] for c in gathered["collectives"]].count("collective-permute") == 0
    # The same bytes, most of them hidden behind the partial matmuls.
    assert windowed["exposed_communication_seconds"] < 0.5 * gathered["exposed_communication_seconds"]
    assert windowed["predicted_step_seconds"] < gathered["predicted_step_seconds"]
    # The preset's default is on for TPUs and off for GPUs.
    assert plan.resolve("tpu-v5p")["collective_matmul_bytes"] is not None
    assert plan.resolve("h100")["collective_matmul_bytes"] is None
