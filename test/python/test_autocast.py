"""torch.autocast("spmd"): torch's CUDA autocast policy on the device (csrc/aten/autocast.cc),
bfloat16 by default.

Each program runs under ``torch.autocast("spmd")`` on the device and, as the reference, on CPU
eager with the casts written out (CPU's own autocast has other op lists): ``lp(t)`` casts to the
autocast dtype where CUDA's lower-precision list casts (linear, matmul, mm, bmm, addmm, ...),
``f32(t)`` to float32 where its fp32 lists do (softmax, log_softmax, layer_norm, losses, exp,
sum, ...). On the device both are the identity: autocast must insert those casts itself."""
import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_spmd
import torch_spmd.core.xla_model as xm
import torch_spmd.distributed.spmd as xs
import torch_spmd.plan as plan
import torch_spmd.runtime as xr
from torch_spmd import _C
from torch_spmd.debug import last_step_stats
from spmd_diff import assert_same, collectives, ensure_devices, mesh_of, run, step, to_device

BF16, F16 = torch.bfloat16, torch.float16


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def _keep(t):
    return t


def low_precision_casts(dtype):
    """``lp`` as autocast casts: to ``dtype``, once per region for a float32 leaf that requires
    grad (autocast caches the cast of a weight, so the gradients of its uses add up in
    ``dtype`` before the one cast back)."""
    cache = {}

    def lp(t):
        if not (t.is_leaf and t.requires_grad and t.dtype == torch.float32):
            return t.to(dtype)
        if id(t) not in cache:
            cache[id(t)] = t.to(dtype)
        return cache[id(t)]

    return lp


def autocast_or_written_out(body, dtype=None):
    """``fn(*args)`` running ``body(lp, f32, *args)``: on the device under
    ``torch.autocast("spmd", dtype)`` (the default dtype when None) with ``lp`` and ``f32`` doing
    nothing; on CPU with them casting to the autocast dtype and to float32."""
    def fn(*args):
        if torch_spmd.is_spmd_tensor(args[0]):
            kwargs = {} if dtype is None else {"dtype": dtype}
            with torch.autocast("spmd", **kwargs):
                return body(_keep, _keep, *args)
        return body(low_precision_casts(dtype or BF16), lambda t: t.float(), *args)

    return fn


def test_autocast_defaults_to_bf16_and_reports_itself_enabled():
    assert torch.get_autocast_dtype("spmd") == BF16
    assert BF16 in torch.spmd.get_amp_supported_dtype()
    assert not torch.is_autocast_enabled("spmd")
    with torch.autocast("spmd"):
        assert torch.is_autocast_enabled("spmd")
        with torch.autocast("spmd", dtype=F16):
            assert torch.get_autocast_dtype("spmd") == F16
        assert torch.get_autocast_dtype("spmd") == BF16
    assert not torch.is_autocast_enabled("spmd")


def op_lists(lp, f32, a, b, c, w, bias, g, beta):
    """One or two ops of each of CUDA's policies (a[4,8], b[8,8], c[2,4,8], w[6,8])."""
    mm = torch.mm(lp(a), lp(b))                                   # lower precision
    lin = F.linear(lp(a), lp(w), lp(bias))
    return (
        mm,
        torch.matmul(lp(c), lp(b)),
        torch.bmm(lp(c), lp(c.transpose(1, 2))),
        torch.addmm(lp(bias), lp(a), lp(w.t())),
        lin,
        torch.softmax(f32(mm), -1),                               # fp32 (sets softmax's dtype)
        F.log_softmax(f32(lin), -1),
        F.layer_norm(f32(lin), (6,), f32(g), f32(beta)),          # fp32
        torch.exp(f32(mm)),
        torch.sum(f32(mm), 0),
        torch.dot(a[0], f32(mm[0])),                              # promote: the widest type
        torch.relu(mm),                                           # in no list: as it comes
    )


def op_list_inputs():
    torch.manual_seed(0)
    return [torch.randn(4, 8), torch.randn(8, 8), torch.randn(2, 4, 8), torch.randn(6, 8),
            torch.randn(6), torch.randn(6), torch.randn(6)]


@pytest.mark.parametrize("dtype", [None, BF16, F16], ids=["default", "bf16", "f16"])
def test_each_policy_casts_as_cuda_does_unsharded_bit_for_bit(dtype):
    # Unsharded, the device runs the very kernels CPU eager does on the same values: outputs and
    # the float32 inputs' gradients agree exactly, in dtype and in value, only if autocast cast
    # exactly what the written-out program casts.
    r = run(autocast_or_written_out(op_lists, dtype), op_list_inputs(), [], mesh_of((8,)),
            grad=True)
    want = dtype or BF16
    assert [o.dtype for o in r.cpu_out[:5]] == [want] * 5
    assert [o.dtype for o in r.cpu_out[5:11]] == [torch.float32] * 6
    assert r.cpu_out[11].dtype == want
    for i, (d, c) in enumerate(zip(r.dev_out, r.cpu_out)):
        assert d.dtype == c.dtype, f"output {i}: {d.dtype} != {c.dtype}"
        assert torch.equal(d, c), f"output {i} differs"
    for i, (d, c) in enumerate(zip(r.dev_grads, r.cpu_grads)):
        assert d.dtype == c.dtype == torch.float32, f"grad {i}"
        assert torch.equal(d, c), f"grad {i} differs"


def mlp_loss(lp, f32, x, w1, b1, w2, b2, g, beta, w3, target):
    """Two linear layers (column- and row-parallel in the Megatron layout), layer norm and a
    cross-entropy head: float32 master weights used in the autocast dtype."""
    h = F.gelu(F.linear(lp(x), lp(w1), lp(b1)))
    h = F.linear(lp(h), lp(w2), lp(b2))
    h = F.layer_norm(f32(h), (h.shape[-1],), f32(g), f32(beta))
    logits = F.linear(lp(h), lp(w3))
    return F.cross_entropy(f32(logits), target), logits


def mlp_inputs():
    torch.manual_seed(1)
    return [torch.randn(14, 32), torch.randn(63, 32) / 6, torch.randn(63) / 6,
            torch.randn(32, 63) / 8, torch.randn(32) / 8, 1 + torch.randn(32) / 4,
            torch.randn(32) / 4, torch.randn(10, 32) / 6, torch.randint(0, 10, (14,))]


def check_mixed(fn, inputs, specs, mesh, grad, dtype):
    """``spmd_diff.run`` of ``fn`` compared with CPU: equal dtypes, no replicated fallback, and
    values within 4 units of ``dtype``'s precision (``torch.finfo(dtype).eps``) of each tensor's
    largest magnitude. Sharding adds partial sums rounded to ``dtype`` in another order than one
    whole-tensor kernel does (these programs stay within 1 unit); a partitioning mistake (a
    missing or doubled reduction, padding read) is off by whole parts of the value."""
    r = run(fn, inputs, specs, mesh, grad=grad)
    tol = 4 * torch.finfo(dtype).eps
    pairs = [(f"output {i}", d, c) for i, (d, c) in enumerate(zip(r.dev_out, r.cpu_out))]
    pairs += [(f"grad {i}", d, c) for i, (d, c) in enumerate(zip(r.dev_grads, r.cpu_grads))]
    for what, d, c in pairs:
        assert d.dtype == c.dtype, f"{what}: {d.dtype} != {c.dtype}"
        torch.testing.assert_close(d, c, rtol=0, atol=tol * c.abs().max().item(),
                                   msg=lambda m: f"{what}: {m}")
    for stats in (r.fwd_stats, r.bwd_stats):
        assert not stats["replicated_fallback_ops"], stats["replicated_fallback_ops"]
    return r


# Data parallel and Megatron over a (4, 2) mesh. The batch of 14 is uneven over 'data' (tiles of
# 4), the hidden 63 over 'model' (tiles of 32): their padding is poisoned.
MLP_SPECS = {
    "data-parallel": [("data", None)],
    "megatron": [("data", None), ("model", None), ("model",), (None, "model"), None, None, None,
                 ("model", None)],
}


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "f16"])
@pytest.mark.parametrize("layout", sorted(MLP_SPECS))
def test_sharded_mlp_loss_and_fp32_master_weight_grads(layout, dtype):
    r = check_mixed(autocast_or_written_out(mlp_loss, dtype), mlp_inputs(), MLP_SPECS[layout],
                    mesh_of((4, 2)), grad=list(range(8)), dtype=dtype)
    assert r.dev_out[0].dtype == torch.float32 and r.dev_out[1].dtype == dtype
    assert len(r.dev_grads) == 8 and all(g.dtype == torch.float32 for g in r.dev_grads)
    if layout == "megatron":
        # The row-parallel partial sum is reduced in the autocast dtype, before layer norm's
        # cast to float32: each device's [ceil(14 / 4), 32] tile, 2 bytes an element.
        reduced = [c["bytes"] for c in r.fwd_stats["collectives"]
                   if c["axes"] == ["model"] and c["kind"] == "all-reduce"]
        assert reduced == [4 * 32 * 2]


def nested(lp, f32, a, b):
    low = torch.mm(lp(a), lp(b))
    with torch.autocast("spmd", enabled=False):
        full = torch.mm(low.float(), b)          # autocast off: float32 as written
    return low, full, torch.mm(lp(full), lp(b))  # on again


def test_nested_autocast_disabled_runs_as_written():
    torch.manual_seed(2)
    r = check_mixed(autocast_or_written_out(nested), [torch.randn(8, 8), torch.randn(8, 8)],
                    [("x", None), None], mesh_of((8,)), grad=True, dtype=BF16)
    assert [o.dtype for o in r.dev_out] == [BF16, torch.float32, BF16]


def test_binary_cross_entropy_is_refused_as_on_cuda():
    p = torch.rand(4, device="spmd")
    with torch.autocast("spmd"):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(p, torch.ones(4, device="spmd"))
        # The fused form is in the fp32 list.
        out = F.binary_cross_entropy_with_logits(p.to(BF16), torch.ones(4, device="spmd"))
    assert out.dtype == torch.float32
    assert_same(out.cpu(), F.binary_cross_entropy_with_logits(p.cpu().to(BF16).float(),
                                                              torch.ones(4)), "bce with logits")


def test_planned_step_prices_matmuls_at_the_bf16_peak():
    # A GPU-like part: the float32 peak is 1/16 of the bf16 one; memory never binds.
    hw = plan.hardware.resolve(dict(peak_flops_bf16=1.6e14, peak_flops_fp32=1e13, hbm_bytes=16 << 30,
                                    hbm_bandwidth=1e30, ring_bandwidth=1e10))

    def planned_matmuls(autocast):
        with plan.Plan(hardware=hw):
            mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
            model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                        torch.nn.Linear(64, 32)).to("spmd")
            xs.mark_sharding(model[0].weight, mesh, ("model", None))
            xs.mark_sharding(model[2].weight, mesh, (None, "model"))
            x = torch.empty(16, 32, device="spmd")
            xs.mark_sharding(x, mesh, ("data", None))
            with torch.autocast("spmd", enabled=autocast):
                loss = model(x).float().pow(2).mean()
            loss.backward()
            xm.mark_step()
            stats = last_step_stats()
            seconds = _C._estimate_last_step(hw)["op_seconds"]
        return [(dtype, flops, s) for (op, flops, _, _, dtype, _, _), s
                in zip(stats["op_costs"], seconds) if op in ("aten::addmm", "aten::mm")]

    mixed, full = planned_matmuls(True), planned_matmuls(False)
    assert len(mixed) == len(full) >= 3  # two forward matmuls, their backward
    assert {d for d, _, _ in mixed} == {"bf16"} and {d for d, _, _ in full} == {"f32"}
    for dtype, flops, seconds in mixed:
        assert seconds == pytest.approx(flops / 1.6e14, rel=1e-9)
    for dtype, flops, seconds in full:
        assert seconds == pytest.approx(flops / 1e13, rel=1e-9)


@pytest.mark.parametrize("defer", [False, True], ids=["reduced", "deferred"])
@pytest.mark.parametrize("cast", ["autocast", "written-out"])
def test_gradient_accumulation_with_fp32_master_weights(cast, defer):
    # fp32 master weights cast to bf16 where they are used: each weight gradient is a bf16
    # partial sum over the batch-sharded data, cast up to float32. Deferred, it stays pending
    # through the (exact) cast and the micro-steps' adds, and the update reduces it once, in
    # float32. Otherwise each micro-step reduces it before the cast, in bf16.
    mesh = mesh_of((8,))
    torch.manual_seed(3)
    cpu = torch.nn.Linear(16, 4)
    initial = copy.deepcopy(cpu)
    model = copy.deepcopy(cpu).to(torch_spmd.device())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(16, 16) for _ in range(3)]

    def loss(m, x):
        if cast == "autocast" and torch_spmd.is_spmd_tensor(x):
            with torch.autocast("spmd"):
                return m(x).pow(2).sum()
        out = F.linear(x.to(BF16), m.weight.to(BF16), m.bias.to(BF16))
        return out.float().pow(2).sum()

    step([])
    micro = []
    with xr.defer_output_reductions(defer):
        for x in batches:
            loss(model, to_device(x, mesh, ("x", None))).backward()
            micro.append(step([p.grad for p in model.parameters()]))
    opt.step()
    update = step(list(model.parameters()))
    # Bias [4] and weight [4, 16] gradients.
    if defer:
        assert all(s["collectives"] == [] for s in micro), [collectives(s) for s in micro]
        assert all(sorted(c["bytes"] for c in s["pending_reductions"]) == [4 * 4, 4 * 16 * 4]
                   for s in micro)
        assert sorted((c["kind"], c["bytes"]) for c in update["collectives"]) == \
            [("all-reduce", 4 * 4), ("all-reduce", 4 * 16 * 4)]
    else:
        assert all(sorted((c["kind"], c["bytes"]) for c in s["collectives"]) ==
                   [("all-reduce", 4 * 2), ("all-reduce", 4 * 16 * 2)] for s in micro)
        assert all(s["pending_reductions"] == [] for s in micro)
        assert update["collectives"] == []

    cpu_opt = torch.optim.SGD(cpu.parameters(), lr=0.1)
    for x in batches:
        loss(cpu, x).backward()
    cpu_opt.step()
    for (name, p), q in zip(model.named_parameters(), cpu.parameters()):
        assert p.grad.dtype == torch.float32
        # CPU rounds each micro-step's whole-batch product to bf16 once. Reduced in the step,
        # the device computes the same product (one contraction over all devices' rows, then the
        # all-reduce): the same values. Deferred, it rounds each device's partial product and
        # adds those in float32: within bf16's precision of CPU, and equal to that sum written out.
        tol = 4 * torch.finfo(BF16).eps * q.grad.abs().max().item() if defer else 1e-6
        assert_same(p.grad.cpu(), q.grad, f"grad {name}", rtol=0, atol=tol)
        assert_same(p.detach().cpu(), q.detach(), f"param {name}", rtol=0, atol=0.1 * tol)
        if defer:
            expect = sum(_per_device_bf16_grads(initial, x)[name] for x in batches)
            assert_same(p.grad.cpu(), expect, f"grad {name} (per-device reference)", rtol=1e-5,
                        atol=1e-5)


def test_deferred_sum_that_an_fp32_op_reads_is_reduced_in_bf16():
    # Deferring lets a sum pass an upcast only on its way to an output. A row-parallel product
    # that layer norm reads (autocast casts it to float32 first) is reduced in this step anyway,
    # so it is reduced before the cast: in bf16, half the bytes.
    mesh = mesh_of((4, 2))
    torch.manual_seed(4)
    x, w = torch.randn(8, 16), torch.randn(16, 32)
    xd, wd = to_device(x, mesh, ("data", "model")), to_device(w, mesh, ("model", None))
    step([])
    with xr.defer_output_reductions():
        with torch.autocast("spmd"):
            out = F.layer_norm(xd @ wd, (32,))
        stats = step([out])
    # Each device's [8 / 4, 32] bf16 partial product.
    assert [(c["kind"], c["axes"], c["bytes"]) for c in stats["collectives"]] == \
        [("all-reduce", ["model"], 2 * 32 * 2)]
    assert stats["pending_reductions"] == []
    expect = F.layer_norm((x.to(BF16) @ w.to(BF16)).float(), (32,))
    assert_same(out.cpu(), expect, "layer_norm(x @ w)", rtol=0, atol=4 * torch.finfo(BF16).eps)


def _per_device_bf16_grads(cpu_model, x, devices=8):
    """The float32 sum over ``devices`` row blocks of ``x`` of each block's bf16 gradient."""
    total = {}
    for block in x.chunk(devices):
        m = copy.deepcopy(cpu_model)
        m.zero_grad(set_to_none=True)
        F.linear(block.to(BF16), m.weight.to(BF16), m.bias.to(BF16)).float().pow(2).sum().backward()
        for name, p in m.named_parameters():
            total[name] = total.get(name, 0) + p.grad
    return total
