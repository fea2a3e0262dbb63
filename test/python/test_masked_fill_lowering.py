"""masked_fill(self, mask, value) lowered to where(mask, value, self) (rules/pointwise.cc).

The rewrite is taken only where the two agree bit for bit: a floating self, a bool mask and a
constant value that masked_fill's overflow check accepts (the non-finite ones, and 0 and 1,
which the recorder keeps as constants). Every case compares with CPU eager, sharded on the
masked dims with uneven tiles (the padding is poisoned) and differentiated; the cases outside
the rewrite check that it is not taken and that their results and errors still match eager.
"""
import pytest
import torch

import torch_spmd.debug as dbg
from spmd_diff import check, mesh_of, only, step, to_device

MESH = (4, 2)


@pytest.mark.parametrize("value", [float("-inf"), float("inf"), float("nan"), 0.0, 1.0, 3])
@pytest.mark.parametrize("spec", [(None, "data", "model"), ("data", None, "model"),
                                  ("model", "data", None)])
def test_matches_eager_sharded_with_gradient(value, spec):
    x = torch.randn(6, 5, 7, dtype=torch.float64)
    m = torch.rand(5, 7) > 0.6  # broadcast over dim 0, sharded like x's last two dims
    m[:, 0] = False  # no row fully masked: softmax stays finite for -inf
    check(lambda a, b: a.masked_fill(b, value).softmax(-1), [x.requires_grad_(), m],
          [spec, spec[1:]], mesh_of(MESH), grad=True)


def _program(fn, x, m, spec):
    mesh = mesh_of(MESH)
    out = fn(to_device(x, mesh, spec), to_device(m, mesh, spec[-2:]))
    return dbg.partitioned_program([out]), out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lowered_to_where_for_floating_constants(dtype):
    x, m = torch.randn(8, 6, dtype=dtype), torch.rand(8, 6) > 0.5
    text, out = _program(lambda a, b: a.masked_fill(b, float("-inf")), x, m, ("data", "model"))
    assert "aten::where" in text and "aten::masked_fill" not in text, text
    step([out])
    assert torch.equal(out.cpu(), x.masked_fill(m, float("-inf")))


@pytest.mark.parametrize("case", ["integer_self", "run_time_value", "tensor_value"])
def test_not_lowered_outside_exact_cases(case):
    if case == "integer_self":  # where would promote a float value; masked_fill casts it
        x, m, fn = torch.arange(48).view(8, 6), torch.rand(8, 6) > 0.5, lambda a, b: a.masked_fill(b, 2.7)
    elif case == "run_time_value":  # a dynamic scalar: masked_fill checks it when it runs
        x, m, fn = torch.randn(8, 6), torch.rand(8, 6) > 0.5, lambda a, b: a.masked_fill(b, -2.5)
    else:
        x, m = torch.randn(8, 6), torch.rand(8, 6) > 0.5
        fn = lambda a, b: a.masked_fill(b, torch.tensor(-2.5, device=a.device))  # noqa: E731
    text, out = _program(fn, x, m, ("data", None))
    assert "aten::masked_fill" in text and "aten::where" not in text, text
    step([out])
    assert torch.equal(out.cpu(), fn(x, m))


def test_overflowing_constant_still_raises_as_eager():
    x, m = torch.randn(8, 6, dtype=torch.float16), torch.rand(8, 6) > 0.5
    with pytest.raises(RuntimeError, match="overflow"):
        x.masked_fill(m, 100000)  # an int: a constant, too large for half
    mesh = mesh_of(MESH)
    xd, md = to_device(x, mesh, ("data", None)), to_device(m, mesh, ("data", None))
    out = xd.masked_fill(md, 100000)
    assert "aten::where" not in dbg.partitioned_program([out])
    with pytest.raises(RuntimeError, match="overflow"):
        step([out])
    # The failed step leaves the inputs intact.
    assert torch.equal(xd.cpu(), x)


def test_attention_mask_collectives_unchanged():
    # The rewrite is local: sharding the batch of a masked attention score moves nothing.
    s = torch.randn(8, 4, 16, 16)
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1)
    check(lambda a, c: a.masked_fill(c, float("-inf")).softmax(-1), [s.requires_grad_(), causal],
          [("data", None, None, None), None], mesh_of(MESH), grad=True,
          fwd=only(), bwd=only())
