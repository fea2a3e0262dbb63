"""GSPMD's step semantics (issue 9): every value a step hands back is complete, so a step's
collectives are those a pod runs; re-marking an equal sharding is a no-op; mark_sharding takes
what an op on an XLAShardedTensor returns. Every number is compared with eager CPU."""
import copy

import numpy as np
import pytest
import torch

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.runtime as xr
from torch_spmd.debug import last_step_stats
from spmd_diff import assert_same, collectives, ensure_devices, mesh_of, step, to_device


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def megatron_mlp(mesh):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    model = copy.deepcopy(cpu).to(torch_spmd.device())
    xs.mark_sharding(model[0].weight, mesh, ("model", None))   # column-parallel
    xs.mark_sharding(model[0].bias, mesh, ("model",))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))   # row-parallel
    return cpu, model


def model_axis(stats):
    return [c for c in stats["collectives"] if c["axes"] == ["model"]]


def test_megatron_mlp_reduces_inside_the_step_forward_and_backward():
    mesh = mesh_of((2, 4))
    cpu, model = megatron_mlp(mesh)
    x = torch.randn(8, 16)
    xd = to_device(x, mesh, ("data", None)).requires_grad_(True)
    step([])

    y = model(xd)
    fwd = step([y])
    # The row-parallel layer's partial sum is all-reduced by the step that computes it.
    assert [(c["kind"], c["axes"]) for c in fwd["collectives"]] == [("all-reduce", ["model"])]
    assert fwd["pending_reductions"] == []
    assert model_axis(fwd)[0]["bytes"] == 8 // 2 * 16 * 4  # the local [4, 16] float output

    y.sum().backward()
    bwd = step([xd.grad] + [p.grad for p in model.parameters()])
    # One all-reduce over 'model' for the input gradient (column-parallel backward); the weight
    # gradients sum over the data-sharded batch: all-reduces over 'data', also in this step.
    assert [c["kind"] for c in model_axis(bwd)] == ["all-reduce"]
    assert {c["kind"] for c in bwd["collectives"] if c["axes"] == ["data"]} == {"all-reduce"}
    assert bwd["pending_reductions"] == []

    xc = x.clone().requires_grad_(True)
    cpu(xc).sum().backward()
    assert_same(y.cpu(), cpu(x).detach(), "output")
    assert_same(xd.grad.cpu(), xc.grad, "input grad")
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        assert_same(p.grad.cpu(), q.grad, f"grad {name}")


def test_partial_output_annotated_on_its_axis_is_reduce_scattered():
    mesh = mesh_of((2, 4))
    a, b = torch.randn(8, 12), torch.randn(12, 6)
    ad, bd = to_device(a, mesh, (None, "model")), to_device(b, mesh, ("model", None))
    step([])
    out = ad @ bd                                  # a partial sum over 'model'
    xs.mark_sharding(out, mesh, ("model", None))   # wanted tiled over the same axis
    stats = step([out])
    assert collectives(stats) == [("reduce-scatter", ("model",))]
    assert stats["pending_reductions"] == []
    assert xs.get_sharding_spec(out) == mesh.get_op_sharding(("model", None))
    assert_same(out.cpu(), a @ b, "a @ b")


def test_deferred_output_reductions_are_opt_in():
    mesh = mesh_of((2, 4))
    a, b = torch.randn(8, 12), torch.randn(12, 6)
    ad, bd = to_device(a, mesh, (None, "model")), to_device(b, mesh, ("model", None))
    step([])
    assert not xr.defers_output_reductions()
    with xr.defer_output_reductions():
        assert xr.defers_output_reductions()
        out = ad @ bd
        deferred = step([out])
    assert not xr.defers_output_reductions()
    # Nothing communicated in the step; the sum is listed as pending and reduced when read.
    assert deferred["collectives"] == []
    assert [(c["kind"], c["axes"]) for c in deferred["pending_reductions"]] == \
        [("all-reduce", ["model"])]
    assert_same(out.cpu(), a @ b, "deferred a @ b")

    # The same graph outside the block compiles its own program, reduced in the step.
    out2 = ad @ bd
    stats = step([out2])
    assert collectives(stats) == [("all-reduce", ("model",))]
    assert stats["pending_reductions"] == []
    assert_same(out2.cpu(), a @ b, "a @ b")


def test_remarking_the_same_device_tiling_is_a_no_op():
    # The user guide's example: on a mesh (8, 1), ('data',) and (('data', 'model'),) put the
    # same tiles on the same devices.
    mesh = mesh_of((8, 1))
    x = torch.randn(16, 4)
    t = x.to(torch_spmd.device())
    xs.mark_sharding(t, mesh, ("data", None))
    spec = xs.get_sharding_spec(t)
    xs.mark_sharding(t, mesh, (("data", "model"), None))
    assert xs.get_sharding_spec(t) == spec
    assert_same(t.cpu(), x, "re-marked tensor")
    with pytest.raises(RuntimeError, match="Existing annotation must be cleared first"):
        xs.mark_sharding(t, mesh, (None, "data"))
    assert xs.get_sharding_spec(t) == spec  # the failed call changed nothing
    assert_same(t.cpu(), x, "tensor after the failed re-mark")


def test_mark_sharding_on_what_an_op_on_a_sharded_tensor_returns():
    # The XLAShardedTensor RFC's docstring example, with a Mesh.
    mesh = xs.Mesh(np.arange(8), (4, 2))
    torch.manual_seed(0)
    x = torch.randn(8, 32)
    linear = torch.nn.Linear(32, 10)
    inp = xs.mark_sharding(x.to(xm.xla_device()), mesh, (0, None))
    assert isinstance(inp, xs.XLAShardedTensor)
    dev_linear = copy.deepcopy(linear).to(xm.xla_device())
    xs.mark_sharding(dev_linear.weight, mesh, (None, 1))
    output = dev_linear(inp)                       # mixes the wrapper with plain parameters
    output = xs.mark_sharding(output, mesh, (None, None))
    assert isinstance(output, xs.XLAShardedTensor)
    assert output.sharding_type == xs.ShardingType.REPLICATED
    assert_same(output.global_tensor.cpu(), linear(x).detach(), "linear(input)")
    # ... and the other sharding entry points take it too.
    other = dev_linear(inp) * 2
    assert xs.get_sharding_spec(other) == ""
    xs.mark_sharding(other, mesh, (0, None))
    assert xs.get_sharding_spec(other) == mesh.get_op_sharding((0, None))
    assert_same(xs.clear_sharding(other).cpu(), linear(x).detach() * 2, "2 * linear(input)")


@pytest.mark.parametrize("defer", [False, True])
def test_gradient_accumulation_communicates_once_when_deferred(defer):
    mesh = mesh_of((8,))
    torch.manual_seed(0)
    cpu = torch.nn.Linear(16, 4)
    model = copy.deepcopy(cpu).to(torch_spmd.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(16, 16) for _ in range(3)]
    step([])
    micro = []
    with xr.defer_output_reductions(defer):
        for x in batches:
            model(to_device(x, mesh, ("x", None))).pow(2).sum().backward()
            micro.append(step([p.grad for p in model.parameters()]))
    opt.step()
    update = step(list(model.parameters()))
    # Weight and bias gradients sum over the sharded batch: reduced in every micro-step by
    # default; accumulated as partial sums (adds of two pending sums stay pending) and reduced
    # once, by the update that reads them, when deferred.
    if defer:
        assert all(s["collectives"] == [] for s in micro)
        assert all(len(s["pending_reductions"]) == 2 for s in micro)
        assert collectives(update) == [("all-reduce", ("x",))] * 2
    else:
        assert all(collectives(s) == [("all-reduce", ("x",))] * 2 for s in micro)
        assert all(s["pending_reductions"] == [] for s in micro)
        assert collectives(update) == []
    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    for x in batches:
        cpu(x).pow(2).sum().backward()
    cpu_opt.step()
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        assert_same(p.detach().cpu(), q.detach(), f"param {name}")


def test_unrelated_values_on_different_meshes_sync_as_separate_programs():
    # Two meshes of different shapes over the same devices: each value's program runs on its
    # own mesh (PyTorch/XLA's test_xla_sharding does this between tests).
    dev = torch_spmd.device()
    a0, b0 = torch.randn(1, 128), torch.randn(8)
    mesh_a, mesh_b = xs.Mesh(np.arange(8), (1, 8)), xs.Mesh(np.arange(8), (8,))
    a = a0.to(dev) + 1
    xs.mark_sharding(a, mesh_a, (0, 1))
    b = b0.to(dev) + 1
    xs.mark_sharding(b, mesh_b, (0,))
    torch_spmd.sync()
    assert xs.get_sharding_spec(a) == mesh_a.get_op_sharding((0, 1))
    assert xs.get_sharding_spec(b) == mesh_b.get_op_sharding((0,))
    assert_same(a.cpu(), a0 + 1, "a")
    assert_same(b.cpu(), b0 + 1, "b")
    # Data on two meshes read by one computation: the foreign one is relaid out.
    assert_same((a.sum() + b.sum()).cpu(), (a0 + 1).sum() + (b0 + 1).sum(), "a.sum() + b.sum()")
    # Constraints on two meshes in one computation cannot be met by one program.
    c = a * 2
    xs.mark_sharding(c, mesh_a, (0, 1))
    d = b * 2
    xs.mark_sharding(d, mesh_b, (0,))
    with pytest.raises(RuntimeError, match="constrains values to shardings on different meshes"):
        (c.sum() + d.sum()).cpu()
    assert_same(c.cpu(), (a0 + 1) * 2, "c after the failed step")


def test_manual_sharding_region_runs_per_device_and_matches_cpu():
    # enable_manual_sharding: each device's shard is a tensor of its own; ops run on it with no
    # collective; disable_manual_sharding makes the shards a global tensor again.
    mesh = xs.Mesh(np.arange(8), (2, 4), ("data", "model"))
    x0, w0 = torch.randn(10, 8), torch.randn(8, 3)          # 10 rows over 2: shards of 5
    x = x0.to(torch_spmd.device())
    w = w0.to(torch_spmd.device())                           # replicated: read whole per device
    xx = xs.enable_manual_sharding(x, ("data", None), mesh=mesh)
    assert xx.shape == (5, 8) and xx.sharding_spec == "{manual}"
    assert xx.sharding_type == xs.ShardingType.MANUAL
    yy = torch.relu(xx.global_tensor @ w) * 2
    y = xs.disable_manual_sharding(yy, ("data", None), (10, 3), mesh=mesh)
    stats = step([y.global_tensor])
    assert stats["collectives"] == []
    assert y.shape == (10, 3) and y.sharding_spec == mesh.get_op_sharding(("data", None))
    assert_same(y.global_tensor.cpu(), torch.relu(x0 @ w0) * 2, "manual region")
    with pytest.raises(RuntimeError, match="device data"):
        xs._mark_manual_sharding(x)
    with pytest.raises(RuntimeError, match="has shards of"):
        xs.disable_manual_sharding(yy, ("data", "model"), (10, 3), mesh=mesh)
    previous = xs.get_global_mesh()
    xs.set_global_mesh(None)
    try:
        with pytest.raises(ValueError, match="needs a mesh"):
            xs.enable_manual_sharding(x, ("data", None))
    finally:
        xs.set_global_mesh(previous)
    m = xs._mark_manual_sharding(xx.global_tensor + 1)
    assert m.sharding_spec == "{manual}"
