"""FP8 on the spmd device: float8 tensors and casts, and ``torch._scaled_mm`` (the matmul of
Float8 training, torchao's Float8Linear) sharded over each of its dims, with tensorwise and
rowwise scales, equal to CPU with the shard padding poisoned (NaN, which FP8 E4M3 holds)."""
import pytest
import torch

from spmd_diff import check, constrain, ensure_devices, mesh_of, no_collectives, only
from torch_spmd.debug import metrics
from torch_spmd.experimental.float8 import convert_to_float8_training, float8_matmul

F8 = torch.float8_e4m3fn


def _cpu_scaled_mm():
    """Whether this torch's CPU build runs torch._scaled_mm (the reference the tests compare
    against, and the kernel the emulated devices run)."""
    try:
        one = torch.tensor(1.0)
        torch._scaled_mm(torch.zeros(16, 16, dtype=F8), torch.zeros(16, 16, dtype=F8).t(), one,
                         one, out_dtype=torch.float32)
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def _cpu_float8_kernels():
    """Whether this torch's CPU build has the FP8 kernels the devices run for casts and moves
    (the cast, cat, fill; the runtime masks padding through a byte view)."""
    try:
        a = torch.ones(2, 3).to(F8)
        torch.cat([a, a]).clone().fill_(float("nan")).view(torch.uint8).to(torch.float32)
        return True
    except (RuntimeError, NotImplementedError):
        return False


needs_float8_kernels = pytest.mark.skipif(
    not _cpu_float8_kernels(), reason=f"torch {torch.__version__} lacks CPU FP8 kernels")
needs_scaled_mm = pytest.mark.skipif(
    not _cpu_scaled_mm(), reason=f"torch {torch.__version__} has no CPU torch._scaled_mm")


@pytest.fixture(scope="module", autouse=True)
def devices():
    ensure_devices()
    yield


def T(*shape, seed=0):
    g = torch.Generator().manual_seed(seed + 11 * sum(shape))
    return torch.randn(*shape, generator=g)


def scaled_mm(a, b, sa, sb, out_dtype=torch.float32, bias=None):
    return torch._scaled_mm(a.to(F8), b.to(F8), sa, sb, bias=bias, out_dtype=out_dtype)


def check_recorded(*args, **kwargs):
    """``check``, and the matmul was partitioned on the devices (not run on the host)."""
    before = metrics.counter_value("aten::_scaled_mm") or 0
    r = check(*args, **kwargs)
    assert (metrics.counter_value("aten::_scaled_mm") or 0) == before, "_scaled_mm ran eagerly"
    assert r.fwd_stats["flops_per_device"] > 0
    return r


@needs_float8_kernels
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_float8_tensors_cast_and_gather_as_one_byte_values(dtype):
    # A cast to FP8 runs on the shards; gathering the FP8 tensor moves one byte per element.
    mesh = mesh_of((8,))
    r = check(lambda x: constrain(x.to(dtype), (None, None)).to(torch.float32), [T(10, 6)],
              [("x", None)], mesh, fwd=only("all-gather"))
    gathers = [c for c in r.fwd_stats["collectives"] if c["kind"] == "all-gather"]
    assert gathers and all(c["bytes"] * 8 == 16 * 6 for c in gathers)  # 2 padded rows of 6 bytes


def reduces(cs):
    """The partial sums of a sharded contraction reduced: one or more reductions, nothing else."""
    return bool(cs) and only("all-reduce", "reduce-scatter")(cs)


# (a's spec, b's spec, the forward's collectives): rows, columns, the contraction (partial
# sums: one reduction), two axes at once, uneven dims.
CASES = [
    ((8,), ("x", None), (None, None), no_collectives),
    ((8,), (None, None), (None, "x"), no_collectives),
    ((8,), (None, "x"), ("x", None), reduces),
    ((4, 2), ("data", "model"), ("model", None), reduces),
    ((4, 2), ("data", None), (None, "model"), no_collectives),
]


@needs_scaled_mm
@pytest.mark.parametrize("mesh_shape,spec_a,spec_b,fwd", CASES)
@pytest.mark.parametrize("shape", [(16, 32, 8), (10, 12, 6)], ids=["even", "uneven"])
def test_scaled_mm_tensorwise(mesh_shape, spec_a, spec_b, fwd, shape):
    m, k, n = shape
    mesh = mesh_of(mesh_shape)
    check_recorded(scaled_mm, [T(m, k), T(k, n, seed=1), torch.tensor(0.5), torch.tensor(2.0)],
          [spec_a, spec_b, None, None], mesh, fwd=fwd if shape[1] % 8 == 0 else None)


@needs_scaled_mm
@pytest.mark.parametrize("mesh_shape,spec_a,spec_b,fwd", CASES)
def test_scaled_mm_rowwise_scales_follow_their_rows_and_columns(mesh_shape, spec_a, spec_b, fwd):
    # Float8Linear's rowwise scaling: a scale per row of a ([m, 1]) and per column of b ([1, n]).
    mesh = mesh_of(mesh_shape)
    sa = T(16, 1, seed=2).abs() + 0.5
    sb = T(1, 8, seed=3).abs() + 0.5
    check_recorded(scaled_mm, [T(16, 32), T(32, 8, seed=1), sa, sb],
          [spec_a, spec_b, (spec_a[0], None), (None, spec_b[1])], mesh, fwd=fwd)


@needs_scaled_mm
def test_scaled_mm_with_a_bias_gathers_a_sharded_contraction():
    # A bias is added once: the contraction is not left as partial sums, it is gathered.
    mesh = mesh_of((8,))
    bias = T(8, seed=4).to(torch.bfloat16)
    r = check_recorded(lambda a, b, sa, sb, c: scaled_mm(a, b, sa, sb, torch.bfloat16, c),
              [T(16, 32), T(32, 8, seed=1), torch.tensor(0.5), torch.tensor(2.0), bias],
              [(None, "x"), ("x", None), None, None, None], mesh, fwd=only("all-gather"))
    assert r.fwd_stats["collectives"]  # (k gathered, not reduced)


@needs_scaled_mm
@pytest.mark.parametrize("mesh_shape,spec_x,spec_w", [
    ((8,), ("x", None), (None, None)),             # data parallel
    ((8,), ("x", None), ("x", None)),              # FSDP: the weight's rows sharded too
    ((4, 2), ("data", None), ("model", None)),     # 2-D: column-parallel weight
    ((4, 2), ("data", "model"), (None, "model")),  # row-parallel: a sharded contraction
])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_float8_linear_trains_sharded_equal_to_cpu(mesh_shape, spec_x, spec_w, recipe):
    # Forward and backward of a Float8 linear as torchao computes one (torch_spmd.experimental.
    # float8): tensorwise, amax scales (E4M3 forward, E5M2 gradient), every scale an amax over
    # the sharded tensor (a reduction across devices); rowwise, a scale per row along each
    # matmul's contraction (reduced across devices where that dim is sharded, tiled with its
    # rows where it is not). The FP8 matmuls sharded as their operands are.
    mesh = mesh_of(mesh_shape)
    before = metrics.counter_value("aten::_scaled_mm") or 0
    check(lambda x, w: float8_matmul(x, w, recipe=recipe), [T(16, 32), T(8, 32, seed=1)],
          [spec_x, spec_w], mesh, grad=True)
    assert (metrics.counter_value("aten::_scaled_mm") or 0) == before, "_scaled_mm ran eagerly"


def test_unknown_float8_recipe_names_the_value():
    with pytest.raises(ValueError, match="'tensorwise', 'rowwise', got 'blockwise'"):
        convert_to_float8_training(torch.nn.Linear(4, 4), recipe="blockwise")


@needs_scaled_mm
def test_fsdp_gathers_a_float8_linears_weight_in_fp8():
    # torchao's enable_fsdp_float8_all_gather: under FSDP the weight's FP8 cast runs on its
    # shards (its scale an all-reduce of each shard's amax), so the all-gathers that the
    # forward's and the input gradient's matmuls need move one byte per element, half of the
    # bf16 weight's (the bf16 linear beside it gathers two).
    import numpy as np
    import torch.nn.functional as F
    import torch_spmd
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    mesh = xs.Mesh(np.arange(8), (8,), ("fsdp",))
    gathered = {}
    for name, fn in (("float8", float8_matmul), ("bf16", F.linear)):
        x = T(256, 64).bfloat16().to("spmd").requires_grad_()
        w = T(32, 64, seed=1).bfloat16().to("spmd").requires_grad_()
        xs.mark_sharding(x, mesh, ("fsdp", None))
        xs.mark_sharding(w, mesh, ("fsdp", None))
        y = fn(x, w)
        grads = torch.autograd.grad(y, (x, w), torch.ones_like(y))
        xm.mark_step()
        del grads
        gathered[name] = [c["bytes"] for c in torch_spmd.debug.last_step_stats()["collectives"]
                          if c["kind"] == "all-gather"]
    shard = 32 * 64 // 8  # elements of each device's rows of the weight
    assert gathered["float8"] == [shard] * 2, gathered  # E4M3 forward, E5M2 for grad_x
    assert gathered["bf16"] == [2 * shard] * 2, gathered


@needs_scaled_mm
@pytest.mark.parametrize("fp8_peak,expected_peak", [(6.4e14, 6.4e14), (0.0, 1.6e14)],
                         ids=["fp8-units", "no-fp8-units"])
def test_planned_fp8_matmul_runs_at_the_fp8_peak(fp8_peak, expected_peak):
    # A _scaled_mm computes at its operands' FP8 rate into a float32 result; a chip without FP8
    # units (peak_flops_fp8 0: A100, the TPUs) runs it at the bf16 rate.
    import numpy as np
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    import torch_spmd.plan as plan
    from torch_spmd import _C
    from torch_spmd.debug import last_step_stats
    hw = plan.hardware.resolve(dict(peak_flops_bf16=1.6e14, peak_flops_fp32=1e13,
                                    peak_flops_fp8=fp8_peak, hbm_bytes=16 << 30,
                                    hbm_bandwidth=1e30, ring_bandwidth=1e10))
    with plan.Plan(hardware=hw):
        mesh = xs.Mesh(np.arange(8), (8,), ("x",))
        a = torch.empty(64, 128, device="spmd")
        b = torch.empty(128, 32, device="spmd")
        xs.mark_sharding(a, mesh, ("x", None))
        out = scaled_mm(a, b, torch.tensor(1.0).to("spmd"), torch.tensor(1.0).to("spmd"))
        xm.mark_step()
        stats = last_step_stats()
        seconds = _C._estimate_last_step(hw)["op_seconds"]
    mms = [(dtype, flops, s) for (op, flops, _, _, dtype, _, _), s
           in zip(stats["op_costs"], seconds) if op == "aten::_scaled_mm"]
    assert out.dtype == torch.float32 and len(mms) == 1
    dtype, flops, s = mms[0]
    assert dtype == "f8e4m3fn" and flops == 2 * 8 * 128 * 32  # each device's 8 rows
    assert s == pytest.approx(flops / expected_peak, rel=1e-9)


@needs_scaled_mm
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_converted_model_trains_sharded_equal_to_cpu(recipe):
    # convert_to_float8_training swaps the Linear layers (torchao's entry point); an MLP under
    # 2-D sharding (column- then row-parallel weights) trains one step equal to CPU.
    import copy
    import torch_spmd.core.xla_model as xm
    import torch_spmd.distributed.spmd as xs
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    dev = convert_to_float8_training(copy.deepcopy(cpu), recipe=recipe).to("spmd")
    convert_to_float8_training(cpu, recipe=recipe)
    assert all(type(m).__name__ == "Float8Linear" and m.recipe == recipe for m in (dev[0], dev[2]))
    mesh = mesh_of((4, 2))
    xs.mark_sharding(dev[0].weight, mesh, ("model", None))
    xs.mark_sharding(dev[2].weight, mesh, (None, "model"))
    x = T(8, 32, seed=5)
    xd = x.to("spmd")
    xs.mark_sharding(xd, mesh, ("data", None))
    for model, inp in ((cpu, x), (dev, xd)):
        model(inp).pow(2).mean().backward()
    xm.mark_step()
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=2e-5, atol=2e-5, msg=name)
