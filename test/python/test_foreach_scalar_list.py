"""List ops taking a Scalar[] (`_foreach_div_(tensors, [s0, s1, ...])`: what torch's foreach
Adam runs for its per-parameter step sizes) are recorded as one node whose scalars are run-time
values (csrc/aten/recorder.cc, kScalarList): new values every step do not recompile, and the
element kinds (int, float, bool) keep eager's type promotion. Every result is compared with
CPU eager, on sharded tensors with uneven tiles."""
import pytest
import torch

import torch_spmd
import torch_spmd.debug as dbg
from torch_spmd.debug import metrics
from spmd_diff import ensure_devices, mesh_of, to_device

SPECS = [("data", "model"), (None, "data"), ("model", None)]


def _lists(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shapes = [(5, 3), (7, 2), (3, 9)]
    if dtype.is_floating_point:
        return [torch.randn(s, generator=g, dtype=dtype) for s in shapes]
    return [torch.randint(-9, 9, s, generator=g, dtype=dtype) for s in shapes]


def _on_device(ts):
    mesh = mesh_of((4, 2))
    return [to_device(t, mesh, spec) for t, spec in zip(ts, SPECS)]


@pytest.mark.parametrize("case", ["div_", "add", "mul_", "addcdiv_", "addcmul", "sub"])
def test_float_lists_match_eager(case):
    ensure_devices()
    a, b, c = _lists(), _lists(), [t.abs() + 0.5 for t in _lists()]
    scalars = [0.5, -1.25, 3.0]
    ops = {
        "div_": lambda x, y, z: torch._foreach_div_(x, scalars) or x,
        "add": lambda x, y, z: torch._foreach_add(x, scalars),
        "mul_": lambda x, y, z: torch._foreach_mul_(x, scalars) or x,
        "addcdiv_": lambda x, y, z: torch._foreach_addcdiv_(x, y, z, scalars) or x,
        "addcmul": lambda x, y, z: torch._foreach_addcmul(x, y, z, scalars),
        "sub": lambda x, y, z: torch._foreach_sub(x, scalars),
    }
    want = ops[case]([t.clone() for t in a], b, c)
    dev = [_on_device(ts) for ts in (a, b, c)]
    text = dbg.graph_text(ops[case](*dev))
    assert "ScalarList" in text, text  # one list node, not a per-tensor loop
    got = ops[case](*[_on_device(ts) for ts in (a, b, c)])
    torch_spmd.sync()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)


@pytest.mark.parametrize("scalars", [[2, -3, 4], [2, 1.5, True], [True, False, True]])
def test_element_kinds_keep_type_promotion(scalars):
    ensure_devices()
    ints = _lists(torch.int64)
    want = torch._foreach_add(ints, scalars)
    got = torch._foreach_add(_on_device(ints), scalars)
    torch_spmd.sync()
    for g, w in zip(got, want):
        assert g.dtype == w.dtype, (scalars, g.dtype, w.dtype)
        assert torch.equal(g.cpu(), w)


def test_new_values_every_step_do_not_recompile():
    ensure_devices()
    xs = _on_device(_lists())
    ref = [t.clone() for t in _lists()]
    compiles = []
    for k in range(5):
        scalars = [1.0 + 0.1 * k, 0.5 / (k + 1), -2.0 + k]
        torch._foreach_mul_(xs, scalars)
        torch._foreach_mul_(ref, scalars)
        torch_spmd.sync()
        compiles.append(metrics.counter_value("UncachedCompile") or 0)
        for g, w in zip(xs, ref):
            torch.testing.assert_close(g.cpu(), w, rtol=0, atol=0)
    assert compiles[-1] == compiles[1], compiles  # steps after the first reuse its program


def test_foreach_adam_records_one_node_per_list_op():
    ensure_devices()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).double()
    ref = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).double()
    ref.load_state_dict(model.state_dict())
    dev_model = model.to(torch_spmd.device())
    opt = torch.optim.Adam(dev_model.parameters(), lr=0.01, foreach=True)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, foreach=True)
    x = torch.randn(16, 6, dtype=torch.float64)
    for k in range(4):
        for m, o, inp in ((dev_model, opt, x.to(torch_spmd.device())), (ref, ref_opt, x)):
            o.zero_grad()
            m(inp).pow(2).mean().backward()
            o.step()
        if k == 2:
            text = dbg.graph_text(list(dev_model.parameters()))
            assert text.count("aten::_foreach_addcdiv.ScalarList") == 1, text
            assert "aten::addcdiv" not in text.replace("_foreach_addcdiv", ""), text
        torch_spmd.sync()
    for a, b in zip(dev_model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.cpu(), b.detach(), rtol=1e-9, atol=1e-9)


def test_integer_beyond_double_precision_stays_exact():
    # 2**60 + 1 has no exact double: the op is not recorded with it but runs on the host
    # (an eager fallback), with the exact value.
    ensure_devices()
    ints = _lists(torch.int64)
    scalars = [2 ** 60 + 1, 3, -(2 ** 60) - 1]
    want = torch._foreach_add(ints, scalars)
    before = metrics.counter_value("EagerFallback") or 0
    got = torch._foreach_add(_on_device(ints), scalars)
    torch_spmd.sync()
    assert (metrics.counter_value("EagerFallback") or 0) > before
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w)
